"""Issue 27.12: what cluster sync sends, over the OpenSSH push and the SFTP fallback alike:
nothing outside the workspace, symlinks as symlinks, special files and vanished files named in
a warning while the rest is sent. Real sshd nodes on loopback (tests/sshd.py)."""
import os
import subprocess
import sys
from pathlib import Path

import pytest

from fluidctl.remote import push, sshargv
from fluidctl.remote.sftp import DEFAULT_EXCLUDES, walk

SECRET = "TOP SECRET: outside the workspace"


@pytest.fixture
def workspace(tmp_path):
    (tmp_path / "secret.txt").write_text(SECRET)
    src = tmp_path / "src"
    (src / "pkg").mkdir(parents=True)
    (src / "train.py").write_text("print('hi')\n")
    (src / "pkg" / "lib.py").write_text("X = 1\n")
    os.symlink(tmp_path / "secret.txt", src / "leak.txt")          # absolute, outside
    os.symlink("../secret.txt", src / "leak2.txt")                  # relative, outside
    os.symlink("pkg", src / "lib-link")                             # a directory, inside
    os.symlink("train.py", src / "train-link.py")                   # a file, inside
    os.symlink("missing", src / "dangling")                         # dangling, inside
    os.mkfifo(src / "pipe")
    return src


def sync(sshd_nodes, tmp_path, src, transport):
    path = "/usr/bin:/bin" if transport == "push" else str(tmp_path / "no-ssh-here")
    env = {"PATH": path, "NO_COLOR": "1", "HOME": str(Path.home()), "FLUIDCTL_STATE_DIR": os.environ["FLUIDCTL_STATE_DIR"]}
    argv = [sys.executable, "-m", "fluidctl", "cluster", "sync",
            "--hostfile", str(sshd_nodes.hostfile(f"hosts-{transport}.txt")),
            "--ssh-config", str(sshd_nodes.config),
            "--remote-dir", str(tmp_path / "remote" / transport / "{host}"), str(src)]
    return subprocess.run(argv, capture_output=True, text=True, timeout=120, env=env)


@pytest.mark.parametrize("transport", ["push", "sftp"])
def test_27_12_links_stay_links_and_nothing_outside_the_workspace_is_sent(
        sshd_nodes, tmp_path, workspace, transport):
    r = sync(sshd_nodes, tmp_path, workspace, transport)
    assert r.returncode == 0, r.stderr
    for name in ("leak.txt", "leak2.txt"):
        assert f"warning: skipped symlink {name} -> " in r.stderr, r.stderr
    assert "warning: skipped pipe: a FIFO" in r.stderr, r.stderr
    for node in ("node1", "node2"):
        there = tmp_path / "remote" / transport / node
        assert not os.path.lexists(there / "leak.txt") and not os.path.lexists(there / "leak2.txt")
        for path in there.rglob("*"):
            if path.is_file() and not path.is_symlink():
                assert SECRET not in path.read_text(errors="replace"), path
        assert os.readlink(there / "lib-link") == "pkg"
        assert os.readlink(there / "train-link.py") == "train.py"
        assert os.readlink(there / "dangling") == "missing"
        assert (there / "lib-link" / "lib.py").read_text() == "X = 1\n"
        assert not os.path.lexists(there / "pipe")
        assert not [p for p in there.rglob("*") if ".fluidctl-" in p.name]
    again = sync(sshd_nodes, tmp_path, workspace, transport)           # links are up to date
    assert again.returncode == 0, again.stderr
    rows = [[c.strip() for c in line.split("|")] for line in again.stdout.splitlines()
            if line.startswith("node")]
    assert [row[2] for row in rows] == ["0", "0"], again.stdout


def test_27_12_a_file_deleted_during_the_push_is_a_warning_and_the_rest_is_sent(
        sshd_nodes, tmp_path, workspace):
    files = push.scan(walk(workspace, DEFAULT_EXCLUDES))
    (workspace / "pkg" / "lib.py").unlink()                 # after listing, before sending
    remote = tmp_path / "remote-vanish"
    result = push.push(sshargv.ssh_command("node1", ssh_config=str(sshd_nodes.config)), files,
                       str(remote))
    assert result.vanished == ["pkg/lib.py"]
    assert (remote / "train.py").read_text() == "print('hi')\n"
    assert os.readlink(remote / "lib-link") == "pkg"
    assert not os.path.lexists(remote / "pkg" / "lib.py")


def test_27_12_a_file_deleted_during_the_sftp_sync_is_a_warning_and_the_rest_is_sent(
        sshd_nodes, tmp_path, workspace):
    from fluidctl.planning.hosts import load_hosts
    from fluidctl.remote import ssh
    from fluidctl.remote.sftp import plan_sync, send_files
    from fluidctl.remote.sshconfig import resolve_hosts
    resolved, targets = resolve_hosts(load_hosts(None, "node1"), str(sshd_nodes.config), False)
    connected = ssh.connect_all(resolved, targets, timeout=10)
    try:
        node = connected.nodes["node1"]
        remote = str(tmp_path / "remote-sftp-vanish")
        plan = plan_sync(node, workspace, remote, DEFAULT_EXCLUDES)
        (workspace / "pkg" / "lib.py").unlink()
        send_files(node, plan)
    finally:
        connected.close()
    assert plan.vanished == [str(workspace / "pkg" / "lib.py")]
    assert Path(remote, "train.py").read_text() == "print('hi')\n"
    assert os.readlink(Path(remote, "lib-link")) == "pkg"
