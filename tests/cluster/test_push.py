"""cluster sync's transport (fluidctl.remote.push): one OpenSSH process per node and a
standard-library receiver, against real sshd nodes on loopback; and the SFTP fallback."""
import os
import re
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fluidctl.remote import push, sshargv

from launchutil import default_sigint, silent_node_progress
from pushutil import files_of, make_workspace


def argv_for(sshd_nodes, alias="node1"):
    return sshargv.ssh_command(alias, ssh_config=str(sshd_nodes.config), timeout=10)


def no_temporaries(root):
    return not [p for p in Path(root).rglob("*") if ".fluidctl-" in p.name]


@pytest.fixture
def workspace(tmp_path):
    return make_workspace(tmp_path)


def test_push_copies_contents_modes_and_mtimes_then_only_changes(sshd_nodes, workspace,
                                                                 tmp_path):
    remote = tmp_path / "remote" / "ws"
    argv = argv_for(sshd_nodes)
    sent = []
    first = push.push(argv, files_of(workspace, "*.ckpt"), str(remote), on_bytes=sent.append)
    assert sorted(first.sent) == ["empty.txt", "pkg/sub/lib.py", "run.sh", "train.py",
                                  "weights.bin"]
    sizes = sum((workspace / rel).stat().st_size for rel in first.sent)
    assert first.unchanged == 0 and sum(sent) == first.sent_bytes == sizes > 3 << 20
    for rel in first.sent:
        here, there = workspace / rel, remote / rel
        assert there.read_bytes() == here.read_bytes()
        assert stat.S_IMODE(there.stat().st_mode) == stat.S_IMODE(here.stat().st_mode)
        assert there.stat().st_mtime_ns == here.stat().st_mtime_ns
    assert not (remote / "big.ckpt").exists() and not (remote / "__pycache__").exists()
    assert no_temporaries(remote)

    again = push.push(argv, files_of(workspace, "*.ckpt"), str(remote))
    assert again.sent == [] and again.unchanged == 5

    (workspace / "train.py").write_text("print('v2')\n")           # same size, new mtime
    later = time.time() + 5
    os.utime(workspace / "train.py", (later, later))
    third = push.push(argv, files_of(workspace, "*.ckpt"), str(remote))
    assert third.sent == ["train.py"] and third.unchanged == 4
    assert (remote / "train.py").read_text() == "print('v2')\n"

    # same size and mtime kept: only compare="hash" sees the change
    stamp = (workspace / "pkg/sub/lib.py").stat().st_mtime_ns
    (workspace / "pkg/sub/lib.py").write_text("X = 2\n")
    os.utime(workspace / "pkg/sub/lib.py", ns=(stamp, stamp))
    assert push.push(argv, files_of(workspace, "*.ckpt"), str(remote)).sent == []
    fourth = push.push(argv, files_of(workspace, "*.ckpt"), str(remote), compare="hash")
    assert fourth.sent == ["pkg/sub/lib.py"]
    assert (remote / "pkg/sub/lib.py").read_text() == "X = 2\n"


def test_push_names_the_files_it_could_not_write(sshd_nodes, workspace, tmp_path):
    blocker = tmp_path / "remote"
    blocker.write_text("a file where a directory should be")
    with pytest.raises(push.PushFailed, match="file\\(s\\) not written: .*Not a directory"):
        push.push(argv_for(sshd_nodes), files_of(workspace), str(blocker / "ws"))
    assert blocker.read_text() == "a file where a directory should be"


def test_push_reports_ssh_failures_with_ssh_s_own_words(sshd_nodes, workspace, tmp_path):
    config = tmp_path / "ssh_config"
    config.write_text(sshd_nodes.config.read_text()
                      + "Host closed\n    HostName 127.0.0.4\n    Port 1\n")
    argv = sshargv.ssh_command("closed", ssh_config=str(config), timeout=5)
    with pytest.raises(push.PushFailed, match="127.0.0.4 port 1: Connection refused"):
        push.push(argv, files_of(workspace), str(tmp_path / "never"))


def test_sync_without_an_ssh_client_goes_over_sftp(sshd_nodes, workspace, tmp_path):
    """No `ssh` on PATH: the same result through paramiko's SFTP."""
    hostfile = sshd_nodes.hostfile("hosts-fallback.txt")
    remote = tmp_path / "remote" / "{host}"
    env = {"PATH": str(tmp_path / "empty-bin"), "NO_COLOR": "1", "HOME": str(Path.home()), "FLUIDCTL_STATE_DIR": os.environ["FLUIDCTL_STATE_DIR"]}
    argv = [sys.executable, "-m", "fluidctl", "cluster", "sync", "--hostfile", str(hostfile),
            "--ssh-config", str(sshd_nodes.config), "--remote-dir", str(remote),
            "--exclude", "*.ckpt", str(workspace)]
    r = subprocess.run(argv, capture_output=True, text=True, timeout=120, env=env)
    assert r.returncode == 0, r.stderr
    for node in ("node1", "node2"):
        there = tmp_path / "remote" / node
        assert (there / "weights.bin").read_bytes() == (workspace / "weights.bin").read_bytes()
        assert (there / "pkg/sub/lib.py").read_text() == "X = 1\n"
        assert not (there / "big.ckpt").exists()
    # then OpenSSH finds the SFTP-synced tree up to date (mtimes compared in whole seconds)
    env["PATH"] = "/usr/bin:/bin"
    r = subprocess.run(argv, capture_output=True, text=True, timeout=120, env=env)
    assert r.returncode == 0, r.stderr
    rows = [[c.strip() for c in line.split("|")] for line in r.stdout.splitlines()
            if line.startswith("node")]
    assert [row[0] for row in rows] == ["node1", "node2"], r.stdout
    assert all(row[2] == "0" and row[4] == "5" for row in rows), r.stdout    # sent, unchanged


def test_25_8_sync_progress_in_a_pipe_and_a_line_per_failing_node(sshd_nodes, workspace,
                                                                  tmp_path):
    """In a pipe: one stderr line per node per step (its answer, its end), a node that
    accepts the connection but never speaks SSH named while it is waited for, and the
    failing nodes under one summary line, one line each."""
    import socket
    silent = socket.socket()
    silent.bind(("127.0.0.4", 0))
    silent.listen()
    hostfile = tmp_path / "hosts"
    hostfile.write_text("node1\nclosed\nsilent\n")
    config = tmp_path / "ssh_config"
    config.write_text(sshd_nodes.config.read_text()
                      + "Host closed\n    HostName 127.0.0.4\n    Port 1\n"
                      + f"Host silent\n    HostName 127.0.0.4\n"
                        f"    Port {silent.getsockname()[1]}\n")
    try:
        code, _, lines = silent_node_progress(
            [sys.executable, "-m", "fluidctl", "cluster", "sync", "--hostfile", hostfile,
             "--ssh-config", config, "--timeout", 3, "--remote-dir",
             tmp_path / "remote" / "{host}", workspace], "silent", 3)
    finally:
        silent.close()
    assert code == 1, lines
    assert any(re.fullmatch(r"node1: sending \d+ of \d+ file\(s\) \(.*\)", l) for l in lines)
    assert any(re.fullmatch(r"node1: synced \(\d+\.\d s\)", l) for l in lines), lines
    assert any(l.startswith("closed: failed: ") for l in lines), lines
    assert lines[-3:-2] == ["error: 2 of 3 node(s) failed to sync"], lines
    assert lines[-2].startswith("  node closed: ") and "Connection refused" in lines[-2]
    assert lines[-1].startswith("  node silent: "), lines
    assert "Traceback" not in "\n".join(lines)
    assert (tmp_path / "remote" / "node1" / "train.py").read_text() == "print('v1')\n"


def test_names_that_are_not_utf8_or_hold_spaces_and_newlines_arrive_as_they_are(
        sshd_nodes, tmp_path):
    """The file list carries paths as the file system's bytes (NUL-separated), not as text."""
    src = tmp_path / "odd"
    src.mkdir()
    names = [b"caf\xe9.txt", b"with space.py", b"new\nline.txt", "日本.txt".encode()]
    for name in names:
        (src / os.fsdecode(name)).write_bytes(name * 3)
    remote = tmp_path / "remote"
    result = push.push(argv_for(sshd_nodes), files_of(src), str(remote))
    assert len(result.sent) == 4
    assert sorted(os.listdir(os.fsencode(remote))) == sorted(names)
    for name in names:
        assert (remote / os.fsdecode(name)).read_bytes() == name * 3
    assert push.push(argv_for(sshd_nodes), files_of(src), str(remote)).unchanged == 4


def _negotiated_cipher(argv):
    """The cipher this argv's ssh actually negotiates (ssh -v's own report)."""
    r = subprocess.run(argv[:-2] + ["-v", "-o", "LogLevel=DEBUG1"] + argv[-2:] + ["true"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    found = re.search(r"kex: client->server cipher: (\S+)", r.stderr)
    assert found, r.stderr
    return found.group(1)


def test_aes_gcm_first_only_where_the_ssh_config_leaves_ciphers_alone(sshd_nodes, tmp_path):
    config = tmp_path / "ssh_config"
    config.write_text("Host chosen\n    Ciphers aes256-ctr\n\n"
                      + sshd_nodes.config.read_text().replace("Host node1\n",
                                                              "Host node1 chosen\n"))
    plain, chosen = sshargv.with_fast_cipher([
        sshargv.ssh_command(alias, ssh_config=str(config), timeout=10)
        for alias in ("node1", "chosen")])
    assert "-c" not in chosen and _negotiated_cipher(chosen) == "aes256-ctr"   # the user's
    if sshargv._aes_in_hardware():
        assert plain[plain.index("-c") + 1] == sshargv.CIPHERS
        assert _negotiated_cipher(plain) == "aes128-gcm@openssh.com"
    else:                                   # chacha20 stays first where AES is in software
        assert "-c" not in plain
    assert set(sshargv.CIPHERS.split(",")) == set(sshargv.OPENSSH_DEFAULT_CIPHERS.split(","))
    src = tmp_path / "src"
    src.mkdir()
    (src / "a.bin").write_bytes(os.urandom(1 << 20))
    for argv, where in ((plain, "p"), (chosen, "c")):
        push.push(argv, files_of(src), str(tmp_path / where))
        assert (tmp_path / where / "a.bin").read_bytes() == (src / "a.bin").read_bytes()


def test_a_config_without_ciphers_gets_aes_gcm_without_running_ssh_g(sshd_nodes, monkeypatch):
    """Where no config file ssh reads has a Ciphers line, the choice is made without
    ``ssh -G`` (two processes and ~5 ms before the first handshake), and ssh still negotiates
    what was offered."""
    if not sshargv._aes_in_hardware():
        pytest.skip("AES is not in hardware here: the default order is kept")
    started = []
    real_popen = subprocess.Popen

    def spy(argv, *args, **kwargs):
        started.append(argv)
        return real_popen(argv, *args, **kwargs)
    monkeypatch.setattr(subprocess, "Popen", spy)
    [argv] = sshargv.with_fast_cipher([argv_for(sshd_nodes)])
    assert started == []
    assert argv[argv.index("-c") + 1] == sshargv.CIPHERS
    monkeypatch.undo()
    assert _negotiated_cipher(argv) == "aes128-gcm@openssh.com"


def test_a_file_that_shrinks_while_sent_stops_the_push_and_leaves_nothing_half_written(
        sshd_nodes, workspace, tmp_path, monkeypatch):
    """weights.bin is listed at 3 MiB, then cut to 1 MiB: sendfile runs dry mid-file, the push
    fails with what to do, ssh is killed and reaped (no zombie), and the receiver, seeing its
    input end inside a file, removes that file's temporary name: nothing half-written."""
    spawned = []
    real_spawn = os.posix_spawnp

    def spy(*args, **kwargs):
        spawned.append(real_spawn(*args, **kwargs))
        return spawned[-1]
    monkeypatch.setattr(push.os, "posix_spawnp", spy)
    files = files_of(workspace)
    os.truncate(workspace / "weights.bin", 1 << 20)
    remote = tmp_path / "remote"
    with pytest.raises(push.PushFailed, match=r"weights.bin changed while being sent; run the "
                                              r"sync again"):
        push.push(argv_for(sshd_nodes), files, str(remote))
    [pid] = spawned
    with pytest.raises(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)                     # already reaped
    deadline = time.monotonic() + 30                    # the node notices its input ended
    while time.monotonic() < deadline and not no_temporaries(remote):
        time.sleep(0.05)
    assert no_temporaries(remote), receivers_left(remote)
    assert not (remote / "weights.bin").exists()


def receivers_left(root):
    """For a failure: each temporary left, and what its receiver (the pid in its name) is
    doing now, if it is still there."""
    out = []
    for path in Path(root).rglob("*.fluidctl-*.tmp"):
        pid = path.name.rsplit(".fluidctl-", 1)[1].split(".")[0]
        try:
            stat = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
            wchan = Path(f"/proc/{pid}/wchan").read_text()
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")[:200]
            fds = {}
            for fd in os.listdir(f"/proc/{pid}/fd"):
                try:
                    fds[fd] = os.readlink(f"/proc/{pid}/fd/{fd}")
                except OSError:
                    pass
            out.append(f"{path} ({path.stat().st_size} bytes): pid {pid} state {stat} "
                       f"wchan {wchan} fds {fds} cmd {cmd!r}")
        except OSError as exc:
            out.append(f"{path} ({path.stat().st_size} bytes): pid {pid} gone ({exc})")
    return "\n".join(out) or "no temporary left"


def test_every_node_s_ssh_starts_before_any_stderr_reader(sshd_nodes, workspace, tmp_path,
                                                           monkeypatch):
    """connect_all spawns every ssh first: a thread's start waits for that thread to run, and
    under load held the next node's ssh back by milliseconds. Both nodes are then synced."""
    events = []
    real_spawn, real_reap = os.posix_spawnp, push._Channel._start_reader
    monkeypatch.setattr(push.os, "posix_spawnp",
                        lambda *a, **k: events.append("spawn") or real_spawn(*a, **k))

    def reap(channel):
        events.append("reader")
        real_reap(channel)
    monkeypatch.setattr(push._Channel, "_start_reader", reap)
    argvs = [argv_for(sshd_nodes, alias) for alias in ("node1", "node2")]
    channels = push.connect_all(argvs)
    assert events[:4] == ["spawn", "spawn", "reader", "reader"]
    files = files_of(workspace)
    for argv, channel, alias in zip(argvs, channels, ("node1", "node2")):
        result = push.push(argv, files, str(tmp_path / alias), channel=channel)
        assert result.unchanged == 0 and len(result.sent) == len(files)
        assert (tmp_path / alias / "weights.bin").read_bytes() == \
            (workspace / "weights.bin").read_bytes()
        assert channel.returncode == 0


def test_ctrl_c_mid_transfer_leaves_no_ssh_and_nothing_half_written(sshd_nodes, tmp_path):
    """SIGINT while a large file streams to two nodes: fluidctl exits 130, its ssh processes
    end, and each node's receiver, its input cut inside a file, removes that file's
    temporary name: the nodes hold no partial file."""
    import psutil
    import signal
    src = tmp_path / "src"
    src.mkdir()
    with open(src / "big.bin", "wb") as f:
        f.truncate(768 << 20)                           # sparse: instant to make, slow to send
    remote = tmp_path / "remote"
    proc = subprocess.Popen([sys.executable, "-m", "fluidctl", "cluster", "sync", "--hosts",
                             "node1,node2", "--ssh-config", str(sshd_nodes.config),
                             "--remote-dir", str(remote / "{host}"), str(src)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=default_sigint)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and no_temporaries(remote) and proc.poll() is None:
        time.sleep(0.02)                                # until bytes are arriving on a node
    assert not no_temporaries(remote), "the transfer never started"
    children = psutil.Process(proc.pid).children(recursive=True)
    assert any(c.name() == "ssh" for c in children)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert "Traceback" not in err
    gone, alive = psutil.wait_procs(children, timeout=30)
    assert not alive, alive
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and not no_temporaries(remote):
        time.sleep(0.05)
    assert no_temporaries(remote)
    assert not list(remote.rglob("big.bin"))
