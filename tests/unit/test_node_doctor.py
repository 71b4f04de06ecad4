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
