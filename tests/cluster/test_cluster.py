"""``fluidctl cluster check | exec | sync`` run as a user would, against two real sshd nodes."""
import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

import psutil
import pytest

from launchutil import default_sigint, read_terminal, silent_node_progress, table_row

FLUIDCTL = [sys.executable, "-m", "fluidctl"]


def fluidctl(*args, timeout=60):
    return subprocess.run([*FLUIDCTL, *map(str, args)], capture_output=True, text=True,
                          timeout=timeout, env={"PATH": "/usr/bin:/bin", "NO_COLOR": "1",
                                                "HOME": str(Path.home()), "FLUIDCTL_STATE_DIR": os.environ["FLUIDCTL_STATE_DIR"]})


@pytest.fixture(scope="module")
def hostfile(sshd_nodes):
    return sshd_nodes.hostfile("hosts.txt", slots=2)


@pytest.fixture(scope="session")
def dry_run_wheelhouse(tmp_path_factory):
    """The --wheelhouse of the setup dry runs below (this checkout's wheel, --no-deps), one
    for every xdist worker (in the run's common temporary directory): the first dry run builds
    it (pip wheel, seconds), the others find it built. wheelhouse.build keys it by the
    checkout's content and renames a finished build into place, so two builds at once are
    safe."""
    base = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        base = base.parent
    return base / "wheelhouse-no-deps"


def closed_port(address):
    with socket.socket() as sock:
        sock.bind((address, 0))
        return sock.getsockname()[1]


def test_check_all_nodes_ok(sshd_nodes, hostfile):
    r = fluidctl("cluster", "check", "--hostfile", hostfile, "--ssh-config", sshd_nodes.config)
    assert r.returncode == 0, r.stderr
    rows = [line for line in r.stdout.splitlines() if "node" in line and "ok" in line]
    assert len(rows) == 2
    assert "127.0.0.2" in rows[0] and "127.0.0.3" in rows[1]
    assert all(sys.version.split()[0] in row and "0.1.0" in row for row in rows)


def test_check_names_each_failing_node_with_its_reason(sshd_nodes, tmp_path):
    port = closed_port("127.0.0.4")
    hosts = tmp_path / "hosts"
    hosts.write_text(f"node1 slots=2\n127.0.0.4:{port} slots=2\n")
    r = fluidctl("cluster", "check", "--hostfile", hosts, "--ssh-config", sshd_nodes.config,
                 "--timeout", "3")
    assert r.returncode == 1
    error = r.stderr.strip().splitlines()[-1]        # after one progress line per step
    assert error.startswith("error: node 127.0.0.4 failed the check: "
                            f"connection refused at 127.0.0.4:{port}")
    assert "node1" not in error and "Traceback" not in r.stderr
    assert "FAIL" in r.stdout
    # a wrong remote interpreter is named too
    r = fluidctl("cluster", "check", "--hosts", "node2", "--ssh-config", sshd_nodes.config,
                 "--python", "/nowhere/python")
    assert r.returncode == 1 and "node node2 failed the check: python /nowhere/python not found" \
        in r.stderr


def test_unknown_host_keys_refused_unless_accepted(sshd_nodes, tmp_path):
    known = tmp_path / "known_hosts"
    cfg = tmp_path / "ssh_config"
    cfg.write_text(sshd_nodes.config.read_text().replace(str(sshd_nodes.known_hosts), str(known)))
    r = fluidctl("cluster", "check", "--hosts", "node1,node2", "--ssh-config", cfg)
    assert r.returncode == 1
    assert "2 of 2 node(s) failed" in r.stderr and "not in known_hosts" in r.stderr
    assert not known.exists()
    r = fluidctl("cluster", "check", "--hosts", "node1,node2", "--ssh-config", cfg,
                 "--accept-new-host-keys")
    assert r.returncode == 0, r.stderr
    assert len(known.read_text().splitlines()) == 2
    r = fluidctl("cluster", "check", "--hosts", "node1,node2", "--ssh-config", cfg)
    assert r.returncode == 0, r.stderr


def test_bad_hostfile_is_a_usage_error(tmp_path):
    hosts = tmp_path / "hosts"
    hosts.write_text("node1 slots=2\nnode2 slots=0\n")
    r = fluidctl("cluster", "check", "--hostfile", hosts)
    assert r.returncode == 2
    assert r.stderr.strip().startswith(f"error: hostfile {hosts} line 2: node2 has slots=0 (")
    r = fluidctl("cluster", "exec", "--", "true")
    assert r.returncode == 2 and "no hosts given" in r.stderr


def test_exec_prefixes_output_and_fails_when_a_node_fails(sshd_nodes, hostfile):
    r = fluidctl("cluster", "exec", "--hostfile", hostfile, "--ssh-config", sshd_nodes.config,
                 "--", "echo from $(echo $SSH_CONNECTION | cut -d' ' -f3); echo warn >&2")
    assert r.returncode == 0, r.stderr
    assert sorted(r.stdout.splitlines()) == ["[node1] from 127.0.0.2", "[node2] from 127.0.0.3"]
    assert sorted(own(r.stderr)) == ["[node1] warn", "[node2] warn"]
    r = fluidctl("cluster", "exec", "--hostfile", hostfile, "--ssh-config", sshd_nodes.config,
                 "--", "case $SSH_CONNECTION in *127.0.0.3*) exit 3;; esac; echo fine")
    assert r.returncode == 1
    assert "[node1] fine" in r.stdout
    assert own(r.stderr) == ["error: node node2 failed: exit code 3"]


def own(stderr):
    """stderr less what the nodes' shells print as they start (root's ~/.bashrc runs, as for
    any ssh command: pyenv's rehash, started on both nodes at once, complains of its lock),
    which fluidctl passes on prefixed like the command's own lines."""
    startup = ("pyenv: ", "rm: cannot remove ")
    return [line for line in stderr.splitlines()
            if not (line.startswith("[node") and line.split("] ", 1)[-1].startswith(startup))]


def test_sync_pushes_only_changed_files(sshd_nodes, hostfile, tmp_path):
    src = tmp_path / "ws"
    (src / "lib").mkdir(parents=True)
    (src / "train.py").write_text("print('hello')\n")
    (src / "lib" / "util.py").write_text("A = 1\n")
    (src / "model.ckpt").write_bytes(b"x" * 1000)
    remote = tmp_path / "remote" / "{host}"
    args = ["cluster", "sync", "--hostfile", hostfile, "--ssh-config", sshd_nodes.config,
            "--remote-dir", remote, "--exclude", "*.ckpt", src]
    r = fluidctl(*args)
    assert r.returncode == 0, r.stderr
    for node in ("node1", "node2"):
        there = tmp_path / "remote" / node
        assert (there / "train.py").read_text() == "print('hello')\n"
        assert (there / "lib" / "util.py").read_text() == "A = 1\n"
        assert not (there / "model.ckpt").exists()
    # columns: host, remote dir, sent files, sent, unchanged
    assert [table_row(r.stdout, n)[2::2] for n in ("node1", "node2")] == [["2", "0"]] * 2
    r = fluidctl(*args)
    assert r.returncode == 0, r.stderr
    assert [table_row(r.stdout, n)[2::2] for n in ("node1", "node2")] == [["0", "2"]] * 2
    (src / "lib" / "util.py").write_text("A = 2222\n")
    r = fluidctl(*args)
    assert r.returncode == 0, r.stderr
    assert [table_row(r.stdout, n)[2::2] for n in ("node1", "node2")] == [["1", "1"]] * 2
    assert (tmp_path / "remote" / "node2" / "lib" / "util.py").read_text() == "A = 2222\n"


def test_exec_ctrl_c_stops_the_command_on_every_node(sshd_nodes, hostfile):
    # an argv unique to this run, to find its remote processes by: another suite on this
    # machine runs the same test, and its sleepers must not count here
    marker = f"61.{uuid.uuid4().int % 10**12:012d}"
    proc = subprocess.Popen([*FLUIDCTL, "cluster", "exec", "--hostfile", str(hostfile),
                             "--ssh-config", str(sshd_nodes.config), "--",
                             f"echo started; sleep {marker}; echo not-reached"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={"PATH": "/usr/bin:/bin", "HOME": str(Path.home()), "FLUIDCTL_STATE_DIR": os.environ["FLUIDCTL_STATE_DIR"]},
                            preexec_fn=default_sigint)
    started = {proc.stdout.readline().strip(), proc.stdout.readline().strip()}
    assert started == {"[node1] started", "[node2] started"}

    def sleepers():
        found = []
        for p in psutil.process_iter(["cmdline"]):
            if p.info["cmdline"] == ["sleep", marker]:
                found.append(p)
        return found
    deadline = time.monotonic() + 10
    while len(sleepers()) < 2 and time.monotonic() < deadline:
        time.sleep(0.02)
    remote = sleepers()
    assert len(remote) == 2
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 130
    assert "not-reached" not in out
    gone, alive = psutil.wait_procs(remote, timeout=10)
    assert not [p for p in alive if p.status() != psutil.STATUS_ZOMBIE]


def on_terminal(args, columns):
    """Run fluidctl with stdout on a pseudo-terminal ``columns`` wide; (exit code, output)."""
    import os
    import pty
    main, sub = pty.openpty()
    proc = subprocess.Popen([*FLUIDCTL, *map(str, args)], stdout=sub, stderr=subprocess.PIPE,
                            stdin=subprocess.DEVNULL,
                            env={"PATH": "/usr/bin:/bin", "NO_COLOR": "1", "TERM": "xterm",
                                 "COLUMNS": str(columns), "HOME": str(Path.home()), "FLUIDCTL_STATE_DIR": os.environ["FLUIDCTL_STATE_DIR"]})
    os.close(sub)
    seen = read_terminal(main)
    proc.wait(60)
    import re
    out = re.sub(r"\x1b\[[0-9;]*m", "", seen.decode())     # bold, italic
    return proc.returncode, out.replace("\r\n", "\n")


@pytest.fixture(scope="module")
def no_cupy(tmp_path_factory):
    """An interpreter that imports this checkout's fluidctl but has no CuPy: the check's
    CuPy / NCCL cell then carries install advice with brackets in it."""
    import fluidctl
    venv = tmp_path_factory.mktemp("nocupy") / "venv"
    subprocess.run(["/usr/bin/python3", "-m", "venv", "--without-pip", str(venv)], check=True)
    site = next((venv / "lib").glob("python3*/site-packages"))
    (site / "checkout.pth").write_text(str(Path(fluidctl.__file__).parent.parent) + "\n")
    return venv / "bin" / "python"


def test_check_prints_install_advice_whole_and_fits_the_terminal(sshd_nodes, hostfile,
                                                                 no_cupy):
    args = ["cluster", "check", "--hostfile", hostfile, "--ssh-config", sshd_nodes.config,
            "--python", no_cupy]
    r = fluidctl(*args)                       # a pipe: plain columns, no box
    assert r.returncode == 0, r.stderr
    assert "│" not in r.stdout and "┃" not in r.stdout
    assert table_row(r.stdout, "node1")[2] == "ok"
    assert "pip install 'fluidctl[gpu-cuda12]'" in table_row(r.stdout, "node1")[8]
    for columns in (80, 120):                 # a narrow terminal: blocks; a wide one: a table
        code, out = on_terminal(args, columns)
        assert code == 0, out
        assert max(len(line) for line in out.splitlines()) <= columns, out
        assert "pip install 'fluidctl[gpu-cuda12]'" in out.replace("\n", "")
        assert len(out.strip().splitlines()) <= 12, out
        assert ("node1 (127.0.0.2): ok" in out) == (columns < 100), out


def test_check_json(sshd_nodes, hostfile):
    import json
    r = fluidctl("cluster", "check", "--hostfile", hostfile, "--ssh-config", sshd_nodes.config,
                 "--json")
    assert r.returncode == 0, r.stderr
    records = json.loads(r.stdout)
    assert [(n["host"], n["address"], n["ok"], n["env"]) for n in records] == [
        ("node1", "127.0.0.2", True, "-"), ("node2", "127.0.0.3", True, "-")]
    assert records[0]["fluidctl"] == "0.1.0" and records[0]["disk_free"] > 0


@pytest.fixture(scope="module")
def no_sftp(tmp_path_factory):
    """A node whose sshd serves no SFTP (the docs ask nodes for only Python and sshd)."""
    from sshd import SSHNodes
    nodes = SSHNodes.start(tmp_path_factory.mktemp("nosftp"), {"bare": "127.0.0.4"},
                           sftp=False)
    try:
        yield nodes
    finally:
        nodes.stop()


def test_a_node_without_sftp_is_not_ready_in_check_and_setup_dry_run(no_sftp, tmp_path,
                                                                      dry_run_wheelhouse):
    hosts = no_sftp.hostfile("hosts", slots=1)
    why = ("bare has no SFTP server, which cluster setup needs (add 'Subsystem sftp "
           "internal-sftp' to its sshd_config)")
    r = fluidctl("cluster", "check", "--hostfile", hosts, "--ssh-config", no_sftp.config)
    assert r.returncode == 1
    assert r.stderr.strip().splitlines()[-1] == \
        f"error: node bare failed the check: {why}"
    assert table_row(r.stdout, "bare")[2] == "FAIL"
    r = fluidctl("cluster", "setup", "--hostfile", hosts, "--ssh-config", no_sftp.config,
                 "--venv", tmp_path / "venv", "--wheelhouse", dry_run_wheelhouse,
                 "--system-site-packages", "--no-deps", "--dry-run", timeout=300)
    assert r.returncode == 1
    assert f"bare: cannot be set up: {why}" in r.stdout, r.stdout
    assert "│" not in r.stdout and table_row(r.stdout, "bare")[5] == "FAIL"   # 25.12: a pipe
    assert "use the venv there" not in r.stdout
    assert r.stderr.strip().splitlines()[-1] == \
        f"error: node bare failed the setup: {why}"


@pytest.mark.parametrize("command", ["check", "setup"])
def test_progress_lines_name_each_step_and_a_silent_node_while_waiting(sshd_nodes, tmp_path,
                                                                      command,
                                                                      dry_run_wheelhouse):
    """In a pipe: one stderr line per node per step as it happens, and a node that accepts
    the connection but never speaks SSH is named while it is being waited for."""
    silent = socket.socket()
    silent.bind(("127.0.0.4", 0))
    silent.listen()
    port = silent.getsockname()[1]
    hosts = tmp_path / "hosts"
    hosts.write_text(f"node1 slots=1\n127.0.0.4:{port} slots=1\n")
    more = (["--venv", tmp_path / "{host}" / "venv", "--wheelhouse", dry_run_wheelhouse,
             "--system-site-packages", "--no-deps", "--dry-run"] if command == "setup" else [])
    try:
        code, _, lines = silent_node_progress(
            [*FLUIDCTL, "cluster", command, "--hostfile", hosts, "--ssh-config",
             sshd_nodes.config, "--timeout", 4, *more], "127.0.0.4", 4)
    finally:
        silent.close()
    assert code == 1
    assert any(l.startswith("node1: connected (") for l in lines), lines
    assert any(l.startswith("127.0.0.4: cannot connect (") for l in lines), lines   # why: below
    steps = ["node1: checked: ok ("] if command == "check" else \
        ["node1: reading its environment", "node1: planned (create)"]
    for step in steps:
        assert any(l.startswith(step) for l in lines), lines
    assert lines[-1].startswith(f"error: node 127.0.0.4 failed the {command}: ")


def test_25_8_exec_names_a_silent_node_while_waiting(sshd_nodes, tmp_path):
    """cluster exec: the nodes' output only, but a node that never speaks SSH is named while
    it is waited for, then in the error."""
    silent = socket.socket()
    silent.bind(("127.0.0.4", 0))
    silent.listen()
    hosts = tmp_path / "hosts"
    hosts.write_text(f"node1 slots=1\n127.0.0.4:{silent.getsockname()[1]} slots=1\n")
    try:
        code, out, lines = silent_node_progress(
            [*FLUIDCTL, "cluster", "exec", "--hostfile", hosts, "--ssh-config", sshd_nodes.config,
             "--timeout", 2, "--", "echo hi"], "127.0.0.4", 2)
    finally:
        silent.close()
    assert code == 1 and out.startswith("[node1") and out.endswith("] hi\n"), (out, lines)
    assert lines[-1].startswith("error: node 127.0.0.4 failed: "), lines
    assert not [l for l in lines if l.startswith("node1")], lines


@pytest.mark.parametrize("backend", ["ssh", "fabric"])
def test_train_runs_a_shell_script_of_the_working_directory(sshd_nodes, tmp_path, backend):
    """``hi.sh``, ``./hi.sh`` and its absolute path run as they do locally: from the job's
    directory on each node (a bare name is not looked up on the node's PATH); a script
    missing there is one line naming the node and the path."""
    import json
    (tmp_path / "hi.sh").write_text('#!/bin/sh\necho "hi $PADDLE_TRAINER_ID in $(pwd)"\n')
    (tmp_path / "hi.sh").chmod(0o755)
    base = [*FLUIDCTL, "train", "--hostfile", str(sshd_nodes.hostfile("hosts.one", slots=1)),
            "--ssh-config", str(sshd_nodes.config), "--backend", backend]
    env = {"PATH": "/usr/bin:/bin", "NO_COLOR": "1", "HOME": str(Path.home()), "FLUIDCTL_STATE_DIR": os.environ["FLUIDCTL_STATE_DIR"]}
    for script in ("hi.sh", "./hi.sh", str(tmp_path / "hi.sh")):
        r = subprocess.run([*base, "--log-dir", str(tmp_path / "logs"), script], cwd=tmp_path,
                           capture_output=True, text=True, timeout=120, env=env)
        assert r.returncode == 0, r.stderr + r.stdout
        for rank, host in enumerate(("node1", "node2")):
            log = (tmp_path / "logs" / host / f"workerlog.{rank}").read_text()
            assert f"hi {rank} in {tmp_path}" in log, log
    r = subprocess.run([*base, "--dry-run", "--json", "hi.sh"], cwd=tmp_path,
                       capture_output=True, text=True, timeout=120, env=env)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["procs"][0]["argv"] == ["./hi.sh"]
    empty = tmp_path / "empty"
    empty.mkdir()
    r = subprocess.run([*base, "--remote-dir", str(empty), "--log-dir", str(tmp_path / "l2"),
                        "hi.sh"], cwd=tmp_path, capture_output=True, text=True, timeout=120,
                       env={**env, "COLUMNS": "300"})
    assert r.returncode != 0
    assert "Traceback" not in r.stdout + r.stderr and "FileNotFoundError" not in r.stderr
    assert any(f"SCRIPT ./hi.sh does not exist on {host} (in {empty})" in r.stderr
               for host in ("node1", "node2")), r.stderr      # whichever node answers first
