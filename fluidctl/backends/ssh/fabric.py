"""``--backend fabric``: the ssh backend's agents, each node reached through Fabric's
Connection."""
from __future__ import annotations
from fluidctl.backends.ssh.launcher import SSHLauncher


# the conversation with a node agent (one tagged line each way): fluidctl/agentproto.py, which
# is all of this side the agent imports


class FabricLauncher(SSHLauncher):
    """``--backend fabric``: the same agents, each node reached through Fabric's Connection."""
    name = "fabric"
