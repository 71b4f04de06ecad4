"""The Slurm backend's step inside an allocation: the ``srun`` command (``srun_argv``), the step
as one handle (``SrunStep``), and what srun's own report says when a task fails (the first
failed task, a node failure, a task Slurm killed for memory, a step Slurm refused), scancel of a
step, and the allocation's end."""
from __future__ import annotations

import os
import re
import signal
import time
from pathlib import Path
from typing import List, Mapping, Optional, Sequence, Tuple

from fluidctl.backends.slurm import slurmctl
from fluidctl.procs import lifeline
from fluidctl.procs.local import LocalProcess
from fluidctl.diagnostics.failures import Failure, FailureKind
from fluidctl.paths import LogLayout

STEP_PREFIX = "fluidctl"


# --- the srun step -------------------------------------------------------------------------
def step_name() -> str:
    """A name to find this launcher's step by (squeue -s) if srun itself is gone."""
    return f"{STEP_PREFIX}-{os.urandom(4).hex()}"       # not secrets: ~4 ms to import


def srun_argv(*, nodes: int, ntasks_per_node: int, name: str, command: Sequence[str],
              nodelist: Sequence[str] = (), overlap: bool = False,
              extra: Sequence[str] = (), fail_fast: bool = True) -> List[str]:
    """One srun step (pure: golden-tested). --kill-on-bad-exit=1 makes one failing rank end
    the whole step (``fail_fast``; the stack-taking step keeps the other nodes' answers);
    tasks' stdout stays on the nodes (each worker writes workerlog.N)."""
    argv = ["srun", f"--kill-on-bad-exit={1 if fail_fast else 0}", f"--nodes={nodes}",
            f"--ntasks={nodes * ntasks_per_node}", f"--ntasks-per-node={ntasks_per_node}",
            f"--job-name={name}"]
    if nodelist:
        argv.append(f"--nodelist={','.join(nodelist)}")
    if overlap:
        argv.append("--overlap")
    argv += list(extra)
    return argv + list(command)


def worker_command(python: str, script: str, script_args: Sequence[str]) -> List[str]:
    return [python, "-m", "fluidctl", "worker", script, *script_args]


_TASK_LINE = re.compile(r"srun: error: (\S+): tasks? ([0-9][0-9,\-]*): (.+?)\s*$")
_EXITED = re.compile(r"Exited with exit code (\d+)")
_SIGNAL_WORDS = {"Killed": signal.SIGKILL, "Terminated": signal.SIGTERM,
                 "Aborted": signal.SIGABRT, "Segmentation fault": signal.SIGSEGV,
                 "Bus error": signal.SIGBUS, "Interrupt": signal.SIGINT, "Hangup": signal.SIGHUP,
                 "Floating point exception": signal.SIGFPE,
                 "Out Of Memory": signal.SIGKILL}       # the cgroup OOM killer's SIGKILL
# What slurmstepd says when the step's memory cgroup killed something (22.05+, then older
# wordings), and srun's word for such a task; the kernel log of this machine cannot say it
_SLURM_OOM = re.compile(r"Detected \d+ oom[_-]kill event|exceeded (job|step )?memory limit"
                        r"|: tasks? [0-9][0-9,\-]*: Out Of Memory", re.IGNORECASE)


def first_failed_task(srun_output: str) -> Optional[Tuple[int, str, int]]:
    """(task, node, Popen-style return code) of the first failure srun reported, e.g. from
    'srun: error: node2: task 3: Exited with exit code 7' or '...: tasks 0-1: Killed'."""
    for line in srun_output.splitlines():
        m = _TASK_LINE.search(line)
        if not m:
            continue
        host, tasks, what = m.groups()
        task = int(re.match(r"\d+", tasks).group())
        exited = _EXITED.search(what)
        if exited:
            code = int(exited.group(1))
            if code:
                return task, host, code
            continue
        for word, sig in _SIGNAL_WORDS.items():
            if what.startswith(word):
                return task, host, -int(sig)
        return task, host, 1
    return None


_NODE_FAILURE = re.compile(r"srun: error: Node failure on (\S+)")


def node_failure(srun_output: str) -> Optional[str]:
    """The node Slurm itself says failed under the step ('srun: error: Node failure on
    node2'): node evidence, unlike a task's exit code or signal."""
    m = _NODE_FAILURE.search(srun_output)
    return m.group(1) if m else None


def _task_error(srun_output: str) -> str:
    """A task's own one-line error (``error: what (how to fix)``) in srun's output: what a
    rank's worker said before the script, and its log, started."""
    return next((line.strip() for line in srun_output.splitlines()
                 if line.startswith("error: ")), "")


def srun_failure(srun_output: str, layout: LogLayout, role: str = "trainer"
                 ) -> Optional[Failure]:
    """The first failed task srun reported, as a Failure with its workerlog; when Slurm's
    memory cgroup killed tasks of the step (slurmstepd's oom_kill line, or a task 'Out Of
    Memory'), explained as that: the launcher's kernel log knows nothing of another node."""
    found = first_failed_task(srun_output)
    if found is None:
        return _refused_step(srun_output, layout, role)
    task, host, code = found
    log = layout.for_role("PSERVER" if role == "pserver" else "TRAINER", task)
    failure = Failure(f"{role} {task}", host, code, str(log))
    said = _task_error(srun_output)
    if said:       # said before its log existed (the worker's checks): srun.log has it
        failure.explanation = f"{said} (in {srun_log(layout, role)})"
    line = next((l.strip() for l in srun_output.splitlines() if _SLURM_OOM.search(l)), None)
    if line is not None:
        failure.explanation = ("killed for memory: Slurm's memory limit for the step was "
                               f"exhausted (srun.log: {line}); ask for more with --mem or "
                               "--mem-per-cpu, or use less")
        failure.kind = FailureKind.OOM
    return failure


_REFUSED = re.compile(r"srun: error: Unable to create step for job (\S+): (.+?)\s*$", re.M)
_REFUSAL_HINTS = {
    "More processors requested than permitted":
        "the step asks for more CPUs on a node than the allocation has: run fewer ranks per "
        "node (--nproc), or allocate more CPUs (salloc --ntasks-per-node, -c)",
    "Requested node configuration is not available":
        "no node of the allocation has what the step asks for (CPUs, GPUs, memory): compare "
        "--nproc/--gpus with 'scontrol show job $SLURM_JOB_ID'",
    "Memory required by task is not available":
        "the allocation's memory does not cover the step: allocate more (salloc --mem) or "
        "pass less with --slurm-arg=--mem=...",
    "Requested nodes are busy":
        "another step holds the allocation's resources: wait for it, or let this one share "
        "with --slurm-arg=--overlap",
}


def srun_log(layout: LogLayout, role: str) -> Path:
    """Where srun writes its own messages for the step of ``role`` (trainer or pserver)."""
    return layout.srun if role == "trainer" else layout.srun_pserver


def _refused_step(srun_output: str, layout: LogLayout, role: str) -> Optional[Failure]:
    """srun's 'Unable to create step for job N: REASON': no task ever ran, so the failure is
    Slurm's refusal, explained with what to change."""
    refused = _REFUSED.search(srun_output)
    if refused is None:
        return None
    job, reason = refused.groups()
    failure = Failure(f"srun ({role}s)", "slurm", 1, str(srun_log(layout, role)))
    hint = next((h for known, h in _REFUSAL_HINTS.items() if reason.startswith(known)), "")
    failure.explanation = (f"Slurm refused to start the step in job {job}: {reason}"
                           + (f"; {hint}" if hint else ""))
    failure.kind = FailureKind.REFUSED
    return failure


class SrunStep(LocalProcess):
    """The srun of one step, as a Handle: its failure is the first failing task's (rank, node,
    exit code, workerlog), read from srun's own report; killing it also cancels the step."""

    def __init__(self, argv: List[str], env: Mapping[str, str], layout: LogLayout, *,
                 job_id: str, name: str, role: str = "trainer", service: bool = False):
        self.layout, self.job_id, self.step, self.role = layout, job_id, name, role
        super().__init__(role + "s" if role == "trainer" else "pservers", argv, env,
                         str(srun_log(layout, role)),
                         host="slurm", service=service)
        lifeline.watch_slurm_step(job_id, name)     # scancelled if this launcher is SIGKILLed

    def failure(self) -> Failure:
        try:
            text = Path(self.log).read_text(errors="replace")
        except OSError:
            text = ""
        failure = srun_failure(text, self.layout, self.role)
        if failure is None:
            return Failure(f"srun ({self.role}s)", self.host, self.popen.returncode, self.log,
                           self.pid)
        return failure

    def kill(self) -> None:
        super().kill()
        cancel_step(self.job_id, self.step)

    def send_signal(self, sig: int) -> None:
        """``sig`` to every task of the step (a checkpoint request), through Slurm: srun
        itself takes SIGTERM as "cancel the step" and would kill the tasks before they save.
        scancel's error does not fall back to srun: Slurm 22.05 reports "Invalid job id" for
        a step on some of the allocation's nodes though the tasks got the signal, and the
        request file reaches the ranks either way."""
        if cancel_step(self.job_id, self.step, sig) is None:
            super().send_signal(sig)        # not listed (yet): srun forwards what it can


def job_end(job_id: str) -> Optional[float]:
    """When the job's time limit ends (scontrol's EndTime, local time), or None without one."""
    try:
        res = slurmctl.client("scontrol", "show", "job", "-o", job_id, timeout=20)
    except Exception:      # noqa: BLE001 - no time-limit request then, nothing else lost
        return None
    end = slurmctl.parse_scontrol(res.stdout).get("EndTime", "")
    try:
        return time.mktime(time.strptime(end, "%Y-%m-%dT%H:%M:%S"))
    except ValueError:     # Unknown, or no limit
        return None


def cancel_step(job_id: str, name: str, sig: Optional[int] = None) -> Optional[bool]:
    """scancel the step of this job named ``name`` (or send it ``sig``), if Slurm still
    lists it: whether scancel succeeded, None when the step is not listed (or squeue failed)."""
    try:
        res = slurmctl.client("squeue", "-h", "-s", "-j", job_id, "-o", "%i %j", timeout=20)
    except Exception:      # noqa: BLE001 - best effort while stopping
        return None
    for line in res.stdout.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[1] == name:
            how = [f"--signal={signal.Signals(sig).name[3:]}"] if sig else []
            return slurmctl.client("scancel", *how, parts[0], timeout=20).returncode == 0
    return None
