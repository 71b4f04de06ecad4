"""The SSH connections' socket acknowledges every read at once (fluidctl/remote/sshconfig.py
``QuickAckSocket``): TCP_QUICKACK is set before each read (Linux clears it by itself), so a
peer that keeps Nagle's algorithm on (sshd, without a terminal) never waits for our delayed
ACK. Over a real loopback TCP connection."""
import socket

import pytest

from fluidctl.remote.sshconfig import QuickAckSocket

pytestmark = pytest.mark.skipif(not hasattr(socket, "TCP_QUICKACK"), reason="Linux only")


class Recording(QuickAckSocket):
    """Records each option set on it."""
    seen: list

    def setsockopt(self, *args):
        self.seen.append(("set",) + args)
        return super().setsockopt(*args)


@pytest.fixture
def pair():
    server = socket.create_server(("127.0.0.1", 0))
    client = socket.create_connection(server.getsockname(), timeout=5)
    peer, _ = server.accept()
    yield client, peer
    for sock in (client, peer, server):
        sock.close()


def test_the_connection_is_taken_over_with_its_timeout_and_options(pair):
    client, peer = pair
    client.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    fd = client.fileno()
    quick = QuickAckSocket.taking(client)
    try:
        assert client.fileno() == -1 and quick.fileno() == fd       # one connection, moved
        assert quick.gettimeout() == 5
        assert quick.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) != 0
        peer.sendall(b"hello")
        assert quick.recv(5) == b"hello"
    finally:
        quick.close()


def test_every_read_asks_for_an_immediate_ack(pair):
    client, peer = pair
    Recording.seen = []
    quick = Recording.taking(client)
    try:
        quick_ack = ("set", socket.IPPROTO_TCP, socket.TCP_QUICKACK, 1)
        peer.sendall(b"first")
        assert quick.recv(5) == b"first"
        assert Recording.seen.count(quick_ack) == 1
        peer.sendall(b"second")
        buffer = bytearray(6)
        assert quick.recv_into(buffer) == 6 and bytes(buffer) == b"second"
        assert Recording.seen.count(quick_ack) == 2
    finally:
        quick.close()
