"""No process outlives whoever started it: the Linux parent-death signal, set in the child.

``set_pdeathsig(signal.SIGTERM, parent)`` asks the kernel to send the signal when the thread
that forked us dies, then checks that ``parent`` is still our parent (it may have died between
the fork and the prctl, in which case we were already re-parented and the signal will never
come): the caller exits at once then. Every worker and pserver the launcher or a node agent
starts gets it (``dying_with_us``: through util-linux's ``setpriv --pdeathsig``, else in
``preexec_fn``), and pservers set it themselves as a second line (they also poll
``os.getppid()`` each second: the watchdog for whatever re-parents). Light: ctypes only.
"""
from __future__ import annotations

import ctypes
import math
import os
import signal
from typing import Callable, Dict, List, Mapping, Optional, Sequence, Tuple

from fluidctl.sigs import GRACE_PERIOD

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


_SETPRIV: Optional[str] = None     # setpriv's path once looked for ("": none that helps)


def _setpriv() -> str:
    """util-linux's setpriv where it has ``--pdeathsig`` (2.33 and later), else "". The option
    is looked for in the program's own bytes (its getopt table names it), not by running
    ``setpriv --help``: a process start less on the path to the ranks."""
    global _SETPRIV
    if _SETPRIV is None:
        import shutil
        path = shutil.which("setpriv") or ""
        if path:
            try:
                with open(path, "rb") as f:
                    path = path if b"pdeathsig" in f.read(4 << 20) else ""
            except OSError:
                path = ""
        _SETPRIV = path
    return _SETPRIV


def _runnable(program: str, env: Mapping[str, str], cwd: Optional[str]) -> bool:
    """Whether exec can run ``program`` as Popen would look it up (PATH from ``env``)."""
    import shutil
    if "/" in program:
        path = os.path.join(cwd or "", program)
        return os.path.isfile(path) and os.access(path, os.X_OK)
    return shutil.which(program, path=env.get("PATH", os.defpath)) is not None


def dying_with_us(argv: Sequence[str], signum: int, env: Mapping[str, str],
                  cwd: Optional[str] = None) -> Tuple[List[str], Optional[Callable[[], None]]]:
    """``argv`` and the ``preexec_fn`` to start it with so that it gets ``signum`` when this
    thread dies. Through util-linux's ``setpriv --pdeathsig SIG --`` where that works: Popen
    then uses vfork and the child execs at once. A ``preexec_fn`` makes Popen fork instead,
    and the child runs Python before its exec: 2.4 ms more per process on an idle machine,
    10 ms and more on a node agent starting its ranks beside the rest of a job. ``preexec``
    stays where setpriv lacks the option, and for a program exec could not run (Popen's own
    error then, not setpriv's exit 127). setpriv cannot check that its parent is still
    there after the prctl; the watchdog below covers a parent that dies in that window."""
    setpriv = _setpriv()
    if setpriv and argv and _runnable(argv[0], env, cwd):
        return [setpriv, "--pdeathsig", signal.Signals(signum).name, "--", *argv], None
    return list(argv), preexec(signum)


# --- the watchdog: for whatever re-parents ------------------------------------------------
# PR_SET_PDEATHSIG reaches only the direct child. A worker's own children (its process group)
# would be re-parented to init when the launcher is SIGKILLed, and so would a descendant that
# left the group (setsid) and everything mpirun started. The watchdog is a tiny process the
# launcher starts with a pipe on its stdin; the launcher sends it "@SECONDS" (the grace
# period), "+PGID" for every trainer's process group, "~PGID" for every pserver's (a service:
# it checkpoints on SIGTERM), "=MARKER" (this job's marker, below), "!PATH" for every
# directory of the job's that must not outlive it (the diagnostics directory in /dev/shm),
# and "done" at a normal end. EOF without "done" means the launcher died; then, in order:
#   1. SIGTERM to every service group (their checkpoint starts at once),
#   2. SIGKILL to every trainer group, and to every process whose environment holds the
#      trainers' marker (a setsid grandchild, mpirun's ranks and what they started),
#   3. up to the grace period for the service groups to end, then SIGKILL to them,
#   4. SIGKILL to everything left that holds any marker of this job, and the directories go.
# "%JOBID STEPNAME" names a Slurm step the launcher's srun runs: on the launcher's death it is
# scancelled (after step 2), since srun's tasks run on the nodes, out of reach of any kill here.
#
# The marker: every process the launcher starts gets FLUIDCTL_JOB_MARKER=<id>/k (trainers,
# mpirun) or <id>/t (services) in its environment, and children inherit their environment
# whatever they do to their process group or session, and wherever mpirun starts them on
# this machine. Why not the alternatives: the subreaper is the launcher itself (dead by then,
# so orphans go to init), a process group is left with one setsid(), and a cgroup of our own
# needs a delegated cgroup tree, which most machines and containers do not give a user. A
# process that scrubs its own environment escapes; one that changes only a variable's value
# keeps the marker, since /proc/PID/environ holds the environment it was started with.

# POSIX sh, not Python: the watchdog starts with every launch, and sh is ready far sooner than
# an interpreter, whose start would take CPU from the launch itself and, if the job is short,
# make the launcher wait at the end for it to have started at all.
# Group ids below 2 are refused: "kill -- -1" would mean every process we may signal; so is
# the path "/"; a marker is letters, digits, "-" and "." only.
# Every "~" is quoted ("\~"): an unquoted one in a case pattern or in "${line#~}" is a tilde
# expansion to $HOME (or the passwd home when HOME is unset, in bash), so nothing would be
# stripped and no pserver would get its SIGTERM. tests/e2e/test_lifeline.py runs the script
# under dash and bash, with HOME set and unset.
_WATCH_SH = r"""trap '' INT
groups=
soft=
steps=
mark=
grace=30
paths=
while IFS= read -r line; do
  case $line in
    done) exit 0 ;;
    @*[!0-9]*|@) ;;
    @*) grace=${line#@} ;;
    +*[!0-9]*|+) ;;
    +*) [ "${line#+}" -gt 1 ] && groups="$groups ${line#+}" ;;
    \~*[!0-9]*|\~) ;;
    \~*) [ "${line#\~}" -gt 1 ] && soft="$soft ${line#\~}" ;;
    =*[!A-Za-z0-9.-]*|=) ;;
    =*) mark=${line#=} ;;
    %*[!A-Za-z0-9_.\ -]*|%|%*\ *\ *) ;;
    %?*\ ?*) s=${line#%}; steps="$steps ${s%% *}:${s#* }" ;;
    !?*) paths="$paths
${line#!}" ;;
  esac
done
sweep() {
  [ -n "$mark" ] || return 0
  n=0
  while [ $n -lt 10 ]; do
    found=
    for f in $(grep -laF -e "FLUIDCTL_JOB_MARKER=$mark/$1" /proc/[0-9]*/environ 2>/dev/null); do
      p=${f#/proc/}; p=${p%/environ}
      [ "$p" = "$$" ] && continue
      kill -s KILL "$p" 2>/dev/null && found=1
    done
    [ -n "$found" ] || return 0
    n=$((n+1))
  done
}
for g in $soft; do kill -s TERM -- "-$g" 2>/dev/null; done
for g in $groups; do kill -s KILL -- "-$g" 2>/dev/null; done
sweep k
for s in $steps; do
  squeue -h -s -j "${s%%:*}" -o "%i %j" 2>/dev/null | while read -r id nm; do
    [ "$nm" = "${s#*:}" ] && scancel "$id" 2>/dev/null
  done
done
if [ -n "$soft" ]; then
  i=0
  while [ $i -lt $((grace * 20)) ]; do
    alive=
    for g in $soft; do kill -s 0 -- "-$g" 2>/dev/null && alive=1; done
    [ -n "$alive" ] || break
    sleep 0.05
    i=$((i+1))
  done
  for g in $soft; do kill -s KILL -- "-$g" 2>/dev/null; done
fi
sweep ''
printf '%s\n' "$paths" | while IFS= read -r p; do
  case $p in ""|/) ;; *) rm -rf -- "$p" ;; esac
done
exit 0
"""

MARKER = "FLUIDCTL_JOB_MARKER"


class Watchdog:
    def __init__(self, grace: float = GRACE_PERIOD):
        import subprocess
        env = {k: v for k, v in os.environ.items() if k != MARKER}   # never its own target
        self._proc = subprocess.Popen(
            ["/bin/sh", "-c", _WATCH_SH, "fluidctl-watchdog"], env=env,
            stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            start_new_session=True, close_fds=True)   # no terminal signal reaches it
        self.marker = f"{os.getpid()}-{os.urandom(6).hex()}"
        self._send(f"@{max(1, int(math.ceil(grace)))}\n={self.marker}\n")

    def add(self, pgid: int, service: bool = False) -> None:
        self._send(f"{'~' if service else '+'}{pgid}\n")

    def env(self, service: bool = False) -> Dict[str, str]:
        """What a process this launcher starts carries in its environment (see above)."""
        return {MARKER: f"{self.marker}/{'t' if service else 'k'}"}

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


def start_watchdog(grace: float = GRACE_PERIOD) -> Watchdog:
    """``grace``: how long pservers (services) get to checkpoint after SIGTERM if the
    launcher dies, before SIGKILL."""
    global _current
    _current = Watchdog(grace)
    return _current


def stop_watchdog() -> None:
    global _current
    if _current is not None:
        _current.close()
        _current = None


def watch(pgid: int, service: bool = False) -> None:
    """Tell the running watchdog (if any) about a process group this launcher started
    (``service``: a pserver, stopped with SIGTERM and the grace period)."""
    if _current is not None:
        _current.add(pgid, service)


def watch_slurm_step(job_id: str, name: str) -> None:
    """Tell the running watchdog (if any) to scancel step ``name`` of job ``job_id`` if this
    launcher dies (its srun is killed with it, and the step's tasks are on the nodes)."""
    if _current is not None:
        _current._send(f"%{job_id} {name}\n")


def marker_env(service: bool = False) -> Dict[str, str]:
    """The job marker for the environment of a process this launcher starts ({} without a
    running watchdog)."""
    return _current.env(service) if _current is not None else {}


def remove_on_death(path) -> None:
    """Tell the running watchdog (if any) to remove directory ``path`` if this launcher dies."""
    if _current is not None:
        _current.remove_on_death(path)
