"""SSHNode.responsive: a keepalive unanswered for longer than ``keepalive`` seconds loses the
node, counted from when the ping really went out and only while this process was looking.
A launcher stopped or starved for longer than that (a loaded machine; seen with 100 nodes on
2 cores) does not blame the node for the silence it did not watch: it asks again."""
import threading

from fluidctl.remote import ssh


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


class SilentTransport:
    """A peer that never answers (a frozen node): the request waits forever."""
    def __init__(self):
        self.closed = False
        self.requests = 0
        self.block = threading.Event()

    def is_active(self):
        return not self.closed

    def global_request(self, kind, wait=True):
        self.requests += 1
        self.block.wait(5)

    def close(self):
        self.closed = True


class Client:
    def __init__(self, transport):
        self.transport = transport

    def get_transport(self):
        return self.transport


def node(monkeypatch, clock):
    monkeypatch.setattr(ssh.time, "monotonic", clock)
    n = ssh.SSHNode.__new__(ssh.SSHNode)
    n.keepalive = 1.0
    n.host = type("H", (), {"name": "node2"})()
    n._ping_lock = threading.Lock()
    n._pending_ping = None
    n._last_ping = n._last_look = clock()
    n.client = Client(SilentTransport())
    return n


def wait_sent(n):
    (sent,), _ = n._pending_ping
    for _ in range(500):
        if n._pending_ping[0][0] is not None:
            return
        threading.Event().wait(0.01)
    raise AssertionError("the ping thread never sent")


def test_a_silent_peer_is_lost_after_one_keepalive_while_watched(monkeypatch):
    clock = Clock()
    n = node(monkeypatch, clock)
    try:
        clock.now += 1.0
        assert n.responsive()                   # the first ping goes out
        wait_sent(n)
        for _ in range(2):                      # looked at every 0.5 s: silence counts
            clock.now += 0.5
            assert n.responsive()
        clock.now += 0.5
        assert not n.responsive() and n.client.transport.closed
    finally:
        n.client.transport.block.set()


def test_a_stopped_launcher_does_not_blame_the_node(monkeypatch):
    clock = Clock()
    n = node(monkeypatch, clock)
    try:
        clock.now += 1.0
        assert n.responsive()
        wait_sent(n)
        clock.now += 4.0                        # this process was not looking for 4 s
        assert n.responsive() and not n.client.transport.closed
        wait_sent(n)
        assert n.client.transport.requests == 2  # asked again
        for _ in range(2):
            clock.now += 0.5
            assert n.responsive()
        clock.now += 0.5                        # and now the silence was watched: lost
        assert not n.responsive()
    finally:
        n.client.transport.block.set()
