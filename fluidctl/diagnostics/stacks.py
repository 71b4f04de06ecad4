"""Python stacks of running ranks, and ranks grouped by where they are.

Two ways to get a stack:

- py-spy (``pip install 'fluidctl[debug]'``): ``py-spy dump --pid N`` reads the process from
  outside; it needs ptrace permission (same user and kernel.yama.ptrace_scope <= 1, or root /
  CAP_SYS_PTRACE in containers). ``pyspy_dump`` raises ``DumpUnavailable`` with one line that
  says which of these is missing.
- faulthandler: ``fluidctl.runtime.init()`` registers ``DUMP_SIGNAL`` to write every thread's
  stack into the rank's stack file (``paths.DiagDir``); ``faulthandler_dump`` sends the signal
  and reads what was written. Works without ptrace, only for ranks that called ``init()``.

``parse_pyspy`` / ``parse_faulthandler`` turn either text into ``Frame`` lists (innermost
first); ``group_ranks`` groups ranks with the same main-thread stack, and ``summary`` writes
one line per group: ``ranks 0,2,3 wait in allreduce at train.py:88``.

Standard library only (node agents import it).
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

from fluidctl.envs import PYSPY
from fluidctl.diagnostics.progress import DUMP_SIGNAL

PYSPY_TIMEOUT = 20.0


class DumpUnavailable(Exception):
    """A stack could not be taken; the message is one line saying why and what to do."""


@dataclass(frozen=True)
class Frame:
    func: str
    file: str
    line: int

    @property
    def where(self) -> str:
        return f"{os.path.basename(self.file)}:{self.line}"


@dataclass
class Thread:
    name: str
    frames: List[Frame]         # innermost first
    main: bool = False


# --- taking stacks ---------------------------------------------------------------------------

def pyspy_path() -> Optional[str]:
    """$FLUIDCTL_PYSPY (empty: none), else py-spy next to this Python (a venv's bin), else on
    PATH."""
    if PYSPY in os.environ:
        return os.environ[PYSPY] or None
    beside = Path(sys.executable).parent / "py-spy"
    if beside.exists():
        return str(beside)
    return shutil.which("py-spy")


def ptrace_scope() -> Optional[int]:
    try:
        return int(Path("/proc/sys/kernel/yama/ptrace_scope").read_text())
    except (OSError, ValueError):
        return None


def pyspy_dump(pid: int, timeout: float = PYSPY_TIMEOUT, exe: Optional[str] = None,
               nonblocking: bool = False) -> str:
    """``py-spy dump`` of one process, or DumpUnavailable saying why not; ``nonblocking``:
    without pausing it (a sample for the hang watchdog)."""
    exe = exe or pyspy_path()
    if not exe and os.environ.get(PYSPY) == "":
        raise DumpUnavailable("py-spy is off (FLUIDCTL_PYSPY is empty); using faulthandler "
                              "instead")
    if not exe:
        raise DumpUnavailable("py-spy is not installed (pip install 'fluidctl[debug]' or "
                              "pip install py-spy); using faulthandler instead")
    argv = [exe, "dump", "--full-filenames", "--pid", str(pid)] + (
        ["--nonblocking"] if nonblocking else [])
    try:        # its own session: a wrapper (pyenv's shim) and py-spy are stopped together
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                stdin=subprocess.DEVNULL, start_new_session=True)
    except OSError as exc:
        raise DumpUnavailable(f"py-spy could not run: {exc.strerror}") from None
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        try:
            os.killpg(proc.pid, 9)
        except OSError:
            pass
        proc.communicate()
        raise DumpUnavailable(f"py-spy dump --pid {pid} took over {timeout:g}s") from None
    out = subprocess.CompletedProcess(argv, proc.returncode, stdout, stderr)
    text = out.stdout.decode("utf-8", errors="replace")
    if out.returncode == 0 and "Thread" in text:
        return text
    err = (out.stderr.decode("utf-8", errors="replace") + text).strip()
    lowered = err.lower()                   # py-spy 0.4 says "Permission Denied"
    if "permission denied" in lowered or "operation not permitted" in lowered or "EPERM" in err:
        scope = ptrace_scope()
        hint = ("kernel.yama.ptrace_scope is %d: run 'sysctl kernel.yama.ptrace_scope=0'" % scope
                if scope and scope > 0 else
                "in a container add CAP_SYS_PTRACE (docker run --cap-add SYS_PTRACE)")
        raise DumpUnavailable(f"py-spy may not attach to pid {pid}: ptrace is not allowed "
                              f"({hint}); using faulthandler instead")
    last = err.splitlines()[-1] if err else f"exit code {out.returncode}"
    raise DumpUnavailable(f"py-spy dump --pid {pid} failed: {last}")


_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def proc_state(pid: int) -> Optional[Tuple[str, float]]:
    """(state letter, CPU seconds used so far: user + system, every thread) of ``pid`` from
    /proc/PID/stat; None when it is gone or cannot be read."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
        end = stat.rindex(b")")
        fields = stat[end + 2:].split()
        return fields[0].decode(), (int(fields[11]) + int(fields[12])) / _TICK
    except (OSError, ValueError, IndexError):
        return None


def stopped(pid: int) -> Optional[str]:
    """Why ``pid`` cannot answer right now, if it is stopped (SIGSTOP, Ctrl-Z, a debugger):
    its stack signal would wait until it resumes, and py-spy may block on it. None when it
    runs (or its state cannot be read)."""
    state = (proc_state(pid) or ("?", 0.0))[0]
    if state == "T":
        return f"pid {pid} is stopped (SIGSTOP or Ctrl-Z; kill -CONT {pid} resumes it)"
    if state == "t":
        return f"pid {pid} is stopped by a debugger (ptrace)"
    return None


def faulthandler_dump(pid: int, stack_file: Path, timeout: float = 5.0,
                      signalled=lambda: None) -> str:
    """Ask a rank that called ``fluidctl.runtime.init()`` to write its stacks (DUMP_SIGNAL)
    into ``stack_file`` and return what it wrote; ``signalled()`` is called once the signal
    was delivered (it may wake the rank from a C sleep, and end it)."""
    if not stack_file.exists():
        raise DumpUnavailable("it did not call fluidctl.runtime.init(): no faulthandler "
                              "signal")
    try:
        before = stack_file.stat().st_size
        try:
            os.kill(pid, DUMP_SIGNAL)
        except OSError as exc:
            raise DumpUnavailable(f"could not signal pid {pid}: {exc.strerror}") from None
        signalled()
        deadline = time.monotonic() + timeout
        size, stable_since = before, None
        while time.monotonic() < deadline:      # faulthandler writes from the signal handler,
            now = stack_file.stat().st_size     # without a completion mark: wait until it settles
            if now != size:
                size, stable_since = now, time.monotonic()
            elif size > before and stable_since and time.monotonic() - stable_since > 0.2:
                break
            time.sleep(0.02)
        if size <= before:
            raise DumpUnavailable(f"pid {pid} wrote no stack within {timeout:g}s (stopped, or "
                                  "stuck in native code that holds the GIL? py-spy can still "
                                  "read it)")
        with open(stack_file, "rb") as f:
            f.seek(before)
            return f.read().decode("utf-8", errors="replace")
    except OSError as exc:                      # the job ended meanwhile: its files went
        raise DumpUnavailable(f"the stack file of pid {pid} is gone ({exc.strerror})") from None


# --- reading stacks --------------------------------------------------------------------------

_PYSPY_THREAD = re.compile(r'^Thread (\S+) \(([\w+]+)\)(?:: "(.*)")?')   # (idle), (active+gil)
_PYSPY_FRAME = re.compile(r"^\s+(\S.*?) \((.+):(\d+)\)\s*$")
_FH_THREAD = re.compile(r"^(Current thread|Thread) (0x[0-9a-f]+) \(most recent call first\):")
_FH_FRAME = re.compile(r'^\s+File "(.+)", line (\d+) in (.+)$')


def parse_pyspy(text: str) -> List[Thread]:
    threads: List[Thread] = []
    for line in text.splitlines():
        m = _PYSPY_THREAD.match(line)
        if m:
            name = m.group(3) or m.group(1)
            threads.append(Thread(name, [], main=name == "MainThread"))
            continue
        f = _PYSPY_FRAME.match(line)
        if f and threads:
            threads[-1].frames.append(Frame(f.group(1), f.group(2), int(f.group(3))))
    if threads and not any(t.main for t in threads):
        threads[0].main = True
    return threads


def parse_faulthandler(text: str) -> List[Thread]:
    """faulthandler lists the main thread last (it is the oldest); the dump signal's handler
    runs in the main thread, so "Current thread" is the main one."""
    threads: List[Thread] = []
    for line in text.splitlines():
        m = _FH_THREAD.match(line)
        if m:
            threads.append(Thread(m.group(2), [], main=m.group(1) == "Current thread"))
            continue
        f = _FH_FRAME.match(line)
        if f and threads:
            threads[-1].frames.append(Frame(f.group(3), f.group(1), int(f.group(2))))
    if threads and not any(t.main for t in threads):
        threads[-1].main = True
    return threads


def main_stack(threads: Sequence[Thread]) -> List[Frame]:
    for t in threads:
        if t.main:
            return t.frames
    return threads[0].frames if threads else []


# --- grouping and the summary ----------------------------------------------------------------

_LIBRARY = (os.sep + "site-packages" + os.sep, os.sep + "dist-packages" + os.sep,
            os.sep + "lib" + os.sep + "python3")
# the fluidctl package (this module is one level below it)
_FLUIDCTL = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep


def _is_user(frame: Frame) -> bool:
    path = frame.file
    if path.startswith("<"):
        return False
    if os.path.abspath(path).startswith(_FLUIDCTL) or "/fluidctl/runtime/" in path:
        return False
    return not any(part in path for part in _LIBRARY)


# decorators and dispatch between a user's call and the function it names (torch's c10d
# logger, nn.Module's __call__)
_WRAPPERS = frozenset(["wrapper", "inner", "_fn", "decorate_context", "_wrapped_call_impl",
                       "_call_impl"])


def _called(frames: Sequence[Frame]) -> str:
    """The library function a user's frame called (``frames``: the library frames below it,
    innermost first), past decorators and nn.Module's dispatch."""
    for frame in reversed(frames):
        name = frame.func.rsplit(".", 1)[-1]
        if name not in _WRAPPERS:
            return name
    return frames[-1].func.rsplit(".", 1)[-1]


def describe(frames: Sequence[Frame]) -> str:
    """Where a stack is, for people: the innermost frame of the user's own code, and the
    library call it waits in ('wait in allreduce at train.py:88', 'in load at data.py:40')."""
    if not frames:
        return "no Python stack (not a Python process, or it had already exited)"
    for i, frame in enumerate(frames):
        if _is_user(frame):
            if i > 0:           # the library call it made, e.g. Context.allreduce
                return f"wait in {_called(frames[:i])} at {frame.where}"
            return f"in {frame.func} at {frame.where}"
    return f"in {frames[0].func} at {frames[0].where}"


def stack_key(frames: Sequence[Frame]) -> Tuple:
    """What makes two stacks "the same": the user's frames and the library call they wait in
    (where inside a spin loop each rank was sampled does not split a group)."""
    for i, frame in enumerate(frames):
        if _is_user(frame):
            start = max(0, i - 1)
            return ((frames[start].func,) if i else ()) + tuple(
                (f.func, f.file, f.line) for f in frames[i:])
    return tuple((f.func, f.file, f.line) for f in frames)


def group_ranks(stacks: Dict[int, Optional[List[Frame]]]) -> List[Tuple[List[int], Optional[List[Frame]]]]:
    """Ranks with the identical main stack together, biggest group first (None: no stack)."""
    groups: Dict[Tuple, List[int]] = {}
    frames_of: Dict[Tuple, Optional[List[Frame]]] = {}
    for rank in sorted(stacks):
        frames = stacks[rank]
        key = stack_key(frames) if frames is not None else ("<none>",)
        groups.setdefault(key, []).append(rank)
        frames_of[key] = frames
    ordered = sorted(groups.items(), key=lambda kv: (-len(kv[1]), kv[1][0]))
    return [(ranks, frames_of[key]) for key, ranks in ordered]


def rank_list(ranks: Sequence[int]) -> str:
    return ("rank " if len(ranks) == 1 else "ranks ") + ",".join(str(r) for r in ranks)


def summary(stacks: Dict[int, Optional[List[Frame]]], why: Dict[int, str] = None) -> List[str]:
    """One line per group of ranks with the same stack; ``why[rank]`` for ranks without one."""
    lines = []
    for ranks, frames in group_ranks(stacks):
        if frames is None:
            for rank in ranks:
                lines.append(f"{rank_list([rank])}: no stack ({(why or {}).get(rank, 'unknown')})")
            continue
        text = describe(frames)
        if text.startswith("wait "):
            text = text if len(ranks) > 1 else "waits " + text[len("wait "):]
        else:
            text = ("are " if len(ranks) > 1 else "is ") + text
        lines.append(f"{rank_list(ranks)} {text}")
    return lines


def format_stack(frames: Sequence[Frame]) -> List[str]:
    return [f"    {f.func} ({f.file}:{f.line})" for f in frames]
