"""Which log dir ``fluidctl report JOB`` reads: JOB as ``fluidctl job`` names jobs (its
backend's ``log_dir`` verb: a Slurm job id submitted from here has LOG_DIR/slurm-JOBID), or a
log dir path (a local, ssh, fabric
or mpi job's --log-dir, or any directory a launcher wrote)."""
from __future__ import annotations

from pathlib import Path

from fluidctl.errors import UsageError
from fluidctl.paths import LogLayout

# what a launcher leaves in a log dir: one of these makes it a job's
MARKS = ("launch.log", "events.jsonl", "failure.json", "steptimes.jsonl", "job.json")


def has_job(layout: LogLayout) -> bool:
    return any((layout.root / name).is_file() for name in MARKS)


def locate(job: str) -> LogLayout:
    """The job's log dir; UsageError (one line, exit 2) when there is no such job, or it left
    nothing to report on."""
    path = Path(job).expanduser()
    if path.exists():
        if not path.is_dir():
            raise UsageError(f"{job} is a file, not a job's log dir",
                             "give the job's --log-dir (e.g. mylog) or a Slurm job id")
        layout = LogLayout(path)
        if not has_job(layout):
            raise UsageError(f"{job} holds no job's logs (no launch.log, events.jsonl or "
                             "failure.json)", "give the --log-dir the job was started with")
        return layout
    if _job_name(job):
        from fluidctl import backends       # as `fluidctl job` finds a job by its id
        try:
            owner = backends.owner_of(job)
        except UsageError:
            owner = None
        log_dir = getattr(owner.verbs(), "log_dir", None) if owner is not None else None
        if log_dir is not None:
            return _of_record(job, LogLayout(Path(log_dir(job))))
        if owner is not None and "/" in job:
            raise UsageError(f"no log dir {job}, and fluidctl report cannot read "
                             f"{owner.title} jobs (their logs are not in a log dir here)",
                             f"give the job's --log-dir, or use 'fluidctl job logs {job}'")
    raise UsageError(f"no job {job!r}: no such log dir, nor a Slurm job id",
                     "give the job's --log-dir (e.g. mylog) or a Slurm job id from "
                     "'fluidctl job list'")


def _job_name(job: str) -> bool:
    """A job's name (a number, KIND/NAME), not a path: a missing log dir is said as such."""
    return job.isdigit() or (job.count("/") == 1 and not job.startswith(("/", ".", "~"))
                             and not job.endswith("/"))


def _of_record(job_id: str, layout: LogLayout) -> LogLayout:
    """A submitted job's own log dir, once it has started writing there."""
    if not has_job(layout):
        raise UsageError(f"job {job_id} has left no logs yet in {layout.root}",
                         f"wait until it starts ('fluidctl job status {job_id}')")
    return layout
