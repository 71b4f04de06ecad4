"""Processes on this machine: start, signal, sweep (the ``local`` backend and every node agent use it).

Each worker starts in its own session (so its whole tree can be signalled as a process group),
with stdout and stderr on one append-mode log file (interleaved as written, never blocked by a
slow console). fluidctl makes itself a child subreaper, so grandchildren whose parent died are
re-parented to it rather than to init: ``sweep_descendants`` can then stop and reap every last
one of them, and none is left behind.
"""
from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Dict, List, Mapping, Optional, Sequence

from fluidctl.procs import lifeline
from fluidctl.diagnostics.failures import Failure

if TYPE_CHECKING:
    import psutil
    from fluidctl.planning.plan import ProcSpec
    from fluidctl.runtime.nodejoin import NodeJoiner

PR_SET_CHILD_SUBREAPER = 36


def become_subreaper() -> bool:
    """Linux: orphaned descendants come to us instead of init (best effort elsewhere)."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


# psutil (slow to import) is loaded only to stop a tree or sweep leftovers: a clean run, whose
# workers all ended and were reaped, never needs it (see _has_children).

def _tree(pid: int) -> List[psutil.Process]:
    import psutil
    try:
        return psutil.Process(pid).children(recursive=True)
    except psutil.Error:
        return []


def _signal_procs(procs: List[psutil.Process], sig: int) -> None:
    import psutil
    for proc in procs:
        try:
            proc.send_signal(sig)
        except psutil.Error:
            pass


class _Same:
    """No second file: stderr goes with stdout."""

    def __enter__(self):
        return None

    def __exit__(self, *exc):
        return False


class LocalProcess:
    """A worker process and its tree (the Handle protocol of backends.base)."""

    def __init__(self, label: str, argv: List[str], env: Mapping[str, str], log: str,
                 host: str = "127.0.0.1", cwd: Optional[str] = None, service: bool = False,
                 pass_fds: Sequence[int] = (), stdin=subprocess.DEVNULL,
                 err_log: Optional[str] = None):
        """``err_log``: stderr to a file of its own (else with stdout in ``log``); ``stdin``:
        what the process reads (nothing by default; mpirun forwards ours to rank 0)."""
        self.label, self.host, self.log, self.service = label, host, log, service
        self.err_log = err_log
        self.rank: Optional[int] = None      # a trainer's global rank (for stack dumps)
        with open(log, "ab", buffering=0) as out, \
                (open(err_log, "ab", buffering=0) if err_log else _Same()) as err:
            # the child dies with this launcher (a pserver gets SIGTERM: it checkpoints)
            env = {k: v for k, v in env.items() if k != lifeline.MARKER}
            env.update(lifeline.marker_env(service))    # found by the watchdog, wherever
            run, preexec = lifeline.dying_with_us(
                argv, signal.SIGTERM if service else signal.SIGKILL, env, cwd)
            self.popen = subprocess.Popen(run, env=env, cwd=cwd, stdin=stdin,
                                          stdout=out, stderr=err if err_log else
                                          subprocess.STDOUT,
                                          start_new_session=True, close_fds=True,
                                          pass_fds=pass_fds, preexec_fn=preexec)
        self.pid = self.popen.pid
        lifeline.watch(self.pid, service)       # its session's group, grandchildren included
        try:
            self._pidfd: Optional[int] = os.pidfd_open(self.pid)
        except (AttributeError, OSError):
            self._pidfd = None

    def fileno(self) -> int:
        return self._pidfd if self._pidfd is not None else -1

    def poll(self) -> Optional[int]:
        return self.popen.poll()

    def _signal_tree(self, sig: int) -> None:
        descendants = _tree(self.pid)
        try:
            os.killpg(self.pid, sig)        # the session's group, grandchildren included
        except (ProcessLookupError, PermissionError):
            pass
        _signal_procs(descendants, sig)     # those that left the group (setsid / setpgid)

    def terminate(self) -> None:
        """SIGTERM, then SIGCONT (as systemd stops a unit): a stopped process would keep
        SIGTERM pending and sit out the whole grace period before SIGKILL."""
        self._signal_tree(signal.SIGTERM)
        self._signal_tree(signal.SIGCONT)

    def kill(self) -> None:
        self._signal_tree(signal.SIGKILL)

    def send_signal(self, sig: int) -> None:
        """``sig`` once to each process of the tree (a checkpoint request's signal: a second
        copy could reach a rank that already saved and is exiting, its handler gone)."""
        outside = []
        for proc in _tree(self.pid):
            try:
                if os.getpgid(proc.pid) != self.pid:
                    outside.append(proc)
            except OSError:
                pass
        try:
            os.killpg(self.pid, sig)        # the session's group, grandchildren included
        except (ProcessLookupError, PermissionError):
            pass
        _signal_procs(outside, sig)         # those that left the group (setsid / setpgid)

    def failure(self) -> Failure:
        return Failure(self.label, self.host, self.popen.returncode, self.log, self.pid)

    def close(self) -> None:
        if self._pidfd is not None:
            os.close(self._pidfd)
            self._pidfd = None


def start(label: str, argv: List[str], env: Mapping[str, str], log: str,
          host: str = "127.0.0.1", service: bool = False) -> LocalProcess:
    return LocalProcess(label, argv, env, log, host, service=service)


READY_TIMEOUT = 60.0          # how long trainers wait for their pservers to listen


def start_procs(procs: Sequence["ProcSpec"], attempt: int,
                logs: Optional[Sequence[str]] = None,
                extra_env: Optional[Mapping[str, str]] = None) -> List[LocalProcess]:
    """Start ``procs`` on this machine (attempt ``attempt``), each writing to its log (or to
    ``logs[i]``): pservers first, and trainers only once every pserver listens (each reports on
    a pipe, ``--ready-fd``), so no trainer meets a refused connection; a pserver that dies or
    takes longer than READY_TIMEOUT is left to the supervisor. If one cannot start, those
    already started are stopped and the error raised.
    ``extra_env`` (the node's diagnostics directory) is added beside the contract."""
    from fluidctl.diagnostics import inject
    from fluidctl.planning.plan import PSERVER, with_restart
    handles: List[Optional[LocalProcess]] = [None] * len(procs)
    waiting = {}                              # read end -> handle
    order = sorted(range(len(procs)), key=lambda i: procs[i].role != PSERVER)
    files = write_endpoints_files(procs, extra_env)
    files = join_through_this_node(procs, attempt, extra_env, files)
    try:
        for i in order:
            proc = procs[i]
            if proc.role != PSERVER and waiting:
                _wait_ready(waiting)
            log = logs[i] if logs else proc.log
            argv, fds = list(proc.argv), ()
            if proc.role == PSERVER and "fluidctl.runtime.pserver" in argv:
                read_fd, write_fd = os.pipe()
                argv += ["--ready-fd", str(write_fd)]
                fds = (write_fd,)
            env = full_env({**with_restart(proc.env, attempt), **(extra_env or {}),
                            **files.get(proc.node, {})})
            if proc.role != PSERVER:
                env = inject.rank_env(env)      # torch/Paddle scripts' straggler marks
            try:
                handles[i] = LocalProcess(proc.label, argv, env, log, proc.host,
                                          service=proc.role == PSERVER, pass_fds=fds)
            finally:
                for fd in fds:
                    os.close(fd)
            handles[i].rank = proc.rank if proc.role != PSERVER else None   # whose stack
            if fds:
                waiting[read_fd] = handles[i]
        if waiting:         # pservers alone (a pserver pod): return once they listen
            _wait_ready(waiting)
    except BaseException:
        for h in handles:
            if h is not None:
                h.kill()
                h.popen.wait()
                h.close()
        raise
    finally:
        for fd in waiting:
            os.close(fd)
    return [h for h in handles if h is not None]


def write_endpoints_files(procs: Sequence["ProcSpec"], extra_env: Optional[Mapping[str, str]]
                          ) -> Dict[int, Dict[str, str]]:
    """Where the world's endpoint list was too long for the ranks' environment (no
    PADDLE_TRAINER_ENDPOINTS in a multi-rank plan), each node's ranks' endpoints go into a
    file in the node's diagnostics directory: {node: {FLUIDCTL_ENDPOINTS_FILE: path}}."""
    from fluidctl import envs
    from fluidctl.paths import DiagDir, write_atomic
    from fluidctl.planning.plan import TRAINER
    root = (extra_env or {}).get(envs.DIAG_DIR)
    unlisted: Dict[int, Dict[int, str]] = {}
    for p in procs:
        if (p.role == TRAINER and p.endpoint and envs.TRAINER_ENDPOINTS not in p.env
                and p.env.get(envs.TRAINERS_NUM, "1") != "1"):
            unlisted.setdefault(p.node, {})[p.rank] = p.endpoint
    if not root or not unlisted:
        return {}
    files = {}
    for node, endpoints in unlisted.items():
        path = DiagDir(Path(root)).endpoints(node)
        write_atomic(path, envs.endpoints_file_text(endpoints))
        files[node] = {envs.ENDPOINTS_FILE: str(path)}
    return files


_joiners: Dict[str, "NodeJoiner"] = {}      # diagnostics directory -> its current attempt's


def join_through_this_node(procs: Sequence["ProcSpec"], attempt: int,
                           extra_env: Optional[Mapping[str, str]],
                           files: Dict[int, Dict[str, str]]) -> Dict[int, Dict[str, str]]:
    """The node agent as the unit of rendezvous (runtime/nodejoin.py): where this process
    starts a node's collective ranks with a diagnostics directory, it serves their join and
    sends the store one message for the node. ``files`` ({node: extra env}) gains
    FLUIDCTL_NODE_JOIN. The previous attempt's joiner, if still waiting, is closed."""
    from fluidctl import envs
    from fluidctl.paths import DiagDir
    from fluidctl.planning.plan import TRAINER
    from fluidctl.runtime import nodejoin
    root = (extra_env or {}).get(envs.DIAG_DIR)
    if not root:
        return files
    old = _joiners.pop(root, None)
    if old is not None:
        old.close()
    ranks = [p for p in procs if p.role == TRAINER and envs.PSERVERS_IP_PORT_LIST not in p.env
             and p.env.get(envs.TRAINERS_NUM, "1") != "1" and p.env.get(envs.MASTER)
             and p.env.get(envs.JOB_TOKEN)]
    path = str(DiagDir(Path(root)).join_socket(attempt))
    if not ranks or len({p.node for p in ranks}) != 1 or not nodejoin.usable(path):
        return files
    env = ranks[0].env
    try:
        _joiners[root] = nodejoin.NodeJoiner(
            path, [p.rank for p in ranks], int(env[envs.TRAINERS_NUM]), env[envs.MASTER],
            env[envs.JOB_TOKEN], envs.knob(envs.TIMEOUT, env))
    except OSError:
        return files                      # the ranks join the store themselves
    node = ranks[0].node
    return {**files, node: {**files.get(node, {}), envs.NODE_JOIN: path}}


def _wait_ready(waiting: Dict[int, "LocalProcess"]) -> None:
    """Until every pserver in ``waiting`` wrote its line, died, or READY_TIMEOUT passed."""
    import select
    import time
    deadline = time.monotonic() + READY_TIMEOUT
    left = dict(waiting)
    while left and time.monotonic() < deadline:
        ready, _, _ = select.select(list(left), [], [], min(0.2, deadline - time.monotonic()))
        for fd in ready:              # its line, or EOF: it died (the supervisor reports it)
            os.read(fd, 256)
            left.pop(fd)
        for fd, h in list(left.items()):
            if h.poll() is not None:
                left.pop(fd)
    for fd in list(waiting):
        os.close(fd)
        waiting.pop(fd)


def full_env(contract: Mapping[str, str], base: Optional[Mapping[str, str]] = None
             ) -> Dict[str, str]:
    """The inherited environment with the job's contract on top."""
    env = dict(os.environ if base is None else base)
    env.update(contract)
    return env


def sweep_descendants(grace: float) -> List[str]:
    """Stop and reap whatever still descends from this process (leftover grandchildren that
    outlived their worker). Returns those that were still running, as 'pid name (parent
    ppid)', for the launch log. Dead ones are only reaped: ranks whose mpirun exited before
    collecting them, or srun's own helper, are re-parented here (the subreaper) as zombies,
    and are not leftovers (nor a reason to import psutil)."""
    if not _has_children():
        _reap_children()
        return []
    import psutil
    me = psutil.Process()
    left = [p for p in me.children(recursive=True) if _running(p)]
    names = [_name(p) for p in left]
    if left:
        _signal_procs(left, signal.SIGTERM)
        _signal_procs(left, signal.SIGCONT)      # a stopped one acts on its SIGTERM now
        _, alive = psutil.wait_procs(left, timeout=grace)
        _signal_procs(alive, signal.SIGKILL)
        psutil.wait_procs(alive, timeout=5)
    _reap_children()
    return names


def _running(proc) -> bool:
    import psutil
    try:
        return proc.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _name(proc) -> str:
    """'pid name (parent ppid)' for the launch log: what was left, and under whom."""
    import psutil
    try:
        return f"{proc.pid} {proc.name()} (parent {proc.ppid()})"
    except psutil.Error:        # gone meanwhile
        return str(proc.pid)


def _has_children() -> bool:
    """Whether a live process (not a zombie) is a child of this one, from
    /proc/self/task/*/children (every thread has its own list) and each child's state; True
    when that cannot be told (then psutil looks)."""
    pids = _child_pids()
    if pids is None:
        return True
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat", "rb") as f:
                state = f.read().rsplit(b")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue                      # gone meanwhile
        if state != b"Z":
            return True
    return False


def _child_pids() -> Optional[List[int]]:
    """This process's children, or None when /proc cannot tell. A thread that ends during the
    scan hands its children to another thread, maybe one already read: the scan is then made
    again."""
    for _ in range(3):
        try:
            tasks = os.listdir("/proc/self/task")
        except OSError:
            return None
        vanished, pids = False, []
        for task in tasks:
            try:
                with open(f"/proc/self/task/{task}/children", "rb") as f:
                    pids += [int(pid) for pid in f.read().split()]
            except FileNotFoundError:
                if os.path.isdir(f"/proc/self/task/{task}"):
                    return None           # the thread is there, the file is not: no support
                vanished = True
            except OSError:
                return None
        if not vanished:
            return pids
    return None


def _reap_children() -> None:
    """Collect exit statuses of re-parented processes (psutil only reaps its own waits)."""
    pids = _child_pids()
    if pids is None:
        import psutil
        pids = [child.pid for child in psutil.Process().children()]
    for pid in pids:
        try:
            os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            pass
