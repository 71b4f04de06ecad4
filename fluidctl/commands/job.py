"""``fluidctl job list | status | logs | checkpoint | cancel``: options and help only; the work is
the job verbs of the backend whose job it is (``fluidctl.backends.owner_of(JOB_ID)``: its
package's ``jobs.py``; e.g. the Slurm jobs ``fluidctl train --backend slurm`` submitted from this
machine, read without sacct, or the Kubernetes jobs named KIND/NAME).
"""
from __future__ import annotations

import click


def _verb(job_id: str, verb: str):
    """One verb of ``job_id``'s backend; one line when that backend has no such verb."""
    from fluidctl import backends
    from fluidctl.errors import UsageError
    owner = backends.owner_of(job_id)
    fn = getattr(owner.verbs(), verb, None)
    if fn is None:
        raise UsageError(f"fluidctl job {verb} does not know {owner.title} jobs",
                         f"use the tools of --backend {owner.name}")
    return fn


@click.group(help="""Slurm jobs submitted with 'fluidctl train --backend slurm' (from a login
node), and Kubernetes jobs submitted with 'fluidctl train --backend k8s --apply' (named
KIND/NAME, e.g. pytorchjob/bert; through your kubeconfig): their state, logs, and cancelling
them. No sacct needed.

\b
Examples:
  fluidctl job list
  fluidctl job status 1234 --json
  fluidctl job logs 1234 -f --rank 3
  fluidctl job checkpoint 1234
  fluidctl job cancel 1234
  fluidctl job status pytorchjob/bert --namespace ml-team""")
def job():
    pass


@job.command("list")
@click.option("--json", "as_json", is_flag=True, help="Print JSON, e.g. fluidctl job list --json.")
@click.option("--k8s", is_flag=True,
              help="List the Kubernetes jobs fluidctl submitted (every namespace, or "
                   "--namespace), through your kubeconfig, e.g. --k8s.")
@click.option("--namespace", default=None, help="With --k8s: only this namespace.")
def list_jobs(as_json, k8s, namespace):
    """Every recorded job, newest first, with its state now.

    \b
    Example:
      fluidctl job list --json | jq '.[] | select(.state == "RUNNING") | .job_id'
    """
    from fluidctl import backends
    backends.backend("k8s" if k8s else "slurm").verbs().list_jobs(as_json, namespace=namespace)


@job.command("status")
@click.argument("job_id")
@click.option("--json", "as_json", is_flag=True,
              help="Print JSON, e.g. fluidctl job status 1234 --json.")
@click.option("--namespace", default="default", show_default=True,
              help="Kubernetes jobs (KIND/NAME): their namespace, e.g. --namespace ml-team.")
def status(job_id, as_json, namespace):
    """State of one job: PENDING (and why), RUNNING (where), or how it ended and its exit code.
    Exits 0 for a job that is queued, running or completed, 1 for one that failed or was
    cancelled (also once Slurm has forgotten it: fluidctl records how it ended).

    \b
    Example:
      fluidctl job status 1234
    """
    _verb(job_id, "status")(job_id, as_json=as_json, namespace=namespace)


@job.command("logs")
@click.argument("job_id")
@click.option("--rank", type=click.IntRange(0), default=0, show_default=True,
              help="Whose log: workerlog.RANK in the job's log dir, e.g. --rank 3.")
@click.option("--batch", is_flag=True,
              help="Show the batch script's own output (slurm-JOBID.out) instead of a rank's.")
@click.option("-f", "--follow", is_flag=True,
              help="Keep printing until the job ends, then exit with its exit code.")
@click.option("--namespace", default="default", show_default=True,
              help="Kubernetes jobs: their namespace; --rank N shows the N-th pod's log (all "
                   "of its processes), e.g. --namespace ml-team.")
def logs(job_id, rank, batch, follow, namespace):
    """Print a rank's log (rank 0 by default); -f follows it while the job runs.

    \b
    Examples:
      fluidctl job logs 1234
      fluidctl job logs 1234 -f --rank 3
    """
    _verb(job_id, "logs")(job_id, rank=rank, batch=batch, follow=follow, namespace=namespace)


@job.command("checkpoint")
@click.argument("job_id")
@click.option("--stop", is_flag=True,
              help="End the job after the checkpoint; it is requeued (Slurm), or exits 75, "
                   "and resumes from it when run again.")
@click.option("--namespace", default="default", show_default=True,
              help="Kubernetes jobs (KIND/NAME): their namespace, e.g. --namespace ml-team.")
def checkpoint(job_id, stop, namespace):
    """Ask a running job for a checkpoint: every rank that calls
    ctx.checkpoint_requested() saves at the same step (fluidctl.runtime.checkpoint) and goes
    on. JOB_ID: a Slurm job's id, the --log-dir of a job fluidctl runs from this machine
    (local, ssh, fabric, mpi), or a Kubernetes job's KIND/NAME (its pods see the request
    within about a minute).

    \b
    Examples:
      fluidctl job checkpoint 1234
      fluidctl job checkpoint 1234 --stop
      fluidctl job checkpoint mylog
      fluidctl job checkpoint pytorchjob/bert --namespace ml-team
    """
    _verb(job_id, "checkpoint")(job_id, stop=stop, namespace=namespace)


@job.command("cancel")
@click.argument("job_id")
@click.option("--namespace", default="default", show_default=True,
              help="Kubernetes jobs (KIND/NAME): their namespace, e.g. --namespace ml-team.")
def cancel(job_id, namespace):
    """Cancel a job (scancel: every step and the batch script get SIGTERM, then SIGKILL).

    \b
    Example:
      fluidctl job cancel 1234
    """
    _verb(job_id, "cancel")(job_id, namespace=namespace)
