"""What a new user met on a third walk (issue 39), on real sshd nodes on loopback: a `.py`
script missing on the nodes, a quoted command through `cluster exec`, and `cluster check`'s
report of a failing node."""
import os
import socket
import subprocess
import sys
from pathlib import Path

FLUIDCTL = [sys.executable, "-m", "fluidctl"]
ENV = {"PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin", "NO_COLOR": "1",
       "COLUMNS": "300", "HOME": str(Path.home())}


def fluidctl(*args, cwd=None, timeout=120):
    env = {**ENV, "FLUIDCTL_STATE_DIR": os.environ["FLUIDCTL_STATE_DIR"]}   # the run's, set
    return subprocess.run([*FLUIDCTL, *map(str, args)], capture_output=True, text=True,
                          timeout=timeout, env=env, cwd=cwd)


def test_a_py_script_missing_on_the_nodes_is_one_line_before_start(sshd_nodes, tmp_path):
    """`train.py` (no '/') that the nodes do not have under --remote-dir: the documented line,
    not "exit code 2 (no traceback)" from every rank."""
    (tmp_path / "train.py").write_text("print('trained')\n")
    empty = tmp_path / "empty"
    empty.mkdir()
    r = fluidctl("train", "--hostfile", sshd_nodes.hostfile("hosts.walk", slots=1),
                 "--ssh-config", sshd_nodes.config, "--remote-dir", empty,
                 "--log-dir", tmp_path / "logs", "train.py", cwd=tmp_path)
    assert r.returncode != 0
    assert "no traceback" not in r.stderr and "Traceback" not in r.stderr, r.stderr
    assert any(f"SCRIPT train.py does not exist on {host} (in {empty})" in r.stderr
               for host in ("node1", "node2")), r.stderr


def test_exec_keeps_each_argument_whole_on_the_node(sshd_nodes):
    """docs/multi-node.md's `cluster exec -- python -c "import sys; ..."`: each word after `--`
    reaches the node as one argument, as it was typed."""
    r = fluidctl("cluster", "exec", "--hosts", "node1,node2", "--ssh-config", sshd_nodes.config,
                 "--", "python3", "-c", "import sys; print('it is', len(sys.argv), 'words')",
                 "a b", "$HOME")
    assert r.returncode == 0, r.stderr
    assert sorted(r.stdout.splitlines()) == ["[node1] it is 3 words", "[node2] it is 3 words"]


def test_check_names_a_failing_nodes_reason_once(sshd_nodes, tmp_path):
    """Once in the table (stdout) and once in the error line (stderr), not again in the
    progress lines."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.4", 0))
        port = sock.getsockname()[1]
    hosts = tmp_path / "hosts"
    hosts.write_text(f"node1 slots=1\n127.0.0.4:{port} slots=1\n")
    r = fluidctl("cluster", "check", "--hostfile", hosts, "--ssh-config", sshd_nodes.config,
                 "--timeout", "60")        # node1 must pass on a crowded machine too
    assert r.returncode == 1
    assert r.stdout.count("connection refused") == 1, r.stdout
    assert r.stderr.count("connection refused") == 1, r.stderr
    assert r.stderr.strip().splitlines()[-1].startswith(
        f"error: node 127.0.0.4 failed the check: connection refused at 127.0.0.4:{port}")
