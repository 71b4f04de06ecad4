"""``--backend fabric``: the ssh backend's agents, each node reached through Fabric's
Connection."""
from __future__ import annotations

from fluidctl.backends.ssh.launcher import SSHLauncher


class FabricLauncher(SSHLauncher):
    """``--backend fabric``: the same agents, each node reached through Fabric's Connection."""
    name = "fabric"
