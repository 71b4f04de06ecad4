"""Generic fixtures shared by the test files: real sshd nodes on loopback."""
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from sshd import SSHNodes  # noqa: E402


@pytest.fixture(scope="session")
def sshd_nodes(tmp_path_factory):
    """Two real OpenSSH servers: ``node1`` on 127.0.0.2 and ``node2`` on 127.0.0.3 (root login
    with a generated key; ssh config, known_hosts and key under ``sshd_nodes.workdir``)."""
    why_not = SSHNodes.available()
    if why_not:
        pytest.skip(why_not)
    nodes = SSHNodes.start(tmp_path_factory.mktemp("sshd"))
    try:
        yield nodes
    finally:
        nodes.stop()
