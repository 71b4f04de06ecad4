"""``fluidctl job list | status | logs | cancel``, without click: the Slurm jobs submitted from
this machine (records under ``fluidctl.paths.jobs_dir()``).

Works without Slurm's accounting database (sacct): state comes from squeue, scontrol show job
and the exit-code file the batch script leaves (``fluidctl.backends.slurm.slurmctl``).
"""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from fluidctl.backends.slurm import slurmctl
from fluidctl.errors import UsageError
from fluidctl.launch import requests


def _row(record: slurmctl.JobRecord, st: slurmctl.JobState) -> dict:
    commit = requests.last_commit(record.run_layout) or {}
    return {"job_id": record.job_id, "name": record.name, "state": st.state,
            "requeues": st.restarts, "checkpoint_step": commit.get("step"),
            "checkpoint_dir": commit.get("dir"),
            "exit_code": st.exit_code, "nodes": st.nodes, "reason": st.reason,
            "source": st.source, "submitted": record.submitted,
            "log_dir": record.run_dir or record.log_dir, "why": _why(record, st),
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


def owns(job_id: str) -> bool:
    """A Slurm job id (a KIND/NAME is a Kubernetes job's)."""
    return "/" not in job_id


def list_jobs(as_json: bool = False, **_) -> None:
    """Every recorded job, newest first, with its state now: a table, or JSON."""
    records = slurmctl.list_records()
    found = slurmctl.states(records) if records else {}
    rows = [_row(r, found[r.job_id]) for r in records]
    if as_json:
        print(json.dumps(rows, indent=1), flush=True)
        return
    if not rows:
        from fluidctl import paths
        _console().print(f"no jobs recorded (under {paths.jobs_dir()})", markup=False)
        return
    from fluidctl.tables import print_table      # plain columns into a pipe or a file
    print_table("fluidctl Slurm jobs",
                ("job", "name", "state", "exit", "nodes", "submitted", "log dir"),
                [(row["job_id"], row["name"], row["state"] + (
                    f" ({row['reason']})" if row["reason"] else ""),
                  "" if row["exit_code"] is None else str(row["exit_code"]), row["nodes"],
                  time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(row["submitted"])),
                  row["log_dir"]) for row in rows])


def status(job_id: str, as_json: bool = False, **_) -> None:
    """One job's state; exit 1 for a job that failed or was cancelled (also once Slurm has
    forgotten it: fluidctl records how it ended)."""
    record = slurmctl.load_record(job_id)
    st = slurmctl.state(record)
    if as_json:
        print(json.dumps(_row(record, st), indent=1), flush=True)
    else:
        text = f"job {job_id} ({record.name}): {st.state}"
        if st.reason:
            text += f" ({st.reason})"
        if st.nodes:
            text += f" on {st.nodes}"
        if st.exit_code is not None:
            text += f", exit code {st.exit_code}"
        print(text)
        if st.restarts:
            print(f"requeued: {st.restarts} time(s)")
        commit = requests.last_commit(record.run_layout)
        if commit:
            when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(commit.get("time", 0)))
            print(f"last checkpoint: step {commit.get('step')} at {when} ({commit.get('dir')})")
        why = _why(record, st)
        if why:
            print(f"why: {why}")
        print(f"logs: {record.run_dir or record.log_dir}   script: {record.script}", flush=True)
    if st.failed:
        sys.exit(1)


def _why(record: slurmctl.JobRecord, st: slurmctl.JobState) -> str:
    """For a failed job: the failing rank, its node and code, and the cause (what the report
    of its follower said), from the logs the job left."""
    if not st.failed or st.state == "CANCELLED":
        return ""
    from fluidctl.backends.slurm.launcher import submitted_failure
    failure = submitted_failure(record, st.state, st.exit_code)
    if failure.label.startswith("slurm job"):
        return failure.explanation or failure.detail
    why = f"{failure.label} on {failure.host} exited with code {failure.exit_code}"
    if not failure.explanation:
        from fluidctl.diagnostics import triage
        from fluidctl.diagnostics.failures import log_tail
        try:
            failure.explanation = triage.explain(failure.exit_code,
                                                 log_tail(failure.log, 40)).text
        except Exception:           # noqa: BLE001 - best effort, the log may be gone
            pass
    if failure.explanation:
        why += f": {failure.explanation}"
    return why + f" (log {failure.log})"


def log_dir(job_id: str, **_) -> str:
    """The job's own log dir (LOG_DIR/slurm-JOBID), where its launcher writes live.json
    (``fluidctl top``) and its reports (``fluidctl report``)."""
    return str(slurmctl.load_record(job_id).run_layout.root)


def logs(job_id: str, rank: int = 0, batch: bool = False, follow: bool = False, **_) -> None:
    """Print a rank's log (or the batch script's output); ``follow``: until the job ends, then
    exit with its exit code (130 on Ctrl-C, after saying how to follow it again)."""
    record = slurmctl.load_record(job_id)
    path = record.layout.slurm_output_of(job_id) if batch else record.run_layout.worker(rank)
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
        print(f"fluidctl: {slurmctl.stopped_following(job_id)}", file=sys.stderr, flush=True)
        sys.exit(130)
    print(f"fluidctl: job {job_id} {st.state}" + (
        f", exit code {st.exit_code}" if st.exit_code is not None else ""), file=sys.stderr,
        flush=True)
    sys.exit(st.exit_code or 0)


def checkpoint(job_id: str, stop: bool = False, **_) -> None:
    """Ask a running job's ranks for a checkpoint (the request file they poll, in the job's
    log dir); with ``stop`` they end after it and the job is requeued."""
    record = slurmctl.load_record(job_id)
    st = slurmctl.state(record)
    if st.state != "RUNNING":
        raise UsageError(f"job {job_id} is {st.state}, not RUNNING",
                         "a checkpoint is asked of a running job; 'fluidctl job status "
                         f"{job_id}' shows its state")
    path = requests.ask(record.run_layout, requests.STOP if stop else requests.SAVE,
                        "fluidctl job checkpoint")
    then = ", then stops and is requeued" if stop else " and goes on"
    print(f"asked job {job_id} for a checkpoint ({path}): every rank saves at the same step"
          f"{then}; 'fluidctl job status {job_id}' shows the last committed step", flush=True)


def cancel(job_id: str, **_) -> None:
    """scancel the job, unless it already ended."""
    record = slurmctl.load_record(job_id)
    st = slurmctl.state(record)
    if st.done:
        print(f"job {job_id} already ended: {st.state}", flush=True)
        return
    slurmctl.cancel(record)
    print(f"cancelled job {job_id}", flush=True)
