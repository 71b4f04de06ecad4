"""The rendezvous store at scale, over real loopback TCP: no request or reply that grows with
the world, barriers as one O(1) request, a connect storm from one address that loses nobody,
and a layout each node gets its own share of, checked against a brute-force one."""
import random
import socket
import threading
import time

import msgpack
import pytest

from fluidctl.runtime import rendezvous, storeserver, wire
from fluidctl.runtime import store as store_mod
from fluidctl.runtime.store import StoreClient, StoreServer, StoreTimeout

TOKEN = "store-scale-token"


@pytest.fixture
def server():
    srv = StoreServer("127.0.0.1", 0, TOKEN, members=256)
    yield srv
    srv.close()


def records(node: int, per_node: int):
    return [{"rank": node * per_node + i, "ep": f"10.0.{node // 250}.{node % 250}:{7000 + i}",
             "node": f"10.0.{node // 250}.{node % 250}", "pid": 1000 + i}
            for i in range(per_node)]


def join_world(port: int, n_nodes: int, per_node: int):
    """Every node joins on a connection of its own, all at once; (largest request, largest
    reply, views) in bytes."""
    world = n_nodes * per_node
    socks = [wire.connect(f"127.0.0.1:{port}", TOKEN, io_timeout=30) for _ in range(n_nodes)]
    biggest_request = 0
    try:
        for node, sock in enumerate(socks):
            header = {"op": "join", "key": "layout", "n": world,
                      "records": records(node, per_node), "timeout": 30}
            biggest_request = max(biggest_request, len(msgpack.packb(header)))
            wire.send_frame(sock, header)
        views, biggest_reply = [], 0
        for sock in socks:
            head_len, size = wire.parse_prefix(wire.recv_exact(sock, wire.PREFIX.size))
            reply = wire.parse_header(wire.recv_exact(sock, head_len))
            biggest_reply = max(biggest_reply, head_len + size)
            assert reply["ok"], reply
            views.append(reply["views"][0])
        return biggest_request, biggest_reply, views
    finally:
        for sock in socks:
            sock.close()


def test_requests_and_replies_stay_bounded_as_the_world_grows():
    """Property over N: a node's join and its answer do not grow with the world."""
    sizes = {}
    for n_nodes in (2, 32, 512):
        srv = StoreServer("127.0.0.1", 0, TOKEN, members=n_nodes)
        try:
            request, reply, views = join_world(srv.port, n_nodes, 8)
        finally:
            srv.close()
        sizes[n_nodes] = (request, reply)
        assert [v["node_index"] for v in views] == list(range(n_nodes))
        assert all(v["world"] == 8 * n_nodes and len(v["local"]) == 8 for v in views)
    for request, reply in sizes.values():
        assert request <= storeserver.MAX_REQUEST and reply <= storeserver.MAX_REQUEST
    # 256 times the world: a few bytes more (wider integers), never proportionally more
    assert sizes[512][0] <= sizes[2][0] + 64 and sizes[512][1] <= sizes[2][1] + 64


def test_a_barrier_is_one_request_of_constant_size(server, monkeypatch):
    sent = []
    real = wire.send_frame

    def spy(sock, header, buffers=()):
        sent.append(len(msgpack.packb(header)))
        return real(sock, header, buffers)
    monkeypatch.setattr(store_mod.wire, "send_frame", spy)
    small, big = (StoreClient(f"127.0.0.1:{server.port}", TOKEN, 5, rank=r) for r in (1, 999_999))
    for client, world in ((small, 2), (big, 1_000_000)):
        sent.clear()
        with pytest.raises(StoreTimeout) as err:
            client.barrier(f"b{world:07d}", world, timeout=0.05)
        assert len(sent) == 1, "a barrier is one request"
        if world == 2:
            size_small = sent[0]
        else:
            assert sent[0] <= size_small + 16          # wider integers only
            assert len(err.value.missing) == storeserver.MAX_NAMED       # named, bounded
            assert err.value.total == world - 1


def test_a_barrier_completes_when_the_last_rank_arrives(server):
    n = 6
    clients = [StoreClient(f"127.0.0.1:{server.port}", TOKEN, 10, rank=r) for r in range(n)]
    done = []
    threads = [threading.Thread(target=lambda c=c: (c.barrier("all", n, 10), done.append(c.rank)))
               for c in clients[1:]]
    for t in threads:
        t.start()
    time.sleep(0.05)                      # not synchronisation: the others must still be parked
    assert not done
    clients[0].barrier("all", n, 10)
    for t in threads:
        t.join(10)
    assert sorted(done) == list(range(1, n))


def test_an_oversized_request_drops_only_that_connection(server):
    good = StoreClient(f"127.0.0.1:{server.port}", TOKEN, 5, rank=0)
    sock = wire.connect(f"127.0.0.1:{server.port}", TOKEN, io_timeout=5)
    keys = [f"rank/{r}" for r in range(20_000)]           # today's N-key wait: > 64 KiB
    wire.send_frame(sock, {"op": "wait", "keys": keys, "timeout": 1, "fetch": True})
    with pytest.raises((wire.PeerClosed, ConnectionResetError)):
        wire.recv_frame(sock)
    sock.close()
    good.set("still", b"up")
    assert good.get("still") == b"up"


def test_a_connect_storm_of_256_ranks_from_one_address_loses_none(server):
    drops = []
    server._acceptor.on_drop = lambda addr, why: drops.append(why)
    socks = [socket.create_connection(("127.0.0.1", server.port), timeout=10)
             for _ in range(256)]                          # all pending before any answers
    try:
        for sock in socks:
            wire.client_handshake(sock, TOKEN, timeout=10)
    finally:
        for sock in socks:
            sock.close()
    assert drops == []


def test_wait_any_is_answered_by_the_server_when_a_key_appears(server):
    waiter = StoreClient(f"127.0.0.1:{server.port}", TOKEN, 5, rank=0)
    setter = StoreClient(f"127.0.0.1:{server.port}", TOKEN, 5, rank=1)
    assert waiter.wait_any(["a", "b"], 0.05) == {}
    threading.Timer(0.1, lambda: setter.set("b", b"2")).start()
    began = time.monotonic()
    assert waiter.wait_any(["a", "b"], 10) == {"b": b"2"}
    assert time.monotonic() - began < 5


def test_join_timeout_names_absent_ranks_and_a_finished_layout_can_be_read_again(server):
    a = StoreClient(f"127.0.0.1:{server.port}", TOKEN, 5, rank=0)
    with pytest.raises(StoreTimeout) as err:
        a.join("g", 3, records(0, 1), timeout=0.05)
    assert err.value.missing == [1, 2]
    with pytest.raises(ValueError, match="no layout"):
        a.join("g", 3, [{"rank": 0}], read=True)


@pytest.mark.parametrize("seed", range(5))
def test_layout_matches_a_brute_force_one(seed):
    rng = random.Random(seed)
    world = rng.randint(1, 200)
    hosts = [f"h{rng.randint(0, 9)}" for _ in range(world)]
    recs = {r: {"ep": f"{hosts[r]}:{7000 + r}", "node": hosts[r], "pid": r} for r in range(world)}
    layout = rendezvous.Layout(world, recs)
    order = list(dict.fromkeys(hosts))
    leaders = [hosts.index(h) for h in order]
    for rank in range(world):
        view = rendezvous.NodeView(layout.view(rank))
        i = order.index(hosts[rank])
        assert view.local == [r for r in range(world) if hosts[r] == hosts[rank]]
        assert (view.world, view.n_nodes, view.node_index) == (world, len(order), i)
        assert view.max_local == max(hosts.count(h) for h in order)
        members, index = view.ring_members()
        assert index == i and members[i] == (leaders[i], recs[leaders[i]]["ep"])
        assert view.prev == (leaders[i - 1], recs[leaders[i - 1]]["ep"])
        following = leaders[(i + 1) % len(order)]
        assert view.next == (following, recs[following]["ep"])


def test_a_node_of_2000_ranks_joins_in_bounded_requests_and_gets_every_view(server,
                                                                              monkeypatch):
    """A node agent's join for a big node (CPU ranks) goes in chunks under MAX_REQUEST; the
    last one waits for the world, and the views cover every rank of the node."""
    sent = []
    real = wire.send_frame

    def spy(sock, header, buffers=()):
        sent.append(len(msgpack.packb(header)))
        return real(sock, header, buffers)
    monkeypatch.setattr(store_mod.wire, "send_frame", spy)
    client = StoreClient(f"127.0.0.1:{server.port}", TOKEN, 30)
    try:
        views = client.join("layout", 2000, records(0, 2000), 30)
    finally:
        client.close()
    assert max(sent) <= storeserver.MAX_REQUEST and len(sent) >= 8
    assert sorted(r for v in views for r, _, _ in v["local"]) == list(range(2000))
