"""Which log dir ``fluidctl report JOB`` reads: JOB as ``fluidctl job`` names jobs (a Slurm job
id submitted from here: its own LOG_DIR/slurm-JOBID), or a log dir path (a local, ssh, fabric
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
    owner = None
    if not _path_like(job):
        from fluidctl import backends       # as `fluidctl job` finds a job by its id
        try:
            owner = backends.owner_of(job)
        except UsageError:
            pass
    if owner is not None and owner.name == "slurm" and job.isdigit():
        return _slurm(job)
    if owner is not None and owner.name == "k8s":
        raise UsageError(f"no log dir {job} (and a Kubernetes job KIND/NAME keeps its logs "
                         "in its pods)", f"give the job's --log-dir, or for a Kubernetes job "
                         f"use 'fluidctl job logs {job}'")
    raise UsageError(f"no job {job!r}: no such log dir, nor a Slurm job id",
                     "give the job's --log-dir (e.g. mylog) or a Slurm job id from "
                     "'fluidctl job list'")


def _path_like(job: str) -> bool:
    """A path, not a job's name: Kubernetes jobs are KIND/NAME, Slurm's a number."""
    return job.startswith(("/", ".", "~")) or job.count("/") > 1


def _slurm(job_id: str) -> LogLayout:
    """A Slurm job fluidctl submitted from here: its run dir, from the job's record."""
    from fluidctl.backends.slurm import slurmctl
    layout = slurmctl.load_record(job_id).run_layout
    if not has_job(layout):
        raise UsageError(f"Slurm job {job_id} has left no logs yet in {layout.root}",
                         f"wait until it starts ('fluidctl job status {job_id}')")
    return layout
