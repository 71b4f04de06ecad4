"""Messages of issue 39 (a new user's third walk) against real sockets on this machine: an SSH
server that accepts and closes at once, and a refused connection to a lost node."""
import socket
import threading
import time
from types import SimpleNamespace

import pytest

from fluidctl.planning.hosts import Host
from fluidctl.remote.ssh import ConnectFailed, SSHNode
from fluidctl.remote.sshconfig import SSHTarget


def test_a_server_that_closes_at_once_is_closed_by_remote_host_not_a_timeout(tmp_path):
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        port = server.getsockname()[1]

        def close_each():
            for _ in range(4):
                try:
                    conn, _ = server.accept()
                except OSError:
                    return
                conn.close()
        threading.Thread(target=close_each, daemon=True).start()
        target = SSHTarget("node9", "127.0.0.1", port, user="root",
                           known_hosts_files=(str(tmp_path / "known_hosts"),))
        started = time.monotonic()
        with pytest.raises(ConnectFailed) as failed:
            SSHNode(Host("node9"), target, timeout=10).connect()
    assert time.monotonic() - started < 5
    reason = str(failed.value)
    assert "within 10s" not in reason and "raise --timeout" not in reason, reason
    assert reason.startswith(f"connection closed by remote host 127.0.0.1:{port} before the "
                             "SSH handshake"), reason


def test_a_refused_probe_is_a_node_up_with_sshd_gone_not_a_partition():
    from fluidctl.backends.ssh import diagnostics as ssh
    from fluidctl.diagnostics.classify import lost_node
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
        probe = ssh.probe_link(SimpleNamespace(node=SimpleNamespace(target=SimpleNamespace(
            hostname="127.0.0.1", port=port, proxy_jump=(), proxy_command=None))))
    verdict = lost_node("node2", probe)
    assert verdict.kind != "partition", verdict
    assert verdict.sentence == (f"sshd gone: node2 is up but refused a new connection "
                                f"({probe}): its kernel answered, sshd is not listening "
                                "(restart it, or check Port in the ssh config)")


def test_a_dry_runs_masked_secret_is_refused_by_the_pod_in_one_line(capsys, tmp_path,
                                                                     monkeypatch):
    """`--dry-run` hides the job token; the YAML it prints must not start a job keyed by a
    public string: its pods refuse the placeholder with one line."""
    import yaml
    from fluidctl.backends.k8s import pod
    from launchutil import BEHAVE
    from test_cli_inprocess import run_cli
    monkeypatch.chdir(tmp_path)
    (tmp_path / "tok").write_text("s3cret\n")
    code, out, err = run_cli(capsys, "train", "--backend", "k8s", "--kind", "jobset", "--image",
                             "img:1", "--nodes", 2, "--nproc", 1, "--token-file",
                             tmp_path / "tok", "--dry-run", BEHAVE)
    assert code == 0, err
    secret, config_map = list(yaml.safe_load_all(out))[:2]
    token = secret["stringData"]["token"]
    assert "s3cret" not in out and token != "***"
    plan = tmp_path / "plan.json"
    plan.write_text(config_map["data"]["plan.json"])
    monkeypatch.setenv("FLUIDCTL_JOB_TOKEN", token)
    with pytest.raises(SystemExit) as exited:
        pod.main([str(plan)])
    err = capsys.readouterr().err
    assert exited.value.code == 2
    assert err.count("\n") == 1 and err.startswith("error: the job token is --dry-run's "
                                                   "placeholder"), err
