"""probe_link (backends/ssh/diagnostics.py), which tells a frozen node from a cut one once its agent went
silent, against real sockets on this machine: a listener that never speaks (a frozen node's
kernel accepts for its stopped sshd), one that sends a banner, and a closed port."""
import socket
import threading
from types import SimpleNamespace

from fluidctl.backends.ssh import diagnostics as ssh


def agent_for(port, **target):
    return SimpleNamespace(node=SimpleNamespace(target=SimpleNamespace(
        hostname="127.0.0.1", port=port, proxy_jump=(), proxy_command=None, **target)))


def test_accepted_without_banner_is_frozen_with_banner_not_closed_port_cut(monkeypatch):
    monkeypatch.setattr(ssh, "PROBE_TIMEOUT", 0.3)
    with socket.socket() as silent, socket.socket() as speaks, socket.socket() as closed:
        for s in (silent, speaks, closed):
            s.bind(("127.0.0.1", 0))
        silent.listen(1)
        speaks.listen(1)
        port = {name: s.getsockname()[1] for name, s in
                (("silent", silent), ("speaks", speaks), ("closed", closed))}
        said = ssh.probe_link(agent_for(port["silent"]))
        assert said.startswith(f"frozen: its link is up (a new TCP connection to 127.0.0.1:"
                               f"{port['silent']} was accepted in "), said
        assert "nothing answers on it (no SSH banner within 0.3s)" in said

        def banner():
            conn, _ = speaks.accept()
            with conn:
                conn.sendall(b"SSH-2.0-OpenSSH_9\r\n")
        threading.Thread(target=banner, daemon=True).start()
        assert ssh.probe_link(agent_for(port["speaks"])).endswith(
            "and its sshd answers: its agent alone is silent")
        assert ssh.probe_link(agent_for(port["closed"])) == (
            f"a new TCP connection to 127.0.0.1:{port['closed']} failed (Connection refused)")
    assert ssh.probe_link(SimpleNamespace(node=SimpleNamespace(target=SimpleNamespace(
        hostname="h", port=22, proxy_jump=("hop",), proxy_command=None)))) == ""
