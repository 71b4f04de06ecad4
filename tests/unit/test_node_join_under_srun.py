"""The node's join where srun starts the ranks (runtime/nodejoin.py, node/worker.py,
collective/bootstrap.py): the node's first task serves it from its runtime.init() on a socket
every task names alike; the others wait for it to appear, or join the store themselves when the
first task says it could not serve."""
import os
import tempfile
import threading

import pytest

from fluidctl import envs, paths
from fluidctl.node import worker
from fluidctl.runtime import nodejoin
from fluidctl.runtime.collective import bootstrap
from fluidctl.runtime.store import StoreServer

TOKEN = "node-join-token"


@pytest.fixture
def private_tmp(monkeypatch):
    """A short temp root of its own (a Unix socket's path stops at 108 bytes)."""
    import shutil
    from pathlib import Path
    root = tempfile.mkdtemp(prefix="fj", dir="/tmp")
    monkeypatch.setattr(tempfile, "tempdir", root)
    yield Path(root)
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def store():
    srv = StoreServer("127.0.0.1", 0, TOKEN)
    yield srv
    srv.close()


def test_the_socket_is_named_alike_by_every_task_in_a_private_directory(private_tmp):
    a, b = paths.node_join_socket("77.0.0.node/1"), paths.node_join_socket("77.0.0.node/1")
    assert a == b == str(private_tmp / f"fluidctl-join-{os.geteuid()}" / "77.0.0.node_1")
    assert os.stat(os.path.dirname(a)).st_mode & 0o777 == 0o700


def test_a_directory_others_may_enter_is_not_used(private_tmp):
    where = private_tmp / f"fluidctl-join-{os.geteuid()}"
    where.mkdir(mode=0o755)
    where.chmod(0o755)
    assert paths.node_join_socket("77.0.0.n1") == ""


def contract(world=4):
    return {envs.JOB_TOKEN: TOKEN, envs.TRAINERS_NUM: str(world)}


def test_a_task_that_comes_before_its_nodes_first_task_waits_for_it(private_tmp, store):
    """Ranks 2 and 3 of a node: rank 3's task asks before rank 2's task serves; both get the
    node's view from one join (the store's request count says so)."""
    master = f"127.0.0.1:{store.port}"
    c = {**contract(), envs.MASTER: master}
    views, errors = {}, []

    def rank(r):
        try:
            env = {**c, **worker.node_join_env(c, [2, 3], r == 2, "9.0.0.n2")}
            dist = envs.read({**env, envs.TRAINER_ID: str(r)})
            if dist.node_join_ranks:
                bootstrap._serve_node_join(dist)
            views[r] = nodejoin.join(dist.node_join, {"rank": r, "ep": f"10.0.0.2:{r}",
                                                      "node": "n2", "pid": os.getpid()}, 10)
        except Exception as exc:           # noqa: BLE001 - reported below
            errors.append(exc)
    late = threading.Thread(target=rank, args=(3,))
    late.start()
    # the store waits for the whole world (4): the other node joins for ranks 0 and 1
    other = threading.Thread(target=lambda: StoreClientJoin(master, [0, 1]))
    other.start()
    rank(2)
    late.join(20)
    other.join(20)
    assert not errors, errors
    assert sorted(views) == [2, 3]
    assert [r for r, _, _ in views[3]["local"]] == [2, 3]
    assert store.requests.get("join") == 2


def StoreClientJoin(master, ranks):  # noqa: N802 - reads as what it does
    from fluidctl.runtime.store import StoreClient
    client = StoreClient(master, TOKEN, 10, rank=ranks[0])
    try:
        client.join(nodejoin.LAYOUT_GROUP, 4, [{"rank": r, "ep": f"10.0.0.1:{r}", "node": "n1",
                                                "pid": 1} for r in ranks], 10)
    finally:
        client.close()


def test_when_the_first_task_cannot_serve_the_others_join_the_store_themselves(private_tmp):
    path = paths.node_join_socket("9.0.0.n3")
    os.makedirs(path)                   # something already has the name: bind fails
    c = {**contract(), envs.MASTER: "127.0.0.1:1"}
    env = {**c, **worker.node_join_env(c, [0, 1], True, "9.0.0.n3"), envs.TRAINER_ID: "0"}
    assert env[envs.NODE_JOIN_RANKS] == "0,1"
    bootstrap._serve_node_join(envs.read(env))
    assert os.path.exists(nodejoin.off_marker(path))
    with pytest.raises(nodejoin.NotServed):
        nodejoin.join(path, {"rank": 1}, 5)


@pytest.mark.parametrize("changed", [{envs.JOB_TOKEN: ""}, {envs.TRAINERS_NUM: "1"},
                                     {envs.PSERVERS_IP_PORT_LIST: "10.0.0.1:7164"}])
def test_no_node_join_without_a_token_for_one_rank_or_in_pserver_mode(private_tmp, changed):
    c = {**contract(), envs.MASTER: "127.0.0.1:1", **changed}
    assert worker.node_join_env(c, [0, 1], True, "9.0.0.n4") == {}
    assert not os.path.exists(os.path.join(str(private_tmp), f"fluidctl-join-{os.geteuid()}",
                                           "9.0.0.n4"))


def test_pointing_the_tasks_at_the_socket_imports_nothing_of_the_runtime(private_tmp):
    """Every rank of a big job pays the worker's start-up: naming the node's socket must not
    import fluidctl.runtime (a torch script never uses it; its init() serves the join)."""
    import subprocess
    import sys
    code = ("import sys, tempfile; tempfile.tempdir = sys.argv[1]\n"
            "from fluidctl import envs\nfrom fluidctl.node import worker\n"
            "c = {envs.JOB_TOKEN: 't', envs.TRAINERS_NUM: '4', envs.MASTER: '127.0.0.1:1'}\n"
            "assert worker.node_join_env(c, [0, 1], True, '9.0.0.n5')\n"
            "print(sorted(m for m in sys.modules if m.startswith('fluidctl.runtime')))")
    out = subprocess.run([sys.executable, "-c", code, str(private_tmp)], capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"
