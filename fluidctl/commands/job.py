"""``fluidctl job list | status | logs | checkpoint | cancel``: options and help only; the work is
``fluidctl.backends.slurm.jobs`` (the Slurm jobs ``fluidctl train --backend slurm`` submitted from
this machine, read without sacct).
"""
from __future__ import annotations

import click


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
    if k8s:
        from fluidctl.backends.k8s import jobs as kube
        return kube.list_jobs(namespace, as_json)
    from fluidctl.backends.slurm.jobs import list_jobs as run
    run(as_json)


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
    if "/" in job_id:
        from fluidctl.backends.k8s import jobs as kube
        return kube.status(job_id, namespace, as_json)
    from fluidctl.backends.slurm.jobs import status as run
    run(job_id, as_json)


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
    if "/" in job_id:
        from fluidctl.backends.k8s import jobs as kube
        return kube.logs(job_id, namespace, rank, follow)
    from fluidctl.backends.slurm.jobs import logs as run
    run(job_id, rank, batch, follow)


@job.command("checkpoint")
@click.argument("job_id")
@click.option("--stop", is_flag=True,
              help="End the job after the checkpoint; it is requeued and resumes from it.")
def checkpoint(job_id, stop):
    """Ask a running job for a checkpoint: every rank that calls
    ctx.checkpoint_requested() saves at the same step (fluidctl.runtime.checkpoint).

    \b
    Examples:
      fluidctl job checkpoint 1234
      fluidctl job checkpoint 1234 --stop
    """
    from fluidctl.backends.slurm.jobs import checkpoint as run
    run(job_id, stop)


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
    if "/" in job_id:
        from fluidctl.backends.k8s import jobs as kube
        return kube.cancel(job_id, namespace)
    from fluidctl.backends.slurm.jobs import cancel as run
    run(job_id)
