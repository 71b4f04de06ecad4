"""No process outlives whoever started it: the Linux parent-death signal, set in the child.

``set_pdeathsig(signal.SIGTERM, parent)`` asks the kernel to send the signal when the thread
that forked us dies, then checks that ``parent`` is still our parent (it may have died between
the fork and the prctl, in which case we were already re-parented and the signal will never
come): the caller exits at once then. Used in ``preexec_fn`` of every worker and pserver the
launcher or a node agent starts, and by pservers themselves as a second line (they also poll
``os.getppid()`` each second: the watchdog for whatever re-parents). Light: ctypes only.
"""
from __future__ import annotations

import ctypes
import os
import signal
from typing import Optional

PR_SET_PDEATHSIG = 1
_libc = None


def _prctl(option: int, arg: int) -> bool:
    global _libc
    try:
        if _libc is None:
            _libc = ctypes.CDLL(None, use_errno=True)
        return _libc.prctl(option, arg, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def set_pdeathsig(signum: int = signal.SIGTERM, parent: Optional[int] = None) -> bool:
    """Ask for ``signum`` when our parent dies; False if ``parent`` is already gone (the
    caller should then stop: nobody is left to stop it)."""
    _prctl(PR_SET_PDEATHSIG, int(signum))
    return parent is None or os.getppid() == parent


def preexec(signum: int = signal.SIGTERM):
    """A ``preexec_fn`` for subprocess.Popen: the child gets ``signum`` when this thread dies
    (start children from the main thread), and exits before exec if we died already. libc is
    loaded here, in the parent, so the child only makes the call."""
    parent = os.getpid()
    _prctl(0, 0)                               # loads libc (option 0 is invalid: a no-op)
    prctl = _libc.prctl if _libc is not None else None

    def child() -> None:
        if prctl is not None:
            prctl(PR_SET_PDEATHSIG, int(signum), 0, 0, 0)
        if os.getppid() != parent:
            os._exit(1)
    return child


# --- the watchdog: for whatever re-parents ------------------------------------------------
# PR_SET_PDEATHSIG reaches only the direct child. A worker's own children (its process group)
# would be re-parented to init when the launcher is SIGKILLed. The watchdog is a tiny process
# the launcher starts with a pipe on its stdin; the launcher sends it "+PGID" for every
# process group it starts, "!PATH" for every directory of the job's that must not outlive it
# (the diagnostics directory in /dev/shm), and "done" at a normal end. EOF without "done" means
# the launcher died: the watchdog SIGKILLs every group it was told about, removes the
# directories, then exits.

# POSIX sh, not Python: the watchdog starts with every launch, and sh is ready in about a
# millisecond where an interpreter costs ~35 ms of CPU (on two cores, beside the launch itself)
# and, if the job is short, makes the launcher wait at the end for it to have started at all.
# Group ids below 2 are refused: "kill -- -1" would mean every process we may signal; so is
# the path "/".
_WATCH_SH = r"""trap '' INT
groups=
paths=
while IFS= read -r line; do
  case $line in
    done) exit 0 ;;
    +*[!0-9]*|+) ;;
    +*) [ "${line#+}" -gt 1 ] && groups="$groups ${line#+}" ;;
    !?*) paths="$paths
${line#!}" ;;
  esac
done
for g in $groups; do kill -s KILL -- "-$g" 2>/dev/null; done
printf '%s\n' "$paths" | while IFS= read -r p; do
  case $p in ""|/) ;; *) rm -rf -- "$p" ;; esac
done
exit 0
"""


class Watchdog:
    def __init__(self):
        import subprocess
        self._proc = subprocess.Popen(
            ["/bin/sh", "-c", _WATCH_SH, "fluidctl-watchdog"],
            stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            start_new_session=True, close_fds=True)   # no terminal signal reaches it

    def add(self, pgid: int) -> None:
        self._send(f"+{pgid}\n")

    def remove_on_death(self, path) -> None:
        self._send(f"!{path}\n")

    def _send(self, line: str) -> None:
        try:
            self._proc.stdin.write(line.encode())
            self._proc.stdin.flush()
        except (OSError, ValueError):
            pass

    def close(self) -> None:
        """A normal end: the watchdog exits without killing anything."""
        self._send("done\n")
        try:
            self._proc.stdin.close()
        except OSError:
            pass
        try:
            self._proc.wait(5)
        except Exception:
            self._proc.kill()
            self._proc.wait()


_current: Optional[Watchdog] = None


def start_watchdog() -> Watchdog:
    global _current
    _current = Watchdog()
    return _current


def stop_watchdog() -> None:
    global _current
    if _current is not None:
        _current.close()
        _current = None


def watch(pgid: int) -> None:
    """Tell the running watchdog (if any) about a process group this launcher started."""
    if _current is not None:
        _current.add(pgid)


def remove_on_death(path) -> None:
    """Tell the running watchdog (if any) to remove directory ``path`` if this launcher dies."""
    if _current is not None:
        _current.remove_on_death(path)


# --- a Slurm step's watchdog: scancel the step if the launcher dies -------------------------
# An srun step lives in slurmstepd on the nodes, not in any process group of ours: SIGKILL of
# srun (by the watchdog above, or with its launcher) leaves the step and its ranks running
# until the allocation ends. srun cancels its step on the parent-death SIGTERM, unless it is
# SIGKILLed first. So each step gets its own tiny watchdog, in its own session: EOF on its
# stdin without "done" means the launcher died; it then finds the step by its unique name
# (squeue -s) and scancels JOBID.STEPID (Slurm sends SIGTERM, then SIGKILL after KillWait).
_STEP_WATCH_SH = r"""trap '' INT
while IFS= read -r line; do [ "$line" = done ] && exit 0; done
"$3" -h -s -j "$1" -o '%i %j' 2>/dev/null | while read -r step name; do
  [ "$name" = "$2" ] && "$4" "$step" 2>/dev/null
done
exit 0
"""


class _StepWatchdog(Watchdog):
    def __init__(self, argv):
        import subprocess
        self._proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                                      stderr=subprocess.DEVNULL, start_new_session=True,
                                      close_fds=True)


def watch_slurm_step(job_id: str, name: str, squeue: str, scancel: str) -> Watchdog:
    """Start the watchdog that scancels step ``name`` of job ``job_id`` if this launcher dies
    (``squeue``/``scancel``: the clients' paths). Returns it; ``close()`` it when the step has
    ended normally (it then exits without cancelling anything)."""
    return _StepWatchdog(["/bin/sh", "-c", _STEP_WATCH_SH, "fluidctl-step-watchdog",
                          str(job_id), name, squeue, scancel])
