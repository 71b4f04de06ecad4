"""Why a process failed, in words: the failure report's triage engine.

Pure functions over text the launcher already has (the tail of a rank's log, the kernel's log,
a cgroup's memory counters), so each rule is tested on recorded text and the launcher only
gathers the inputs:

- ``explain_signal``: the signal's name and what it usually means (SIGSEGV, SIGBUS, SIGKILL...);
- ``oom_records`` / ``kernel_log``: the kernel OOM killer's "Killed process N (comm) ...
  anon-rss:...kB" records, read from /dev/kmsg (or ``dmesg``);
- ``oom_kill_count``: the ``oom_kill`` counter of a memory cgroup (v2 ``memory.events``, v1
  ``memory.oom_control``): a rise while the job ran means the cgroup's limit killed something;
- ``nccl_error``: the NCCL error class named in the log tail (ncclSystemError, ...);
- ``python_exception``: type, message and innermost location of the last traceback;
- a collective mismatch that gloo aborted on, or that torch's DETAIL check raised
  (``fluidctl.diagnostics.gloo``);
- ``explain``: one line for the report, combining the above (memory first, then a gloo
  mismatch, then NCCL, then the exception, then the plain exit).

Standard library only: the node agents import this too.
"""
from __future__ import annotations

import os
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, List, Optional, Sequence

from fluidctl.diagnostics.failures import FailureKind, signal_of
from fluidctl.units import human_bytes

SIGNAL_MEANING = {
    "SIGKILL": "killed (SIGKILL: the OOM killer, a scheduler, or kill -9)",
    "SIGSEGV": "crashed (SIGSEGV: segmentation fault in native code: an extension, a driver "
               "or the interpreter itself)",
    "SIGBUS": "crashed (SIGBUS: bad memory access, often /dev/shm full or a truncated "
              "memory-mapped file)",
    "SIGABRT": "aborted (SIGABRT: a C++ exception or assertion in native code)",
    "SIGFPE": "crashed (SIGFPE: arithmetic fault in native code)",
    "SIGILL": "crashed (SIGILL: illegal instruction: a binary built for another CPU)",
    "SIGTERM": "terminated (SIGTERM from outside the job)",
    "SIGINT": "interrupted (SIGINT)",
    "SIGHUP": "hung up (SIGHUP: its terminal or session went away)",
    "SIGPIPE": "wrote to a closed pipe (SIGPIPE)",
}


def explain_signal(name: str) -> str:
    return SIGNAL_MEANING.get(name, f"killed by {name}")


# --- memory ----------------------------------------------------------------------------------

@dataclass(frozen=True)
class OomRecord:
    pid: int
    comm: str
    rss_bytes: int          # anon + file + shmem resident memory when it was killed
    cgroup: bool            # a memory cgroup's limit (not the whole machine) was hit
    uptime: Optional[float] = None      # kernel timestamp, seconds since boot


_KILLED = re.compile(r"(Memory cgroup out of memory: |Out of memory[^:]*: )?Killed process "
                     r"(\d+) \(([^)]*)\)(.*)")
_RSS = re.compile(r"(anon|file|shmem)-rss:\s*(\d+)kB")
_KMSG = re.compile(r"^\d+,\d+,(\d+),[^;]*;(.*)$")
_DMESG_TS = re.compile(r"^\[\s*(\d+\.\d+)\]\s?(.*)$")


def oom_records(text: str) -> List[OomRecord]:
    """Every OOM-killer record in kernel log text (``/dev/kmsg`` records, ``dmesg`` lines, or
    bare messages)."""
    found = []
    for raw in text.splitlines():
        uptime = None
        m = _KMSG.match(raw)
        if m:
            uptime, raw = int(m.group(1)) / 1e6, m.group(2)
        else:
            m = _DMESG_TS.match(raw)
            if m:
                uptime, raw = float(m.group(1)), m.group(2)
        k = _KILLED.search(raw)
        if not k:
            continue
        rss = sum(int(kb) for _, kb in _RSS.findall(k.group(4))) * 1024
        found.append(OomRecord(int(k.group(2)), k.group(3), rss,
                               bool(k.group(1) and k.group(1).startswith("Memory cgroup")),
                               uptime))
    return found


def kernel_log(limit: int = 4 << 20) -> Optional[str]:
    """The kernel's log buffer as text, or None where it may not be read (dmesg_restrict)."""
    try:
        fd = os.open("/dev/kmsg", os.O_RDONLY | os.O_NONBLOCK)
    except OSError:
        fd = None
    if fd is not None:
        chunks, size = [], 0
        try:
            while size < limit:
                try:
                    chunk = os.read(fd, 8192)
                except BlockingIOError:
                    break
                except BrokenPipeError:     # a record overwritten while reading: go on
                    continue
                if not chunk:
                    break
                chunks.append(chunk)
                size += len(chunk)
        except OSError:
            chunks = []
        finally:
            os.close(fd)
        if chunks:
            return b"".join(chunks).decode("utf-8", errors="replace")
    try:
        out = subprocess.run(["dmesg"], capture_output=True, timeout=5)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.decode("utf-8", errors="replace") if out.returncode == 0 else None


def uptime() -> Optional[float]:
    """Seconds since boot, the clock of the kernel log's timestamps."""
    try:
        return float(Path("/proc/uptime").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def memory_cgroup(pid: str = "self") -> Optional[Path]:
    """The memory cgroup directory of a process (cgroup v2, else v1's memory controller)."""
    try:
        lines = Path(f"/proc/{pid}/cgroup").read_text().splitlines()
    except OSError:
        return None
    v1 = v2 = None
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if controllers == "":
            v2 = path
        elif "memory" in controllers.split(","):
            v1 = path
    candidates = []
    if v1 is not None:
        candidates.append(Path("/sys/fs/cgroup/memory") / v1.lstrip("/"))
    if v2 is not None:
        candidates += [Path("/sys/fs/cgroup") / v2.lstrip("/"),
                       Path("/sys/fs/cgroup/unified") / v2.lstrip("/")]
    for path in candidates:
        if (path / "memory.events").exists() or (path / "memory.oom_control").exists():
            return path
    return None


def oom_kill_count(cgroup: Optional[Path]) -> Optional[int]:
    """The cgroup's ``oom_kill`` counter (v2 memory.events, v1 memory.oom_control)."""
    if cgroup is None:
        return None
    for name in ("memory.events", "memory.oom_control"):
        try:
            text = (cgroup / name).read_text()
        except OSError:
            continue
        for line in text.splitlines():
            key, _, value = line.partition(" ")
            if key == "oom_kill" and value.strip().isdigit():
                return int(value)
    return None


def memory_limit(cgroup: Optional[Path]) -> Optional[int]:
    """The cgroup's memory limit in bytes, None when unlimited or unknown."""
    if cgroup is None:
        return None
    for name in ("memory.max", "memory.limit_in_bytes"):
        try:
            text = (cgroup / name).read_text().strip()
        except OSError:
            continue
        if text.isdigit() and int(text) < (1 << 60):
            return int(text)
        return None
    return None


# --- what the log says -----------------------------------------------------------------------

NCCL_CLASSES = [
    # (class, patterns, what it usually means)
    ("ncclRemoteError", ("ncclRemoteError", "NCCL_ERROR_REMOTE_ERROR",
                         "remote process exited or there was a network error"),
     "a peer rank died or the network between nodes dropped; look at the other ranks first"),
    ("ncclSystemError", ("ncclSystemError", "NCCL_ERROR_SYSTEM_ERROR", "unhandled system error"),
     "a system call or socket failed: check NCCL_SOCKET_IFNAME, firewalls, /dev/shm size, "
     "ulimit -l; NCCL_DEBUG=INFO names the call"),
    ("ncclUnhandledCudaError", ("ncclUnhandledCudaError", "NCCL_ERROR_UNHANDLED_CUDA_ERROR",
                                "unhandled cuda error"),
     "a CUDA call failed inside NCCL: a GPU fault, out of GPU memory, or a driver mismatch"),
    ("ncclInvalidUsage", ("ncclInvalidUsage", "NCCL_ERROR_INVALID_USAGE", "invalid usage"),
     "ranks called NCCL inconsistently (different collectives, counts or devices)"),
    ("ncclInvalidArgument", ("ncclInvalidArgument", "NCCL_ERROR_INVALID_ARGUMENT",
                             "invalid argument (run with NCCL_DEBUG"),
     "a bad buffer, count or device was passed to NCCL"),
    ("ncclInternalError", ("ncclInternalError", "NCCL_ERROR_INTERNAL_ERROR",
                           "internal error - please report"),
     "NCCL failed internally; NCCL_DEBUG=INFO shows where"),
    ("NCCL timeout", ("Watchdog caught collective operation timeout",),
     "a collective did not finish in time: another rank hung or died (--hang-timeout dumps "
     "the stacks)"),
]


def nccl_error(lines: Sequence[str]) -> Optional[str]:
    """'ncclSystemError (what it means)' for the last NCCL error named in ``lines``."""
    for line in reversed(lines):
        for name, patterns, meaning in NCCL_CLASSES:
            if any(p in line for p in patterns):
                return f"{name}: {meaning}"
    return None


@dataclass(frozen=True)
class PyException:
    type: str
    message: str
    where: str = ""         # innermost "file:line" of the traceback
    user_where: str = ""    # innermost "file:line" of the script's own code

    def __str__(self) -> str:
        text = f"{self.type}: {self.message}" if self.message else self.type
        return f"{text} (at {self.where})" if self.where else text


_EXC_LINE = re.compile(r"^([A-Za-z_][\w.]*)(?::\s?(.*))?$")
_FRAME = re.compile(r'^\s+File "([^"]+)", line (\d+)')


def python_exception(lines: Sequence[str]) -> Optional[PyException]:
    """The exception of the last Python traceback in ``lines``: type, message, location."""
    start = None
    for i in range(len(lines) - 1, -1, -1):
        if lines[i].startswith("Traceback (most recent call last):"):
            start = i
            break
    if start is None:
        return _compile_error(lines)
    from fluidctl.diagnostics.stacks import Frame, _is_user
    where = user_where = ""
    for line in lines[start + 1:]:
        frame = _FRAME.match(line)
        if frame:
            where = f"{os.path.basename(frame.group(1))}:{frame.group(2)}"
            if _is_user(Frame("", frame.group(1), int(frame.group(2)))):
                user_where = where
            continue
        if line.startswith((" ", "\t")) or not line.strip():
            continue
        m = _EXC_LINE.match(line.strip())
        if m and (m.group(2) is not None or m.group(1)[:1].isupper()):
            return PyException(m.group(1), (m.group(2) or "").strip(), where, user_where)
        return None
    return None


_COMPILE_ERRORS = ("SyntaxError", "IndentationError", "TabError")


def _compile_error(lines: Sequence[str]) -> Optional[PyException]:
    """A script that does not compile: Python prints no "Traceback" line, only the place and
    the error (``  File "t.py", line 2``, the source line, a caret, ``SyntaxError: ...``)."""
    for i in range(len(lines) - 1, -1, -1):
        m = _EXC_LINE.match(lines[i].strip())
        if not (m and m.group(1) in _COMPILE_ERRORS and not lines[i].startswith((" ", "\t"))):
            continue
        for j in range(i - 1, max(-1, i - 6), -1):
            frame = _FRAME.match(lines[j])
            if frame:
                where = f"{os.path.basename(frame.group(1))}:{frame.group(2)}"
                return PyException(m.group(1), (m.group(2) or "").strip(), where)
        return None
    return None


_RANK_PREFIX = re.compile(r"^\[rank\d+\]: ?")


def without_rank_prefixes(lines: Sequence[str]) -> List[str]:
    """``lines`` without the ``[rank1]: `` that torch.distributed puts before every line a rank
    prints once its process group is up (its uncaught tracebacks included)."""
    return [_RANK_PREFIX.sub("", line, count=1) for line in lines]


# python's own line for a script it cannot open (no traceback: it never started)
_CANT_OPEN = re.compile(r"can't open file '[^']*': \[Errno \d+\] .*$")


# --- one line --------------------------------------------------------------------------------

@dataclass
class Explanation:
    kind: FailureKind
    text: str


def explain(returncode: int, tail: Sequence[str], *, pid: Optional[int] = None,
            oom: Iterable[OomRecord] = (), cgroup_oom_kills: int = 0,
            cgroup_limit: Optional[int] = None, rank: Optional[int] = None) -> Explanation:
    """The failure in one line. ``oom``: the kernel's OOM records of this job's time;
    ``cgroup_oom_kills``: how much the job's memory cgroup's oom_kill counter rose;
    ``rank``: the failed process's rank, for the sentence."""
    tail = without_rank_prefixes(tail)
    sig = signal_of(returncode)
    if sig == "SIGKILL":
        mine = [r for r in oom if pid is not None and r.pid == pid]
        if mine:
            r = mine[-1]
            where = "its memory cgroup's limit" if r.cgroup else "the machine's memory"
            return Explanation(FailureKind.OOM,
                               f"killed for memory: it used {human_bytes(r.rss_bytes)} "
                               f"when the kernel's OOM killer stopped it ({where} was "
                               f"exhausted; kernel record: Killed process {r.pid} "
                               f"({r.comm}))")
        if cgroup_oom_kills > 0:
            limit = f" of {human_bytes(cgroup_limit)}" if cgroup_limit else ""
            return Explanation(FailureKind.OOM,
                               f"killed for memory: the job's memory cgroup limit{limit} "
                               f"was hit (memory oom_kill count +{cgroup_oom_kills})")
    from fluidctl.diagnostics.gloo import classify_log
    mismatch = classify_log(tail, rank)
    if mismatch is not None:
        return Explanation(FailureKind(mismatch.kind), mismatch.sentence)
    nccl = nccl_error(tail)
    exc = python_exception(tail)
    if nccl:
        return Explanation(FailureKind.NCCL,
                           f"NCCL error {nccl}" + (f"; raised as {exc}" if exc else ""))
    if exc:
        from fluidctl.diagnostics.classify import classify_failure
        verdict = classify_failure(exc.type, exc.message, exc.user_where or exc.where)
        if verdict is not None:
            return Explanation(FailureKind(verdict.kind), verdict.sentence)
        return Explanation(FailureKind.EXCEPTION, str(exc))
    if sig:
        return Explanation(FailureKind.SIGNAL, explain_signal(sig))
    missing = next((m for m in map(_CANT_OPEN.search, reversed(tail)) if m), None)
    if missing:
        return Explanation(FailureKind.EXIT, f"python {missing.group(0)} (copy the script "
                                             "there, or pass --remote-dir with the directory "
                                             "that holds it)")
    return Explanation(FailureKind.EXIT, f"exit code {returncode} (no traceback in its log)")
