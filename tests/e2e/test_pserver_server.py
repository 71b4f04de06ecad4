"""A real pserver process under hostile and ordinary clients: bad input drops one connection,
the server keeps serving; dense and sparse requests do what they say."""
import socket
import time

import msgpack
import numpy as np
import pytest

from fluidctl.runtime import optim, wire
import pserverutil as local
from fluidctl.runtime.pserver.client import PServerOptimizer
from fluidctl.runtime.pserver.protocol import PServerError
from fluidctl.runtime.pserver.sparse import initial_rows

TOKEN = "test-token-123"


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("pserver")
    port, = local.free_ports(1)
    endpoints = [f"127.0.0.1:{port}"]
    log = tmp / "serverlog.0"
    proc = local.start_pserver(0, endpoints, trainers=1, token=TOKEN, log_path=str(log),
                               args=["--max-frame-mb", "1", "--no-state"])
    yield {"endpoint": endpoints[0], "port": port, "log": log, "proc": proc}
    assert local.stop([proc]) == [0]


def _stats(endpoint):
    sock = wire.connect(endpoint, TOKEN)
    wire.send_frame(sock, {"op": "stats"})
    header, _ = wire.recv_frame(sock)
    sock.close()
    return header


def _closed_by_server(sock, timeout=10.0) -> bool:
    """True once the server has closed this connection (reads drain to EOF)."""
    sock.settimeout(timeout)
    try:
        while sock.recv(65536):
            pass
        return True
    except ConnectionResetError:
        return True
    finally:
        sock.close()


def _wait_for(predicate, timeout=10.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.02)
    return False


def _still_serves(endpoint, value=1.0):
    params = {"x": np.full(4, value, dtype=np.float32)}
    with PServerOptimizer(params, optimizer=optim.SGD(0.5), endpoints=[endpoint], trainer_id=0,
                          token=TOKEN, sync=True) as opt:
        before = params["x"].copy()
        opt.step({"x": np.ones(4, np.float32)})
        assert np.allclose(params["x"], before - 0.5)


def test_garbage_is_dropped_and_server_keeps_serving(server):
    dropped = _stats(server["endpoint"])["dropped_connections"]
    sock = socket.create_connection(("127.0.0.1", server["port"]))
    sock.sendall(b"GET / HTTP/1.1\r\nHost: pserver\r\n\r\n" * 4)
    assert _closed_by_server(sock)
    _still_serves(server["endpoint"])
    assert _stats(server["endpoint"])["dropped_connections"] == dropped + 1
    assert "dropped connection from 127.0.0.1" in server["log"].read_text()


def test_wrong_token_is_dropped(server):
    with pytest.raises(PServerError, match="job token"):
        PServerOptimizer({"x": np.zeros(4, np.float32)}, endpoints=[server["endpoint"]],
                         trainer_id=0, token="not-the-token", reconnect_timeout=2)
    assert _wait_for(lambda: "wrong job token" in server["log"].read_text())
    _still_serves(server["endpoint"])


def test_oversized_frame_from_an_authenticated_peer_is_dropped(server):
    sock = wire.connect(server["endpoint"], TOKEN)
    head = msgpack.packb({"op": "step"})
    sock.sendall(wire.PREFIX.pack(wire.MAGIC, wire.VERSION, 0, len(head), 2 << 20) + head)
    assert _closed_by_server(sock)
    assert _wait_for(lambda: "frame too large" in server["log"].read_text())
    _still_serves(server["endpoint"])


def test_a_silent_peer_does_not_block_others(server):
    silent = socket.create_connection(("127.0.0.1", server["port"]))
    try:
        _still_serves(server["endpoint"])
    finally:
        silent.close()


@pytest.mark.parametrize("header, payload, reason", [
    ({"op": "register", "trainer": 0, "init": True, "opt": {"kind": "sgd", "lr": 0.1},
      "dense": [["big", "<f4", [1 << 40]]]}, b"", "payload of 0 bytes"),
    ({"op": "register", "trainer": 0, "init": False, "opt": {"kind": "sgd", "lr": 0.1},
      "dense": [["obj", "|O", [2]]]}, b"", "not a plain numeric type"),
    ({"op": "register", "trainer": 7, "opt": {"kind": "sgd", "lr": 0.1}, "dense": []}, b"",
     "outside 0..0"),
    ({"op": "step", "trainer": 0, "step": 0, "keys": ["nope"]}, b"", "unknown parameter"),
    ({"op": "register", "trainer": "0", "dense": 5}, b"", "malformed register"),
    ({"op": "launch-missiles"}, b"", None),
])
def test_nonsense_requests_are_refused_and_dropped(server, header, payload, reason):
    sock = wire.connect(server["endpoint"], TOKEN)
    wire.send_frame(sock, header, [payload] if payload else [])
    sock.settimeout(10)
    if reason is not None:
        reply, _ = wire.recv_frame(sock)
        assert reply["op"] == "error" and reason in reply["msg"]
    assert _closed_by_server(sock)
    _still_serves(server["endpoint"])


def test_sparse_table_rows_are_created_on_touch_and_updated(server):
    params = {"x": np.zeros(4, np.float32)}   # same params and SGD(0.5) as the other tests
    with PServerOptimizer(params, optimizer=optim.SGD(0.5), endpoints=[server["endpoint"]],
                          trainer_id=0, token=TOKEN) as opt:
        emb = opt.sparse_table("emb", dim=4, dict_size=100, seed=3)
        ids = np.array([[5, -9], [5, 1 << 40]])
        got = emb.pull(ids)
        assert got.shape == (2, 2, 4) and got.dtype == np.float32
        expect = initial_rows(np.array([5, -9, 5, 1 << 40]), 4, np.float32, "uniform", 0.01, 3)
        assert np.array_equal(got.reshape(4, 4), expect)
        emb.push([5, 5, -9], np.ones((3, 4), np.float32))          # id 5 twice: summed
        assert np.array_equal(emb.pull([5]).reshape(4), expect[0])  # sync: held until ...
        opt.step({"x": np.zeros(4, np.float32)})                    # ... the step's barrier
        after = emb.pull([5, -9, 1 << 40])
        assert np.allclose(after[0], expect[0] - 1.0)
        assert np.allclose(after[1], expect[1] - 0.5)
        assert np.array_equal(after[2], expect[3])
        with pytest.raises(PServerError, match="full"):
            emb.pull(np.arange(1000, 1200))
        with pytest.raises(PServerError, match="already exists"):
            opt.sparse_table("emb", dim=8, dict_size=100)


def test_trainers_must_agree_on_mode_and_optimizer(server):
    x = {"x": np.zeros(4, np.float32)}       # registered by earlier tests with SGD(0.5)
    with pytest.raises(PServerError, match="runs async but this pserver runs sync"):
        PServerOptimizer(x, optimizer=optim.SGD(0.5), endpoints=[server["endpoint"]],
                         trainer_id=0, token=TOKEN, sync=False)
    with pytest.raises(PServerError, match="differs"):
        PServerOptimizer(x, optimizer=optim.Adam(0.5), endpoints=[server["endpoint"]],
                         trainer_id=0, token=TOKEN)


def _three_free_ports():
    """A free port whose next two ports are free too."""
    for _ in range(50):
        port, = local.free_ports(1)
        try:
            for extra in (port + 1, port + 2):
                socket.create_server(("127.0.0.1", extra)).close()
            return port
        except OSError:
            continue
    pytest.skip("no three consecutive free ports")


def test_extra_ports_serve_the_same_shard(tmp_path):
    port = _three_free_ports()
    proc = local.start_pserver(0, [f"127.0.0.1:{port}"], trainers=1, token=TOKEN,
                               args=["--no-state", "--ports_num", "2",
                                     "--ports_num_for_sparse", "1"])
    try:
        _still_serves(f"127.0.0.1:{port}")
        for extra in (port + 1, port + 2):
            assert _stats(f"127.0.0.1:{extra}")["params"] == 1
    finally:
        assert local.stop([proc]) == [0]


def test_a_finished_trainer_leaves_and_sync_rounds_go_on(tmp_path):
    import threading
    port, = local.free_ports(1)
    endpoint = f"127.0.0.1:{port}"
    proc = local.start_pserver(0, [endpoint], trainers=2, token=TOKEN, args=["--no-state"])
    results = {}

    def trainer(rank, steps):
        params = {"x": np.zeros(2)}
        with PServerOptimizer(params, optimizer=optim.SGD(1.0), endpoints=[endpoint],
                              trainer_id=rank, token=TOKEN) as opt:
            for _ in range(steps):
                opt.step({"x": np.full(2, rank + 1.0)})
            results[rank] = params["x"].copy()
    try:
        threads = [threading.Thread(target=trainer, args=(r, s)) for r, s in ((0, 5), (1, 2))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        assert not any(t.is_alive() for t in threads), "sync rounds deadlocked"
        # 2 rounds averaging (1 + 2) / 2, then 3 rounds of trainer 0 alone
        assert np.allclose(results[0], -(2 * 1.5 + 3 * 1.0))
        assert _stats(endpoint)["step"] == 5
    finally:
        assert local.stop([proc]) == [0]


def test_trainers_may_start_before_the_pservers(tmp_path, caplog):
    """No readiness barrier is needed: a trainer retries refused connections with backoff, and
    says nothing while the pserver is still starting (issue 13, item 10: no "unreachable ...
    Connection refused" on every start); a wait for the first connection is no reconnect."""
    import threading
    port, = local.free_ports(1)
    endpoint = f"127.0.0.1:{port}"
    result = {}

    def trainer():
        params = {"x": np.zeros(3)}
        with PServerOptimizer(params, optimizer=optim.SGD(1.0), endpoints=[endpoint],
                              trainer_id=0, token=TOKEN, reconnect_timeout=30) as opt:
            opt.step({"x": np.ones(3)})
            result["x"], result["reconnects"] = params["x"].copy(), opt.reconnects
    caplog.set_level("INFO", logger="fluidctl.pserver.client")
    thread = threading.Thread(target=trainer)
    thread.start()                                   # connects while nothing listens yet
    proc = local.start_pserver(0, [endpoint], trainers=1, token=TOKEN, args=["--no-state"])
    try:
        thread.join(30)
        assert not thread.is_alive()
        assert np.array_equal(result["x"], -np.ones(3)) and result["reconnects"] == 0
        assert not [r for r in caplog.records if r.name == "fluidctl.pserver.client"], caplog.text
    finally:
        assert local.stop([proc]) == [0]
