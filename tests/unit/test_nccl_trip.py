"""The job's first GPU error (NcclTransport.trip) over a real store: every thread of every rank
raises the same words, however the trips interleave."""
import threading
import time

from fluidctl.runtime.collective.gpuwork import InFlight
from fluidctl.runtime.collective.nccl import NcclTransport
from fluidctl.runtime.store import StoreClient, StoreServer

TOKEN = "trip-test-token"


class SlowSet:
    """A store client whose ``set`` reaches the server 50 ms late (a loaded machine): another
    thread's request gets in between a rank's ``add`` and its ``set``."""

    def __init__(self, client):
        self.client = client

    def set(self, key, value):
        time.sleep(0.05)
        self.client.set(key, value)

    def __getattr__(self, name):
        return getattr(self.client, name)


def transport(store, rank):
    """A transport with no communicator yet: what trip needs and nothing more."""
    t = NcclTransport.__new__(NcclTransport)
    t.store, t.rank, t.comm, t.broken, t._peers = store, rank, None, False, []
    t._tripping = threading.Lock()
    t.work = InFlight(t)
    return t


def test_the_caller_and_the_watchdog_tripping_at_once_raise_one_error_on_every_rank():
    """Rank 0's caller and watchdog and rank 2's caller see one death together (a 3-rank run
    of test_runtime_gpu's killed rank gave rank 0 the watchdog's words after a 5-s wait on the
    store, rank 2 the caller's): one error everywhere, with no wait on the store's timeout."""
    server = StoreServer("127.0.0.1", 0, TOKEN)
    try:
        endpoint = f"127.0.0.1:{server.port}"
        rank0 = transport(SlowSet(StoreClient(endpoint, TOKEN, 10.0, rank=0)), 0)
        rank2 = transport(SlowSet(StoreClient(endpoint, TOKEN, 10.0, rank=2)), 2)
        calls = [(rank0, "the GPU collectives in flight cannot finish"),
                 (rank0, "NCCL allreduce (collective #1) cannot finish"),
                 (rank2, "the GPU collectives in flight cannot finish")]
        start, got = threading.Barrier(len(calls)), {}

        def trip(i, t, message):
            start.wait()
            time.sleep((0, 0.01, 0.03)[i])  # rank 0's watchdog just after its caller's add,
            got[i] = t.trip(message)            # before that add's set; rank 2 after both
        began = time.monotonic()
        threads = [threading.Thread(target=trip, args=(i, *c)) for i, c in enumerate(calls)]
        for th in threads:
            th.start()
        for th in threads:
            th.join(20)
        took = time.monotonic() - began
        assert len(got) == 3 and len(set(got.values())) == 1, got
        assert got[0].endswith("(the communicator is aborted; restart the job)")
        assert rank0.broken and rank2.broken
        assert took < 2.0, took
    finally:
        server.close()


def test_a_broken_exchange_names_the_collective_in_flight_as_the_watchdog_does():
    """A same-node peer's death is seen by the rank's watchdog (the collective in flight cannot
    finish) or by its next metadata exchange, whichever comes first; both say the same words,
    so the job's error names the collective either way (a clean-clone run's exchange said
    only "the GPU collectives in flight cannot finish")."""
    from fluidctl.runtime.collective.gpuwork import DEAD_PEER, cannot_finish
    work = InFlight(transport=None)
    assert work.stuck() == DEAD_PEER                    # nothing of its own in flight
    work.items.extend([(None, 2, "allreduce"), (None, 3, "broadcast")])
    assert work.stuck() == cannot_finish("allreduce", 2) == \
        "NCCL allreduce (collective #2) cannot finish"
