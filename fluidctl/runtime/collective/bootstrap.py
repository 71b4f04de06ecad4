"""Start-up of a collective job: rendezvous, node layout, transports.

1. Rank 0 serves the store at PADDLE_MASTER (under bare mpirun: on a port it picks and
   broadcasts with mpi4py); every rank connects.
2. Each rank joins with its endpoint, node and pid (one request); the store lays the world out
   once and answers each rank with its node's share: its node's ranks, the node count, the ring
   neighbours between nodes. No rank reads N records (the error names the ranks, and their
   endpoints, that never showed up).
3. Ranks are grouped by node: the host of their endpoint (so 127.0.0.1 and 127.0.0.2 are two
   "nodes" on one machine, which is how the ring and hierarchical paths are tested), or the
   hostname when no endpoints were given.
4. One node: shared memory. One rank per node: ring. Otherwise hierarchical (shared memory in
   each node, ring between the lowest ranks of each node).
"""
from __future__ import annotations

import os
import socket
from typing import Optional

from fluidctl import envs
from fluidctl.runtime.collective import Communicator, CollectiveError
from fluidctl.runtime import nodejoin
from fluidctl.runtime.nodejoin import LAYOUT_GROUP      # one group name for both join paths
from fluidctl.runtime.rendezvous import NodeView
from fluidctl.runtime.store import StoreClient, StoreServer, StoreTimeout

TRANSPORTS = ("auto", "shm", "ring", "hierarchical", "mpi")


def _mpi_master(env: envs.DistEnv) -> str:
    """Under bare mpirun: rank 0 binds a free port for the store and tells everyone."""
    from mpi4py import MPI
    comm = MPI.COMM_WORLD
    endpoint = None
    if comm.Get_rank() == 0:
        host = socket.gethostbyname(socket.gethostname())
        with socket.socket() as probe:
            probe.bind(("", 0))
            endpoint = f"{host}:{probe.getsockname()[1]}"
    return comm.bcast(endpoint, root=0)


def with_token(env: envs.DistEnv, environ=None) -> envs.DistEnv:
    """``env`` with a job token: no fluidctl server runs without one. fluidctl train always
    sets FLUIDCTL_JOB_TOKEN; under a bare mpirun rank 0 makes one and MPI (a channel the job
    already trusts) hands it to every rank; in a plain srun step every task derives the same
    one from the user's secret file and the job and step ids (runtime/usersecret.py); otherwise
    it is an error."""
    if env.token or env.world_size <= 1:
        return env
    environ = os.environ if environ is None else environ
    if env.under_mpi and _has_mpi4py():
        from mpi4py import MPI
        import secrets
        comm = MPI.COMM_WORLD
        token = comm.bcast(secrets.token_hex(16) if comm.Get_rank() == 0 else None, root=0)
        return env._replace(token=token)
    if envs.in_slurm_step(environ):
        from fluidctl.runtime import usersecret
        return env._replace(token=usersecret.slurm_step_token(environ))
    raise CollectiveError(f"rank {env.rank}: no {envs.JOB_TOKEN} in the environment: the "
                          "rendezvous store and the ring never serve without one (start the "
                          f"job with fluidctl train, or export the same {envs.JOB_TOKEN} to "
                          "every rank)")


def connect_store(env: envs.DistEnv, timeout: float):
    """(server or None, client, master endpoint)."""
    master = env.master
    if not master and env.under_mpi:
        master = _mpi_master(env)
    if not master:
        raise CollectiveError(
            f"rank {env.rank}: no rendezvous address: set {envs.MASTER} (or MASTER_ADDR and "
            f"MASTER_PORT) to a free host:port of rank 0, or start the job with fluidctl train")
    server = None
    if env.rank == 0:
        host, port = envs.split_endpoint(master)
        try:
            server = StoreServer(host, port, env.token, members=env.world_size)
        except OSError as exc:
            raise CollectiveError(f"rank 0 cannot serve the rendezvous store on {master} "
                                  f"({exc.strerror}; pick a free port for {envs.MASTER})") from None
    client = StoreClient(master, env.token, timeout, rank=env.rank)
    return server, client, master


TORCH_PORT_KEY = "torch/master_port"


def _free_port() -> int:
    """A port free on every address of this host (torch's TCPStore binds all of them), below
    the ephemeral range (fluidctl/net.py)."""
    from fluidctl.net import free_port
    return free_port("")


def join_layout(store: StoreClient, world: int, rank: int, timeout: float,
                record: Optional[dict] = None) -> NodeView:
    """This rank's node view (``record`` on the first call; later calls read it again)."""
    return NodeView(store.join(LAYOUT_GROUP, world, [record or {"rank": rank}], timeout,
                               read=record is None)[0])


def _publish(env, store: StoreClient, endpoint: str, node: str, timeout: float,
             environ=None) -> NodeView:
    """Join with this rank's endpoint, node and pid; get back its node's view. Rank 0 also
    publishes a free port for torch.distributed (see ``envs.torch_port_taken``), which every
    rank whose MASTER_PORT is the store's own puts into its environment before a script's
    ``dist.init_process_group`` reads it."""
    if env.rank == 0:
        store.set(TORCH_PORT_KEY, str(_free_port()).encode())
    handover = environ is not None and envs.torch_port_taken(environ, env.master)
    record = {"rank": env.rank, "ep": endpoint, "node": node, "pid": os.getpid()}
    try:
        view = None
        if env.node_join and env.node_join_ranks:     # srun: this task serves its node's join
            _serve_node_join(env)
        if env.node_join:                    # through the node's agent: one join per node
            try:
                view = NodeView(nodejoin.join(env.node_join, record, timeout))
            except nodejoin.NotServed:
                pass                          # the node's first task could not serve it
        if view is None:
            view = join_layout(store, env.world_size, env.rank, timeout, record)
        if handover:
            environ[envs.TORCH_MASTER_PORT] = store.get(TORCH_PORT_KEY, timeout).decode()
    except (StoreTimeout, nodejoin.NodeJoinError) as exc:
        if not exc.missing:
            raise CollectiveError(str(exc)) from None
        ranks = [int(k) for k in exc.missing]
        where = [f"rank {r}" + (f" ({env.endpoint_of(r)})" if env.endpoint_of(r) else "")
                 for r in ranks]
        more = exc.total - len(ranks)
        raise CollectiveError(f"rank {env.rank}: {', '.join(where)}"
                              f"{f' and {more} more' if more > 0 else ''} did not join within "
                              f"{timeout:g}s (not started, crashed, or a different "
                              f"{envs.MASTER}? check its log)") from None
    return view


def _serve_node_join(env: envs.DistEnv) -> None:
    """Serve the node's join (the node's first task under srun), or, when the socket cannot
    be had, leave the marker that sends the node's ranks to the store themselves."""
    try:
        nodejoin.NodeJoiner(env.node_join, env.node_join_ranks, env.world_size, env.master,
                            env.token, env.timeout)
    except OSError:
        try:
            open(nodejoin.off_marker(env.node_join), "w").close()
        except OSError:
            pass


def build(env: envs.DistEnv, store: StoreClient, timeout: float, transport: str = "auto",
          environ=None) -> Communicator:
    """``environ``: the mapping MASTER_PORT is handed over in for torch (os.environ when the
    script's own environment was read; None leaves it alone)."""
    if transport not in TRANSPORTS:
        raise ValueError(f"transport must be one of {', '.join(TRANSPORTS)}, got {transport!r}")
    rank, world = env.rank, env.world_size
    if transport == "mpi" or (transport == "auto" and env.under_mpi and not env.planned_endpoints
                              and _has_mpi4py()):
        from fluidctl.runtime.collective.mpi import MpiTransport
        store.barrier("ready", world, timeout)
        return Communicator(rank, world, mpi=MpiTransport())
    listener, endpoint = _listen_own(env, store, _may_lead_a_ring(env, transport))
    node = envs.split_endpoint(endpoint)[0] if env.planned_endpoints else socket.gethostname()
    if transport == "ring":
        node = f"{node}#{rank}"          # pretend every rank is a node of its own
    try:
        layout = _publish(env, store, endpoint, node, timeout, environ)
        local = layout.local
        if transport == "shm" and layout.n_nodes > 1:
            raise CollectiveError(f"transport 'shm' needs every rank on one node, but ranks are "
                                  f"on {layout.n_nodes} nodes")
        shm = ring = None
        if layout.n_nodes == 1 or transport == "hierarchical" or layout.max_local > 1:
            shm = _open_shm(env, store, layout, timeout)
        if layout.n_nodes > 1 and rank == layout.leader:
            from fluidctl.runtime.collective.ring import Ring
            members, index = layout.ring_members()
            ring = Ring(members, index, listener, env.token, timeout, store)
            listener = None
    finally:
        if listener is not None:
            listener.close()
    store.barrier("ready", world, timeout)
    return Communicator(rank, world, shm=shm, ring=ring, local_ranks=local,
                        strict=envs.strict_collectives(os.environ))


def _has_mpi4py() -> bool:
    try:
        import mpi4py  # noqa: F401
        return True
    except ImportError:
        return False


def _may_lead_a_ring(env, transport: str) -> bool:
    """Whether this rank may need its endpoint port: the lowest rank of its node in a
    multi-node job (known up front from the endpoint list when there is one, or from this
    node's endpoints file when the list was too long for the environment)."""
    if transport == "ring" or not env.planned_endpoints:
        return True
    if not env.trainer_endpoints:
        return env.nnodes > 1 and env.rank == min(env.node_endpoints)
    hosts = [envs.split_endpoint(e)[0] for e in env.trainer_endpoints]
    leaders = [hosts.index(h) for h in dict.fromkeys(hosts)]
    return len(leaders) > 1 and env.rank in leaders


def _listen_own(env, store: StoreClient, needed: bool):
    """Bind this rank's endpoint now, so that peers' connection attempts find it (only when
    this rank may lead a ring: the port stays free for the script otherwise)."""
    from fluidctl.runtime.collective.ring import listen
    endpoint = env.current_endpoint
    if not needed and endpoint:
        return None, endpoint
    if not endpoint:              # torch-style env: pick a port on the address rank 0 sees
        endpoint = f"{store._sock.getsockname()[0]}:0"
    try:
        listener = listen(endpoint)
    except OSError as exc:
        raise CollectiveError(f"rank {env.rank} cannot listen on its endpoint {endpoint} "
                              f"({exc.strerror}; each rank's {envs.CURRENT_ENDPOINT} port must "
                              "be free)") from None
    host = envs.split_endpoint(endpoint)[0]
    return listener, f"{host}:{listener.getsockname()[1]}"


def _open_shm(env, store: StoreClient, layout: NodeView, timeout: float):
    """Leader creates, all map, a store barrier among the node's ranks, then all unlink."""
    from fluidctl.runtime.collective.shm import ShmGroup
    rank, local = env.rank, layout.local
    node_id = layout.node_index
    key = f"shm/{node_id}"
    path: Optional[str] = None
    try:
        if rank == local[0]:
            path = ShmGroup.new_path(f"n{node_id}")
            group = ShmGroup(local, 0, env.world_size, path, True, timeout)
            store.set(key, path.encode())
        else:
            path = store.get(key, timeout).decode()
            group = ShmGroup(local, local.index(rank), env.world_size, path, False, timeout)
        store.barrier(f"shm-attached/{node_id}", local, timeout,
                      describe=lambda r: f"rank {r} (pid {layout.pids[r]}, same node)")
        return group
    except StoreTimeout as exc:
        raise CollectiveError(str(exc)) from None
    finally:
        if path is not None:
            try:
                os.unlink(path)
            except FileNotFoundError:
                pass
