"""What a training script imports: ``ctx = fluidctl.runtime.init()``.

``init`` reads the environment the launcher wrote (``fluidctl.envs.read``: PADDLE_*, or OMPI_*
under mpirun), meets the other ranks at rank 0's rendezvous store and builds the collective
transports (see ``collective``). With no distributed environment it returns a world of one, so
one script serves one process and many. In parameter-server mode it only describes the process;
``DistributedOptimizer`` then talks to the parameter servers.

Kept light on purpose: numpy and the standard library only; mpi4py and cupy are imported when
used, and ``optim``/``DistributedOptimizer``/``CollectiveError`` (with the collectives and numpy)
load on first access.
"""
from __future__ import annotations

import os
import sys
from typing import Optional

from fluidctl import envs
from fluidctl.diagnostics import progress, stragglers

__all__ = ["init", "finalize", "Context", "CollectiveError", "DistributedOptimizer",
           "DistributeStrategy", "optim", "get_context"]

_ctx: Optional["Context"] = None


class Context:
    """This process's place in the job, and the collectives between trainers."""

    def __init__(self, env: envs.DistEnv, timeout: float):
        self.env = env
        self.timeout = timeout
        self.rank, self.world_size = env.rank, env.world_size
        self.local_rank, self.local_size, self.nnodes = env.local_rank, env.local_size, env.nnodes
        self.role, self.mode = env.role, env.mode
        self.device = "cpu"
        self.device_id: Optional[int] = None     # the CUDA device (index) of a GPU rank
        import numpy
        self.xp = numpy
        self.store = None
        self.comm = None
        self._server = None
        self._requests = None

    def __repr__(self) -> str:
        return (f"Context(rank={self.rank}, world_size={self.world_size}, mode={self.mode!r}, "
                f"role={self.role!r}, device={self.device!r}, transport={self.transport!r})")

    @property
    def transport(self) -> str:
        return self.comm.transport if self.comm is not None else "none"

    def _need_comm(self):
        if self.comm is None:
            from fluidctl.runtime.collective.meta import CollectiveError
            raise CollectiveError(
                f"collectives are not available in {self.mode} mode (role {self.role}); use "
                "DistributedOptimizer, or start the job with --mode collective")
        return self.comm

    def _collective(self, name: str, *args):
        """One collective, counted for the hang watchdog and timed for the straggler report."""
        began = stragglers.clock()
        comm = self._need_comm()
        out = getattr(comm, name)(*args)
        if comm.nccl is None or not args or not _on_gpu(args[0]):
            progress.bump()           # GPU work is counted when it completes (gpuwork.py)
        stragglers.record(began)
        return out

    def allreduce(self, x, op: str = "sum"):
        """In place on a numpy/cupy array; returns x. ops: sum, mean, max, min."""
        return self._collective("allreduce", x, op)

    def reduce(self, x, root: int = 0, op: str = "sum"):
        return self._collective("reduce", x, root, op)

    def broadcast(self, x, root: int = 0):
        """In place: every rank's x becomes root's."""
        return self._collective("broadcast", x, root)

    def allgather(self, x):
        """A new array of shape (world_size, *x.shape), row r from rank r."""
        return self._collective("allgather", x)

    def reduce_scatter(self, x, op: str = "sum"):
        """This rank's 1/world_size part (along axis 0) of the reduction of x."""
        return self._collective("reduce_scatter", x, op)

    def barrier(self) -> None:
        self._collective("barrier")

    def synchronize(self) -> None:
        """Wait for this rank's queued GPU collectives and compare the calls with the other
        ranks; raises the CollectiveError of a collective that failed. A collective call:
        every rank makes it. GPU collectives return once queued on the current stream (the
        stream orders the work; this is the host's wait)."""
        self._collective("synchronize")

    def coalesced(self):
        """``with ctx.coalesced():`` the GPU collectives inside run as one NCCL group with
        one completion event (a no-op on CPU)."""
        return self._need_comm().coalesced()

    # --- checkpoint requests (runtime/request.py) --------------------------------------------
    def _request_state(self):
        if self._requests is None:
            from fluidctl.runtime.request import Requests
            self._requests = Requests(self.comm, self.world_size)
        return self._requests

    def checkpoint_requested(self) -> bool:
        """True on every rank at the same call when a checkpoint was requested (SIGTERM,
        SIGUSR1, Slurm's warning signal, a near time limit, ``fluidctl job checkpoint``).
        Call it once per step on every rank: it is an agreement (a tiny allreduce now and
        then, about every 50 ms), one integer comparison otherwise.
        ``checkpoint_stop`` then says whether the job should end after saving."""
        requests = self._requests or self._request_state()
        if requests.poll():
            if self.comm is not None:
                self.comm.verify()     # the GPU calls' hash, before anything is saved
            return True
        return False

    @property
    def checkpoint_stop(self) -> bool:
        """The last agreed request asks the job to end after the checkpoint (to be requeued
        and resumed), not to go on."""
        from fluidctl.runtime.request import STOP
        return self._requests is not None and self._requests.kind == STOP

    def close(self, wait: bool = True) -> None:
        """Release transports; with ``wait``, first meet the other ranks so that rank 0 does not
        take the store away from a rank that still needs it."""
        error = None
        nccl = self.comm.nccl if self.comm is not None else None
        if nccl is not None and nccl.work.fault is not None:
            from fluidctl.runtime.collective.meta import CollectiveError
            error = CollectiveError(nccl.work.fault)      # the sticky fault, as every call
        elif nccl is not None and not _broken(self.comm):
            try:
                self.comm.synchronize()       # the queued GPU work, and the calls' hash
            except Exception as exc:          # raised below, once everything is released
                error = exc
        if wait and self.store is not None and self.comm is not None and not _broken(self.comm):
            try:
                self.store.barrier("finalize", self.world_size, min(self.timeout, 60.0))
            except (OSError, TimeoutError) as exc:
                print(f"fluidctl: rank {self.rank}: finalize: {exc}", file=sys.stderr)
        for part in (self.comm, self.store):
            if part is not None:
                part.close()
        if self._server is not None:
            # rank 0: let the others read their last answers (or their own error) first
            self._server.wait_idle(min(self.timeout, 10.0))
            self._server.close()
        self.comm = self.store = self._server = None
        if error is not None:
            raise error


def _linger(ctx: "Context") -> None:
    """Rank 0 leaving without finalize() (an uncaught error, sys.exit): its store is the
    job's, so keep serving, briefly, until the other ranks have read what they need (the
    job's first error, which makes every rank's message the same) and disconnected."""
    server = ctx._server
    if server is None:
        return
    if ctx.store is not None:
        ctx.store.close()
        ctx.store = None
    server.wait_idle(LINGER)
    server.close()
    ctx._server = None


LINGER = 3.0         # seconds rank 0's store outlives a script that did not finalize, at most


def _on_gpu(x) -> bool:
    global _is_cupy
    if _is_cupy is None:
        from fluidctl.runtime.collective import _is_cupy
    return _is_cupy(x)


_is_cupy = None           # collective._is_cupy, once the collectives are loaded


def _broken(comm) -> bool:
    return comm.broken or bool(comm.nccl is not None and comm.nccl.broken)


def init(timeout: Optional[float] = None, transport: str = "auto",
         environ=None) -> Context:
    """Join the job (idempotent: later calls return the same Context).

    ``timeout`` (seconds; default FLUIDCTL_TIMEOUT or 300) bounds the rendezvous and every
    collective. ``transport`` forces 'shm', 'ring', 'hierarchical' or 'mpi' instead of the
    automatic choice ('ring' treats every rank as its own node: useful for tests and benches).
    """
    global _ctx
    if _ctx is not None:
        return _ctx
    env = envs.read(environ)
    progress.start(env.rank, environ)     # the launcher's hang watchdog and stack dumps
    stragglers.start(env.rank, environ)   # the launcher's straggler report
    ctx = Context(env, float(timeout) if timeout is not None else env.timeout)
    if env.mode != "pserver":
        from fluidctl.runtime.collective import Communicator
        if env.world_size > 1:
            from fluidctl.runtime.collective import bootstrap
            from fluidctl.runtime.usersecret import SecretUnavailable
            from fluidctl.runtime.collective import torchrun
            if torchrun.started_by_torchrun(os.environ if environ is None else environ):
                ctx.env = env = torchrun.adopt(env, os.environ if environ is None else environ,
                                               ctx.timeout)
            try:
                ctx.env = env = bootstrap.with_token(env, environ)
            except SecretUnavailable as exc:       # one line on every rank, no traceback
                what, how = exc.args
                print(f"error: rank {env.rank}: no {envs.JOB_TOKEN} and no user secret: "
                      f"{what} ({how})", file=sys.stderr, flush=True)
                raise SystemExit(2) from None
            ctx._server, ctx.store, _ = bootstrap.connect_store(env, ctx.timeout)
            if ctx._server is not None:
                import atexit
                atexit.register(_linger, ctx)
            try:
                ctx.comm = bootstrap.build(env, ctx.store, ctx.timeout, transport,
                                            os.environ if environ is None else None)
            except BaseException:
                ctx.close(wait=False)
                raise
        else:
            ctx.comm = Communicator(0, 1)
        if ctx.comm.ring is not None:
            stragglers.set_peer(ctx.comm.ring.prev_rank)
        try:
            _select_device(ctx)
        except BaseException:
            ctx.close(wait=False)
            raise
    elif env.role == envs.ROLE_TRAINER and env.selected_gpu is not None:
        _use_device(ctx)               # pserver trainers: their own GPU, no NCCL between them
    if (os.environ if environ is None else environ).get(envs.CHECKPOINT_REQUEST):
        # Slurm's scancel --signal=USR1 reaches the ranks themselves: a request, not death
        import signal
        ctx._request_state().install([signal.SIGUSR1])
    _ctx = ctx
    return ctx


def _select_device(ctx: Context) -> None:
    """GPU ranks (FLAGS_selected_gpus set, NCCL backend): CuPy on that device and an NCCL
    communicator, or the same clear error on every rank (see collective/nccl.py)."""
    env = ctx.env
    if env.selected_gpu is None or env.backend != "nccl":
        return
    from fluidctl.runtime.collective import nccl
    transport = nccl.setup(ctx, env.selected_gpu)
    if transport is None:
        print(f"fluidctl: rank {ctx.rank}: {envs.SELECTED_GPUS}={env.selected_gpu} but CuPy is "
              "not installed on any rank; running on CPU (pip install 'fluidctl[gpu]')",
              file=sys.stderr)
        return
    ctx.device, ctx.device_id, ctx.xp = f"gpu:{env.selected_gpu}", env.selected_gpu, \
        transport.cupy
    ctx.comm.nccl = transport


def _use_device(ctx: Context) -> None:
    """A GPU for a rank that needs no communicator (a pserver-mode trainer)."""
    gpu = ctx.env.selected_gpu
    try:
        import cupy
    except ImportError:
        print(f"fluidctl: rank {ctx.rank}: {envs.SELECTED_GPUS}={gpu} but CuPy is not "
              "installed; running on CPU (pip install 'fluidctl[gpu]')", file=sys.stderr)
        return
    try:
        cupy.cuda.Device(gpu).use()
    except Exception as exc:
        from fluidctl.runtime.collective.meta import CollectiveError
        raise CollectiveError(f"rank {ctx.rank}: cannot use GPU {gpu} ({exc})") from None
    ctx.device, ctx.device_id, ctx.xp = f"gpu:{gpu}", gpu, cupy


def get_context() -> Optional[Context]:
    return _ctx


def finalize() -> None:
    """Leave the job: meet the other ranks, then release the store and shared memory."""
    global _ctx
    ctx, _ctx = _ctx, None
    if ctx is not None:
        ctx.close()


def __getattr__(name):
    # loaded on first access: fluidctl.runtime.data (imported by shard-data's command, whose
    # start-up is most of a small run) must not pay for numpy through the collectives
    import importlib
    if name == "CollectiveError":
        from fluidctl.runtime.collective.meta import CollectiveError
        return CollectiveError
    if name == "optim":
        return importlib.import_module("fluidctl.runtime.optim")
    if name in ("DistributedOptimizer", "DistributeStrategy"):
        return getattr(importlib.import_module("fluidctl.runtime.distributed_optimizer"), name)
    raise AttributeError(f"module 'fluidctl.runtime' has no attribute {name!r}")
