"""The same-node waiter (shmwait.py) on a real shared segment, native and ctypes: a post wakes a
sleeping waiter at once (not at its slice's end), an abort wakes it, the deadline names the late
rank, and a dead peer is found while waiting."""
import os
import subprocess
import threading
import time

import pytest

from fluidctl.runtime.collective import shm, shmwait
from fluidctl.runtime.collective.meta import CollectiveError

BUILT = shmwait.native() is not None
KINDS = [pytest.param("1", marks=pytest.mark.skipif(not BUILT, reason="native module not built")),
         "0"]


@pytest.fixture(params=KINDS, ids=["native", "ctypes"])
def pair(request, monkeypatch):
    """Two members of one node's group in this process (rank 0 waits, rank 1 posts)."""
    monkeypatch.setenv("FLUIDCTL_SHM_NATIVE", request.param)
    path = shm.ShmGroup.new_path("test")
    a = shm.ShmGroup([0, 1], 0, 2, path, True, timeout=0.8, chunk=1 << 16)
    b = shm.ShmGroup([0, 1], 1, 2, path, False, timeout=0.8, chunk=1 << 16)
    os.unlink(path)
    assert (a._native is not None) is (request.param == "1")
    yield a, b
    a.close()
    b.close()


def later(seconds, fn):
    t = threading.Timer(seconds, fn)
    t.start()
    return t


def test_a_post_wakes_the_sleeper_at_once(pair):
    a, b = pair
    t = later(0.3, lambda: b._post(shm.IN, 1))
    began = time.perf_counter()
    status = a._waiter.wait(shm.IN, 1, 5.0)        # a slice far longer than the post's delay
    waited = time.perf_counter() - began
    t.join()
    assert status == shmwait.REACHED
    assert 0.25 < waited < 2.0, waited


def voluntary_switches(tid: int) -> int:
    with open(f"/proc/self/task/{tid}/status") as f:
        return int(next(line for line in f if line.startswith("voluntary_ctxt_switches"))
                   .split()[1])


def test_a_native_waiter_sleeps_until_the_post(pair):
    """Asleep on the futex for the whole second, not polling: a couple of voluntary context
    switches (a waiter that looked again every 20 ms would make about 50)."""
    a, b = pair
    if a._native is None:
        pytest.skip("the ctypes waiter looks again every 2 ms by design")
    got = {}

    def waiter():
        tid = threading.get_native_id()
        before = voluntary_switches(tid)
        got["status"] = a._waiter.wait(shm.IN, 1, 10.0)
        got["switches"] = voluntary_switches(tid) - before
    t = threading.Thread(target=waiter)
    t.start()
    time.sleep(1.0)               # the waiter has nothing to wait on but the post below
    b._post(shm.IN, 1)
    t.join(5)
    assert got["status"] == shmwait.REACHED
    assert got["switches"] < 20, got


def test_a_wait_returns_at_its_slice_without_a_post(pair):
    a, _ = pair
    began = time.perf_counter()
    assert a._waiter.wait(shm.IN, 1, 0.2) == shmwait.SLOW
    assert 0.15 < time.perf_counter() - began < 2.0


def test_an_abort_wakes_the_sleeper(pair):
    a, b = pair

    def abort():
        with pytest.raises(CollectiveError):
            b.abort("rank 1 gave up: boom")
    t = later(0.3, abort)
    began = time.perf_counter()
    with pytest.raises(CollectiveError, match="rank 1 gave up: boom"):
        a._wait(shm.RED, 1)
    t.join()
    assert time.perf_counter() - began < 0.6       # well before a's 0.8 s deadline


def test_the_deadline_names_the_late_rank(pair):
    a, _ = pair
    began = time.perf_counter()
    with pytest.raises(CollectiveError, match=r"rank 1 did not reach the collective within 0.8s"):
        a._wait(shm.OUT, 1)
    assert 0.75 < time.perf_counter() - began < 3.0


def test_a_dead_peer_is_found_while_waiting(pair):
    a, b = pair
    gone = subprocess.Popen(["true"])
    gone.wait()
    a._pids[1] = gone.pid                           # rank 1 is now a process that exited
    with pytest.raises(CollectiveError, match=rf"rank 1 \(pid {gone.pid}, same node\) died"):
        a._wait(shm.IN, 1)
    assert a.broken and b._abort[0] == 1            # and the others are told
