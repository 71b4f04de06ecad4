"""``fluidctl job list | status | logs | cancel``: the Slurm jobs ``fluidctl train --backend
slurm`` submitted from this machine (records under ``fluidctl.paths.jobs_dir()``).

Works without Slurm's accounting database (sacct): state comes from squeue, scontrol show job
and the exit-code file the batch script leaves (see ``backends/slurmctl.py``).
"""
from __future__ import annotations

import json
import sys
import time

import click

from fluidctl.backends import slurmctl
from fluidctl.errors import UsageError


def _row(record: slurmctl.JobRecord, st: slurmctl.JobState) -> dict:
    return {"job_id": record.job_id, "name": record.name, "state": st.state,
            "exit_code": st.exit_code, "nodes": st.nodes, "reason": st.reason,
            "source": st.source, "submitted": record.submitted, "log_dir": record.log_dir,
            "script": record.script, "workdir": record.workdir, "num_nodes": record.nodes,
            "ntasks_per_node": record.ntasks_per_node}


def follow_job(record: slurmctl.JobRecord, sources, out=None) -> slurmctl.JobState:
    """Echo ``sources`` ([(log path, prefix)]) while the job runs; its final state at the end."""
    from fluidctl.launch.echo import LogEcho
    echo = LogEcho([(str(p), prefix) for p, prefix in sources], out=out)
    echo.start()
    try:
        return slurmctl.wait_done(record)
    finally:
        echo.finish()


def _console():
    from fluidctl.console import console
    return console()


@click.group(help="""Slurm jobs submitted with 'fluidctl train --backend slurm' (from a login
node): their state, logs, and cancelling them. No sacct needed.

\b
Examples:
  fluidctl job list
  fluidctl job status 1234 --json
  fluidctl job logs 1234 -f --rank 3
  fluidctl job cancel 1234""")
def job():
    pass


@job.command("list")
@click.option("--json", "as_json", is_flag=True, help="Print JSON, e.g. fluidctl job list --json.")
def list_jobs(as_json):
    """Every recorded job, newest first, with its state now.

    \b
    Example:
      fluidctl job list --json | jq '.[] | select(.state == "RUNNING") | .job_id'
    """
    records = slurmctl.list_records()
    found = slurmctl.states(records) if records else {}
    rows = [_row(r, found[r.job_id]) for r in records]
    if as_json:
        click.echo(json.dumps(rows, indent=1))
        return
    if not rows:
        from fluidctl import paths
        _console().print(f"no jobs recorded (under {paths.jobs_dir()})", markup=False)
        return
    from rich.table import Table
    table = Table(title="fluidctl Slurm jobs")
    for column in ("job", "name", "state", "exit", "nodes", "submitted", "log dir"):
        table.add_column(column, overflow="fold")
    for row in rows:
        table.add_row(row["job_id"], row["name"], row["state"] + (
            f" ({row['reason']})" if row["reason"] else ""),
            "" if row["exit_code"] is None else str(row["exit_code"]), row["nodes"],
            time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(row["submitted"])),
            row["log_dir"])
    _console().print(table)


@job.command("status")
@click.argument("job_id")
@click.option("--json", "as_json", is_flag=True,
              help="Print JSON, e.g. fluidctl job status 1234 --json.")
def status(job_id, as_json):
    """State of one job: PENDING (and why), RUNNING (where), or how it ended and its exit code.
    Exits 0 for a job that is queued, running or completed, 1 for one that failed or was
    cancelled (also once Slurm has forgotten it: fluidctl records how it ended).

    \b
    Example:
      fluidctl job status 1234
    """
    record = slurmctl.load_record(job_id)
    st = slurmctl.state(record)
    row = _row(record, st)
    if as_json:
        click.echo(json.dumps(row, indent=1))
    else:
        text = f"job {job_id} ({record.name}): {st.state}"
        if st.reason:
            text += f" ({st.reason})"
        if st.nodes:
            text += f" on {st.nodes}"
        if st.exit_code is not None:
            text += f", exit code {st.exit_code}"
        click.echo(text)
        click.echo(f"logs: {record.log_dir}   script: {record.script}")
    if st.failed:
        sys.exit(1)


@job.command("logs")
@click.argument("job_id")
@click.option("--rank", type=click.IntRange(0), default=0, show_default=True,
              help="Whose log: workerlog.RANK in the job's log dir, e.g. --rank 3.")
@click.option("--batch", is_flag=True,
              help="Show the batch script's own output (slurm-JOBID.out) instead of a rank's.")
@click.option("-f", "--follow", is_flag=True,
              help="Keep printing until the job ends, then exit with its exit code.")
def logs(job_id, rank, batch, follow):
    """Print a rank's log (rank 0 by default); -f follows it while the job runs.

    \b
    Examples:
      fluidctl job logs 1234
      fluidctl job logs 1234 -f --rank 3
    """
    record = slurmctl.load_record(job_id)
    layout = record.layout
    path = layout.slurm_output_of(job_id) if batch else layout.worker(rank)
    if not follow:
        try:
            with open(path, "rb") as f:
                for chunk in iter(lambda: f.read(1 << 16), b""):
                    sys.stdout.buffer.write(chunk)
            sys.stdout.flush()
        except FileNotFoundError:
            st = slurmctl.state(record)
            raise UsageError(f"{path} does not exist (job {job_id} is {st.state})",
                             "a rank's log appears once the job runs; --rank N picks another "
                             "rank, --batch the batch script's output") from None
        return
    try:
        st = follow_job(record, [(path, "")])
    except KeyboardInterrupt:
        click.echo(slurmctl.how_to_follow(job_id), err=True)
        sys.exit(130)
    click.echo(f"fluidctl: job {job_id} {st.state}" + (
        f", exit code {st.exit_code}" if st.exit_code is not None else ""), err=True)
    sys.exit(st.exit_code or 0)


@job.command("cancel")
@click.argument("job_id")
def cancel(job_id):
    """Cancel a job (scancel: every step and the batch script get SIGTERM, then SIGKILL).

    \b
    Example:
      fluidctl job cancel 1234
    """
    record = slurmctl.load_record(job_id)
    st = slurmctl.state(record)
    if st.done:
        click.echo(f"job {job_id} already ended: {st.state}")
        return
    slurmctl.cancel(record)
    click.echo(f"cancelled job {job_id}")
