"""cluster sync's push with a local command in place of ssh: a node without python3 falls back to
SFTP, and the receiver runs under the system python3, not a shim first on PATH."""
import os

import pytest

from fluidctl.remote import push
from pushutil import files_of, make_workspace


@pytest.fixture
def workspace(tmp_path):
    return make_workspace(tmp_path)


def test_no_python3_on_the_node_means_fall_back(workspace, tmp_path):
    """A node whose shell cannot find python3 exits 127: the caller falls back to SFTP."""
    fake_ssh = ["sh", "-c", "echo 'sh: 1: python3: not found' >&2; exit 127", "fake-node"]
    with pytest.raises(push.PushUnavailable, match="no python3 on the node"):
        push.push(fake_ssh, files_of(workspace), str(tmp_path / "never"))
    assert not (tmp_path / "never").exists()


@pytest.mark.skipif(not os.access("/usr/bin/python3", os.X_OK), reason="no /usr/bin/python3")
def test_the_receiver_runs_under_the_system_python3_not_a_shim_on_path(workspace, tmp_path):
    """A version manager's python3 first on PATH (slow to start) is passed over for
    /usr/bin/python3; the node's login shell is played here by sh, as sshd would run it."""
    shims = tmp_path / "shims"
    shims.mkdir()
    (shims / "python3").write_text(f"#!/bin/sh\ntouch {tmp_path / 'shim-ran'}\nexit 1\n")
    (shims / "python3").chmod(0o755)
    node = ["env", f"PATH={shims}:/usr/bin:/bin", "sh", "-c"]
    result = push.push(node, files_of(workspace), str(tmp_path / "remote"))
    assert "train.py" in result.sent and not (tmp_path / "shim-ran").exists()
