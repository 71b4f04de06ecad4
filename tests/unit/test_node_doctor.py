"""Node 0's half of the rendezvous check lets every node of a large job through: it accepts
each test connection (a listener that never accepts lets only its backlog through)."""
import asyncio

from fluidctl.net import bind_socket, free_port
from fluidctl.node import doctor

NODES = 300                     # well past the old fixed backlog of 64


async def _connect_all(port: int, n: int, timeout: float):
    async def one(k: int):
        source = f"127.0.{1 + k // 250}.{1 + k % 250}"
        try:
            _, writer = await asyncio.wait_for(
                asyncio.open_connection("127.0.0.1", port, local_addr=(source, 0)), timeout)
        except (OSError, asyncio.TimeoutError) as exc:
            return exc
        writer.close()
        await writer.wait_closed()
        return None
    return await asyncio.gather(*(one(k) for k in range(n)))


def test_the_master_port_accepts_every_node_of_a_300_node_job_then_frees_the_port():
    port = free_port("127.0.0.1")
    problems, held = doctor.node_checks({"address": "127.0.0.1", "ports": [],
                                         "listen": ["127.0.0.1", port], "connect": None,
                                         "peers": NODES - 1})
    assert problems == [] and held is not None
    try:
        failures = [e for e in asyncio.run(_connect_all(port, NODES - 1,
                                                        doctor.CONNECT_TIMEOUT)) if e]
    finally:
        held.close()
    assert failures == [], f"{len(failures)} of {NODES - 1} nodes could not reach the master"
    again = bind_socket("127.0.0.1", port)      # rank 0 binds the master port next
    again.listen(8)
    again.close()


def test_an_old_request_without_peers_still_listens():
    port = free_port("127.0.0.1")
    problems, held = doctor.node_checks({"address": "127.0.0.1", "ports": [],
                                         "listen": ["127.0.0.1", port], "connect": None})
    assert problems == []
    held.close()
    assert doctor.listen_backlog(5000) > 5000


def test_a_node_asked_before_node_0_listens_tries_the_refused_port_again():
    """The launcher asks every node at once: node 0 may start listening a moment after another
    node first knocks. A refusal is tried again for ``refused_wait`` seconds; after that it is
    the answer."""
    import socket
    import threading
    port = free_port("127.0.0.1")
    listener = socket.socket()
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", port))
    late = threading.Timer(0.1, listener.listen, args=(8,))    # node 0, a little late
    late.start()
    try:
        problems, held = doctor.node_checks({"address": "127.0.0.1", "ports": [],
                                             "connect": ["127.0.0.1", port],
                                             "refused_wait": 30.0})
    finally:
        late.join()
        listener.close()
    assert problems == [] and held is None
    problems, _ = doctor.node_checks({"address": "127.0.0.1", "ports": [],
                                      "connect": ["127.0.0.1", port], "refused_wait": 0.05})
    assert problems == [f"cannot reach the master 127.0.0.1:{port} (Connection refused: open "
                        "the port between the nodes, or list node 0 under an address this node "
                        "can reach)"]


class _Agent:
    def __init__(self, reply):
        self.reply, self.asked = reply, []

    def doctor(self, request, timeout):
        self.asked.append(request)
        return self.reply


def test_the_launcher_asks_every_node_at_once_and_drops_what_node_0_explains():
    from types import SimpleNamespace
    from fluidctl.backends.ssh import doctor as launcher_doctor
    plan = SimpleNamespace(master="127.0.0.2:7000", job=SimpleNamespace(nodes=[
        SimpleNamespace(address="127.0.0.2"), SimpleNamespace(address="127.0.0.3")]),
        on_node=lambda i: [])
    hosts = [SimpleNamespace(name="n0"), SimpleNamespace(name="n1")]
    unreached = ("cannot reach the master 127.0.0.2:7000 (Connection refused: open the port "
                 "between the nodes, or list node 0 under an address this node can reach)")
    agents = [_Agent([]), _Agent([])]
    assert launcher_doctor.examine(plan, hosts, agents, 1.0) == []
    assert agents[1].asked[0]["refused_wait"] == launcher_doctor.REFUSED_WAIT > 0
    assert "refused_wait" not in agents[0].asked[0]
    # node 0's busy master port explains node 1's refusal: one line, the cause
    busy = "port 127.0.0.2:7000 (the master port) is in use (stop what holds it)"
    agents = [_Agent([busy]), _Agent([unreached, "port 127.0.0.3:7001 is in use"])]
    assert launcher_doctor.examine(plan, hosts, agents, 1.0) == [
        f"node n0: {busy}", "node n1: port 127.0.0.3:7001 is in use"]
    # node 0 fine: node 1's refusal is its own problem (a firewall between them)
    agents = [_Agent([]), _Agent([unreached])]
    assert launcher_doctor.examine(plan, hosts, agents, 1.0) == [f"node n1: {unreached}"]
