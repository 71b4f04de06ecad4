"""Slurm from the outside: its client commands, the batch script, and the records of submitted
jobs (what ``fluidctl train --backend slurm`` writes from a login node and ``fluidctl job``
reads).

Nothing here needs Slurm's accounting database: a job's state comes from ``squeue`` while it is
queued or running, then from ``scontrol show job`` (slurmctld remembers finished jobs for
MinJobAge, 300 s by default), then from the exit-code file the batch script itself leaves in
LOG_DIR. ``squeue --json`` is avoided on purpose: its shape changes across Slurm versions; the
``-o`` format letters used here have not changed in a decade.
"""
from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import time
from dataclasses import MISSING, asdict, dataclass, field
from pathlib import Path
from typing import Dict, Iterable, List, Optional, Sequence

from fluidctl import envs, paths
from fluidctl.errors import REQUEUE_EXIT, FluidctlError, UsageError
from fluidctl.backends.slurm.plan import SlurmOptions

FINISHED = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "PREEMPTED",
            "OUT_OF_MEMORY", "BOOT_FAIL", "DEADLINE")
POLL = 0.5                     # seconds between state queries while following a job


# --- the client commands -------------------------------------------------------------------
def find(tool: str) -> str:
    path = shutil.which(tool)
    if path is None:
        raise UsageError(f"Slurm's {tool} is not installed or not on PATH",
                         "run on a Slurm login or compute node; Debian: apt-get install "
                         "slurm-client")
    return path


def client(*argv: str, timeout: float = 60) -> subprocess.CompletedProcess:
    """Run one Slurm client command (text output); a missing tool is a UsageError."""
    try:
        return subprocess.run([find(argv[0]), *argv[1:]], capture_output=True, text=True,
                              timeout=timeout, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        raise FluidctlError(f"{argv[0]} did not answer within {timeout:g}s",
                            "is slurmctld reachable? try 'scontrol ping'", exit_code=1) from None


def first_error_line(text: str) -> str:
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    errors = [ln for ln in lines if "error" in ln.lower()]
    return (errors or lines or ["no output"])[0]


# --- the batch script ----------------------------------------------------------------------
@dataclass(frozen=True)
class SbatchSpec:
    """What the batch script asks for and runs. ``command`` runs inside the allocation (one
    ``fluidctl train --backend slurm`` there, which starts the srun step)."""
    job_name: str
    nodes: int
    ntasks_per_node: int
    command: Sequence[str]
    workdir: str
    output: str                 # may hold %j (the job id), as sbatch --output does
    exit_file: str              # may hold %j too
    gpus_per_node: int = 0
    options: SlurmOptions = SlurmOptions()   # partition, time, ...; slurm_args: #SBATCH lines
    header: str = ""


# At most this many requeues (SLURM_RESTART_COUNT, Slurm's own preemptions included): a week at
# a 2-hour time limit is 84. A job that checkpoints on request and is requeued more often than
# that is looping, and ends with 75.
REQUEUE_LIMIT = 100


def _job_path(template: str) -> str:
    """A path for the shell with %j replaced by the running job's id."""
    parts = template.split("%j")
    return '"$SLURM_JOB_ID"'.join(shlex.quote(p) if p else "" for p in parts)


def _one_line(value: str, what: str) -> None:
    """A line break would end the #SBATCH line and run the rest as a command of the script."""
    if any(c in value for c in "\n\r\0"):
        raise UsageError(f"{what} {value!r} holds a line break: one #SBATCH line cannot",
                         f"pass {what} without line breaks")


def _sbatch_word(value: str, what: str) -> str:
    """``value`` as one word of an #SBATCH line: sbatch splits such a line at blanks, groups
    with double quotes, takes a backslash as an escape and '#' outside quotes as a comment."""
    _one_line(value, what)
    if value and not any(c in value for c in " \t\"\\#'"):
        return value
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _sbatch_arg(arg: str) -> str:
    """A --slurm-arg as an #SBATCH line's words: ``--name=value`` gets its value quoted (a
    comment with blanks stays one value); other forms (``-p gpu``) go as they are."""
    _one_line(arg, "--slurm-arg")
    name, eq, value = arg.partition("=")
    return f"{name}={_sbatch_word(value, '--slurm-arg')}" if arg.startswith("--") and eq \
        else arg


def sbatch_script(spec: SbatchSpec) -> str:
    """The batch script, as text (pure: golden-tested)."""
    lines = ["#!/bin/bash"]
    if spec.header:
        lines += [f"# {line}" if line else "#" for line in spec.header.splitlines()]
    directives = [("job-name", spec.job_name), ("nodes", str(spec.nodes)),
                  ("ntasks-per-node", str(spec.ntasks_per_node))]
    if spec.gpus_per_node:
        directives.append(("gpus-per-node", str(spec.gpus_per_node)))
    for name in ("partition", "time", "account", "qos", "constraint", "exclude"):
        value = getattr(spec.options, name)
        if value:
            directives.append((name, value))
    warning = spec.options.checkpoint_warning
    if warning:         # Slurm's warning signal to the batch shell, which forwards it below
        directives += [("signal", f"B:USR1@{warning}"), ("requeue", "")]
    directives += [("output", spec.output), ("open-mode", "append"),
                   ("chdir", spec.workdir)]
    lines += [f"#SBATCH --{name}={_sbatch_word(value, '--' + name)}" if value
              else f"#SBATCH --{name}" for name, value in directives]
    lines += [f"#SBATCH {_sbatch_arg(arg)}" for arg in spec.options.slurm_args]
    exit_file = _job_path(spec.exit_file)
    requeue_file = _job_path(spec.exit_file + ".requeue")
    words = [shlex.quote(word) for word in spec.command]
    if "--log-dir" in spec.command:           # the job's own log dir: LOG_DIR/slurm-%j
        at = list(spec.command).index("--log-dir") + 1
        words[at] = _job_path(spec.command[at])
    lines += [
        "",
        # a requeued run must not look ended by the last one's code, nor requeued by it
        f"rm -f {exit_file} {requeue_file}",
        f"export {envs.REQUEUE_FILE}={requeue_file}",
        # fluidctl runs in the background so that a USR1 (Slurm's warning signal,
        # scancel --batch --signal=USR1) reaches it now, not when it has ended: a request
        'trap \'kill -USR1 "$pid" 2>/dev/null\' USR1',
        " ".join(words) + " &",
        "pid=$!",
        'while kill -0 "$pid" 2>/dev/null; do wait "$pid"; done',
        'wait "$pid"; code=$?',
        # checkpointed on request (fluidctl left the requeue file; a script's own 75 does
        # not): Slurm runs the job again, once eligible (slurmctld holds a requeued job for
        # AuthInfo's cred_expire, 120 s by default), at most REQUEUE_LIMIT times
        f'if [ "$code" = {REQUEUE_EXIT} ] && [ -f {requeue_file} ]; then',
        f'  if [ "${{SLURM_RESTART_COUNT:-0}}" -ge {REQUEUE_LIMIT} ]; then',
        f'    echo "fluidctl: requeued {REQUEUE_LIMIT} times already: not requeued again" >&2',
        '  elif scontrol requeue "$SLURM_JOB_ID"; then',
        "    exit 0",
        "  fi",
        "fi",
        f'echo "$code" > {exit_file}.tmp && mv -f {exit_file}.tmp {exit_file}',
        'exit "$code"',
        "",
    ]
    return "\n".join(lines)


# --- records of submitted jobs -------------------------------------------------------------
@dataclass
class JobRecord:
    job_id: str
    name: str
    script: str
    log_dir: str
    workdir: str
    nodes: int
    ntasks_per_node: int
    submitted: float = field(default_factory=time.time)
    command: List[str] = field(default_factory=list)
    cluster: str = ""
    # how the job ended, as fluidctl saw it (the follower, `job status`, `job cancel`): what
    # `job status` shows once Slurm has forgotten the job (MinJobAge, no sacct)
    final_state: str = ""
    final_exit_code: Optional[int] = None
    cancelled: float = 0.0      # when `fluidctl job cancel` cancelled it
    run_dir: str = ""           # the job's own logs (LOG_DIR/slurm-JOBID); older records: log_dir

    def save(self) -> Path:
        path = paths.job_record(self.job_id)
        path.parent.mkdir(parents=True, exist_ok=True)
        paths.write_atomic(path, json.dumps(asdict(self), indent=1) + "\n", 0o644)
        return path

    @property
    def layout(self) -> paths.LogLayout:
        """LOG_DIR: the batch script, its output and exit file."""
        return paths.LogLayout(Path(self.log_dir))

    @property
    def run_layout(self) -> paths.LogLayout:
        """The job's own log dir: workerlog.N, srun.log, failure.json."""
        return paths.LogLayout(Path(self.run_dir or self.log_dir))


def load_record(job_id: str) -> JobRecord:
    path = paths.job_record(job_id)
    try:
        data = json.loads(paths.read_state_file(path))
    except FileNotFoundError:
        raise UsageError(f"no job {job_id} was submitted by fluidctl (no {path})",
                         "'fluidctl job list' shows the recorded jobs") from None
    except (OSError, ValueError) as exc:
        raise UsageError(f"cannot read the record {path}: {exc}",
                         "remove it if it is damaged") from None
    wrong = _record_shape(data)
    if wrong:
        raise UsageError(f"the record {path} is not a job record ({wrong})",
                         "remove it if it is damaged")
    return JobRecord(**{k: v for k, v in data.items() if k in JobRecord.__dataclass_fields__})


_SHAPES = {"str": (str,), "int": (int,), "float": (int, float), "Optional[int]": (int, type(None)),
           "List[str]": (list,)}


def _record_shape(data) -> str:
    """What is wrong with the shape of a job record read from disk ("" when nothing): an
    object with each field of its type, the fields without a default present."""
    if not isinstance(data, dict):
        return f"a JSON {type(data).__name__}, not an object"
    for name, spec in JobRecord.__dataclass_fields__.items():
        if name not in data:
            if spec.default is MISSING and spec.default_factory is MISSING:
                return f"no {name!r}"
            continue
        kinds = _SHAPES.get(str(spec.type), (object,))
        value = data[name]
        if not isinstance(value, kinds) or isinstance(value, bool):
            return f"{name!r} is {type(value).__name__}"
    return ""


def list_records() -> List[JobRecord]:
    records = []
    for path in paths.jobs_dir().glob("slurm-*.json"):
        try:
            records.append(load_record(path.stem.split("-", 1)[1]))
        except UsageError:
            continue
    return sorted(records, key=lambda r: r.submitted, reverse=True)


def _refused(res) -> UsageError:
    """sbatch's refusal in one line, with the options that can cause it: a directive sbatch
    cannot parse comes from --slurm-arg, not from --partition."""
    why = first_error_line(res.stderr + res.stdout)
    if "directive" in why.lower():
        return UsageError(f"sbatch refused the job: {why}",
                          "check each --slurm-arg: one sbatch option per --slurm-arg, as "
                          "--slurm-arg=--mail-type=END")
    return UsageError(f"sbatch refused the job: {why}",
                      "check --partition, --time, --account, --qos, --constraint and "
                      "--slurm-arg; 'sinfo' lists partitions")


def test_only(spec: SbatchSpec) -> None:
    """``sbatch --test-only`` the script (read from stdin): Slurm checks the partition, time
    limit, account, QOS and constraints without submitting. A refusal is a UsageError with
    sbatch's own reason, before anything is written."""
    find("sbatch")
    try:
        res = subprocess.run([find("sbatch"), "--test-only"], input=sbatch_script(spec),
                             capture_output=True, text=True, timeout=60)
    except subprocess.TimeoutExpired:
        raise FluidctlError("sbatch --test-only did not answer within 60s",
                            "is slurmctld reachable? try 'scontrol ping'", exit_code=1) from None
    if res.returncode != 0:
        raise _refused(res)


def submit(spec: SbatchSpec, layout: paths.LogLayout, cluster: str = "") -> JobRecord:
    """Write the script, ``sbatch --parsable`` it, keep it as LOG_DIR/slurm-JOBID.sbatch and
    record the job (its own logs in LOG_DIR/slurm-JOBID/). A refusal (no such partition, bad
    --time, ...) is a UsageError carrying sbatch's own reason."""
    pending = layout.sbatch_pending()
    paths.write_atomic(pending, sbatch_script(spec), 0o755)
    try:
        res = client("sbatch", "--parsable", str(pending))
        if res.returncode != 0:
            raise _refused(res)
        job_id = res.stdout.strip().split(";")[0]
        if not job_id.isdigit():
            raise FluidctlError(f"sbatch answered {res.stdout.strip()!r}, not a job id",
                                "is this sbatch Slurm's?", exit_code=1)
        script = layout.sbatch_script_of(job_id)
        os.replace(pending, script)           # Slurm keeps its own copy of what it was given
    finally:
        try:
            os.unlink(pending)
        except OSError:
            pass
    record = JobRecord(job_id=job_id, name=spec.job_name, script=str(script),
                       log_dir=str(layout.root), workdir=spec.workdir, nodes=spec.nodes,
                       ntasks_per_node=spec.ntasks_per_node, command=list(spec.command),
                       cluster=cluster, run_dir=str(layout.slurm_job(job_id).root))
    record.save()
    return record


# --- job state without sacct ---------------------------------------------------------------
@dataclass
class JobState:
    job_id: str
    state: str                   # Slurm's JobState, or UNKNOWN
    exit_code: Optional[int] = None
    nodes: str = ""
    reason: str = ""
    source: str = ""             # squeue | scontrol | exit-file | none
    restarts: Optional[int] = None   # how often Slurm requeued it (scontrol's Restarts)

    @property
    def done(self) -> bool:
        return self.state in FINISHED or self.state == "UNKNOWN"

    @property
    def failed(self) -> bool:
        """Ended otherwise than COMPLETED with code 0 (failed, cancelled, timed out, ...)."""
        return self.state in FINISHED and (self.state != "COMPLETED" or bool(self.exit_code))


_SQUEUE_FORMAT = "%i|%T|%r|%N"


def _squeue(job_ids: Iterable[str]) -> Dict[str, JobState]:
    """One squeue call for every job still queued or running (unknown ids are just absent)."""
    wanted = set(job_ids)
    if not wanted:
        return {}
    res = client("squeue", "-h", "-a", "-o", _SQUEUE_FORMAT)
    if res.returncode != 0:
        raise FluidctlError(f"squeue failed: {first_error_line(res.stderr)}",
                            "is slurmctld reachable? try 'scontrol ping'", exit_code=1)
    found = {}
    for line in res.stdout.splitlines():
        parts = line.strip().split("|")
        if len(parts) == 4 and parts[0] in wanted:
            reason = "" if parts[2] in ("None", "(null)") else parts[2]
            found[parts[0]] = JobState(parts[0], parts[1], None, parts[3], reason, "squeue")
    return found


_KEY_VALUE = re.compile(r"(\w[\w/:]*)=(\S*)")


def parse_scontrol(text: str) -> Dict[str, str]:
    """``scontrol show job -o`` -> {key: value} (values with spaces keep their first word)."""
    return {k: v for k, v in _KEY_VALUE.findall(text)}


def exit_code_of(state: str, exit_field: str) -> int:
    """scontrol's ExitCode=N:S -> a shell exit code (128+S for a signal)."""
    code, _, sig = exit_field.partition(":")
    code_i, sig_i = int(code or 0), int(sig or 0)
    if code_i:
        return code_i
    if sig_i:
        return 128 + sig_i
    return 0 if state == "COMPLETED" else 1


def _scontrol(job_id: str) -> Optional[JobState]:
    res = client("scontrol", "show", "job", "-o", job_id)
    if res.returncode != 0:
        return None          # slurmctld forgot it (MinJobAge) or never knew it
    fields = parse_scontrol(res.stdout)
    state = fields.get("JobState", "UNKNOWN")
    code = exit_code_of(state, fields.get("ExitCode", "0:0")) if state in FINISHED else None
    reason = fields.get("Reason", "")
    restarts = fields.get("Restarts", "")
    return JobState(job_id, state, code, fields.get("NodeList", "").replace("(null)", ""),
                    "" if reason == "None" else reason, "scontrol",
                    int(restarts) if restarts.isdigit() else None)


def _from_exit_file(record: JobRecord) -> Optional[JobState]:
    try:
        code = int(record.layout.job_exit(record.job_id).read_text().strip())
    except (OSError, ValueError):
        return None
    return JobState(record.job_id, "COMPLETED" if code == 0 else "FAILED", code, "", "",
                    "exit-file")


def _from_record(record: JobRecord) -> Optional[JobState]:
    """The end fluidctl recorded (a follower's final state, or a cancel), for a job Slurm
    has forgotten."""
    if record.final_state:
        return JobState(record.job_id, record.final_state, record.final_exit_code, "", "",
                        "record")
    if record.cancelled:
        return JobState(record.job_id, "CANCELLED", 128 + 15, "", "", "record")
    return None


def record_end(record: JobRecord, st: JobState) -> None:
    """Keep a finished job's state in its record (re-read first: `job cancel` may have written
    it meanwhile), so `job status` still knows it after slurmctld has forgotten the job."""
    if st.state not in FINISHED or (record.final_state, record.final_exit_code) == (
            st.state, st.exit_code):
        return
    try:
        fresh = load_record(record.job_id)
    except UsageError:
        fresh = record
    fresh.final_state, fresh.final_exit_code = st.state, st.exit_code
    record.final_state, record.final_exit_code = st.state, st.exit_code
    try:
        fresh.save()
    except OSError:
        pass            # a read-only state dir must not end the follower


# Slurm keeps a job COMPLETING until every node confirmed the end (a node whose slurmd died
# holds it there until SlurmdTimeout marks the node down, minutes); the batch script's exit
# file, or a cancel fluidctl made, ends the job for fluidctl at once
_ENDING = ("COMPLETING", "RUNNING", "STOPPED", "SUSPENDED")


def _settle(record: JobRecord, st: Optional[JobState]) -> Optional[JobState]:
    if st is None:
        return None
    if st.state in FINISHED:
        st = _precise(record, st)
        record_end(record, st)
        return st
    if st.state in _ENDING:
        if st.state == "COMPLETING" and not record.cancelled:
            record.cancelled = _cancelled_since(record)
        if record.cancelled and st.state == "COMPLETING":
            ended = JobState(record.job_id, "CANCELLED", 128 + 15, st.nodes, "", "record")
        else:
            ended = _from_exit_file(record)
        if ended is not None:
            ended.nodes = ended.nodes or st.nodes
            ended.restarts = st.restarts
            record_end(record, ended)
            return ended
    return st


def _cancelled_since(record: JobRecord) -> float:
    """When `fluidctl job cancel` (another process) cancelled the job, from its record now."""
    try:
        return load_record(record.job_id).cancelled
    except UsageError:
        return 0.0


def _precise(record: JobRecord, st: JobState) -> JobState:
    """A finished job: the batch script's own exit file has the most precise code, unless
    Slurm ended the job itself (cancel, time limit, node failure, ...)."""
    if st.state in ("CANCELLED", "TIMEOUT", "NODE_FAIL", "PREEMPTED", "OUT_OF_MEMORY",
                    "BOOT_FAIL", "DEADLINE"):
        return st
    if record.cancelled:
        return JobState(record.job_id, "CANCELLED", st.exit_code or 128 + 15, st.nodes, "",
                        st.source)
    from_file = _from_exit_file(record)
    if from_file is not None:
        from_file.nodes, from_file.restarts = st.nodes, st.restarts
        return from_file
    return st


def _forgotten(record: JobRecord) -> JobState:
    return (_from_record(record) or _from_exit_file(record)
            or JobState(record.job_id, "UNKNOWN", None, "", "", "none"))


def states(records: Sequence[JobRecord]) -> Dict[str, JobState]:
    """The state of every recorded job: squeue, then scontrol, then what fluidctl recorded of
    its end, then the exit file."""
    found = _squeue(r.job_id for r in records)
    for record in records:
        if record.job_id in found:
            found[record.job_id] = _settle(record, found[record.job_id])
            continue
        found[record.job_id] = _settle(record, _scontrol(record.job_id)) or _forgotten(record)
    return found


def state(record: JobRecord) -> JobState:
    """One job: scontrol first (it has the exit code), then what fluidctl recorded of its end
    (the follower's final state, a cancel), then the exit file."""
    return _settle(record, _scontrol(record.job_id)) or _forgotten(record)


def cancel(record: JobRecord) -> None:
    """scancel the job, and record the cancel: a follower then ends without restarting it,
    and `job status` says CANCELLED even after Slurm has forgotten the job."""
    res = client("scancel", record.job_id)
    if res.returncode != 0:
        raise FluidctlError(f"scancel {record.job_id} failed: {first_error_line(res.stderr)}",
                            "'fluidctl job status' shows whether it still runs", exit_code=1)
    try:
        fresh = load_record(record.job_id)
    except UsageError:
        fresh = record
    fresh.cancelled = record.cancelled = time.time()
    fresh.save()


# --- following a job -----------------------------------------------------------------------
def wait_done(record: JobRecord, poll: float = POLL, on_state=None) -> JobState:
    """Poll until the job has finished (no ``sbatch --wait``: it polls every 2-10 s)."""
    last = None
    while True:
        st = state(record)
        if on_state is not None and st.state != last:
            on_state(st)
        last = st.state
        if st.done:
            return st
        time.sleep(poll)


def stopped_following(job_id: str) -> str:
    """What Ctrl-C while following a submitted job did, in one line: Slurm runs the job."""
    return (f"stopped following job {job_id}; the job keeps running in Slurm ('fluidctl job "
            f"cancel {job_id}' cancels it, 'fluidctl job logs {job_id} -f' follows it again)")


def how_to_follow(job_id: str) -> str:
    return (f"job {job_id} keeps running: 'fluidctl job logs {job_id} -f' follows it, "
            f"'fluidctl job cancel {job_id}' cancels it")
