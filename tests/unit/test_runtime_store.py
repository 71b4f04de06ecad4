"""The rendezvous store over real loopback TCP: values, blocking waits with named timeouts,
authentication, and hostile input that must cost only the offending connection."""
import socket
import struct
import threading

import pytest

from fluidctl.runtime import wire
from fluidctl.runtime.store import StoreClient, StoreServer, StoreTimeout

TOKEN = "store-test-token"


@pytest.fixture
def server():
    srv = StoreServer("127.0.0.1", 0, TOKEN)
    yield srv
    srv.close()


def client(server, rank=0, token=TOKEN, timeout=5.0):
    return StoreClient(f"127.0.0.1:{server.port}", token, timeout, rank=rank)


def test_set_get_add_delete(server):
    a, b = client(server, 0), client(server, 1)
    a.set("k", b"\x00value")
    assert b.get("k") == b"\x00value"
    assert [a.add("n", 2), b.add("n", 3)] == [2, 5]
    assert b.multi_get(["k", "n"]) == [b"\x00value", b"5"]
    assert a.delete("k") and not a.delete("k")


def test_get_blocks_until_another_client_sets(server):
    a, b = client(server, 0), client(server, 1)
    got = []
    reader = threading.Thread(target=lambda: got.append(a.get("later", timeout=10)))
    reader.start()
    b.set("later", b"here")
    reader.join(15)
    assert got == [b"here"]


def test_barrier_timeout_names_the_absent_ranks(server):
    a, c = client(server, 0), client(server, 2)
    with pytest.raises(StoreTimeout) as early:       # rank 2 came, and stays counted
        c.barrier("start", 4, timeout=0.1)
    assert early.value.missing == [0, 1, 3]
    with pytest.raises(StoreTimeout) as err:
        a.barrier("start", 4, timeout=0.3, describe=lambda r: f"rank {r} (host{r}:1)")
    assert err.value.missing == [1, 3]
    message = str(err.value)
    assert "rank 1 (host1:1), rank 3 (host3:1) did not reach 'start' within 0.3s" in message
    assert "rank 2" not in message


def test_unreachable_store_names_the_endpoint():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(StoreTimeout) as err:
        StoreClient(f"127.0.0.1:{port}", TOKEN, 0.5, rank=3)
    assert f"rank 3: rank 0's rendezvous store at 127.0.0.1:{port} did not answer" in str(err.value)


def test_wrong_token_is_refused_and_server_keeps_serving(server):
    with pytest.raises(ConnectionError, match="rejected this process"):
        client(server, 1, token="wrong")
    good = client(server, 0)
    good.set("x", b"1")
    assert good.get("x") == b"1"


def closed_by_server(sock) -> bool:
    try:
        return sock.recv(100) == b""
    except ConnectionResetError:       # closed with our junk still unread: RST
        return True


def test_garbage_and_huge_frames_drop_only_that_connection(server, caplog):
    good = client(server, 0)
    for junk in (b"GET / HTTP/1.1\r\n\r\n" * 4,
                 struct.pack(">2sBBIQ", b"FL", 1, 0, 10, 1 << 60)):
        raw = socket.create_connection(("127.0.0.1", server.port), timeout=5)
        wire.recv_frame(raw, max_payload=0)          # the server's hello
        raw.sendall(junk)
        assert closed_by_server(raw)
        raw.close()
    # an authenticated peer sending nonsense requests gets an error reply, not a dead server
    sock = wire.connect(f"127.0.0.1:{server.port}", TOKEN)
    wire.send_frame(sock, {"op": "wait", "keys": ["a"], "timeout": "soon"})
    reply, _ = wire.recv_frame(sock)
    assert reply["ok"] is False
    wire.send_frame(sock, {"op": "explode"})
    assert wire.recv_frame(sock)[0] == {"ok": False, "error": "bad request 'explode'"}
    sock.close()
    good.set("still", b"up")
    assert good.get("still") == b"up"


def test_wait_idle_returns_when_clients_leave(server):
    c = client(server, 1)
    assert not server.wait_idle(0.1)
    c.close()
    assert server.wait_idle(5)
