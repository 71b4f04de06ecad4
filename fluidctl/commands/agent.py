"""``fluidctl node-agent``: the per-node supervisor that the SSH and Fabric backends start on
each remote node (hidden from --help; users never type it).

It reads its part of the plan from a file (sent over SFTP, mode 0600: the job token is in it,
so it never shows in ``ps``), starts that node's processes with the same code as the local
launcher, and streams every line of every log back on stdout, tagged with the process it came
from. The launcher writes those lines into LOG_DIR/<host>/ and echoes rank 0. The agent exits
with the first failing process's code after printing a failure record. If its stdout breaks
(the SSH connection died) it stops its processes: nothing is left on the node.
"""
from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path

import click

from fluidctl.errors import UsageError

MARK = "@@fluidctl "          # every agent line starts with it; the rest is "<tag>|<text>"
FAILURE_TAG = "failure"
SAY_TAG = "say"
BEAT_TAG = "beat"


def tag_for(role: str, rank: int) -> str:
    return f"{role} {rank}"


def parse_line(line: str):
    """(tag, text) for an agent line, else None (an ordinary line, e.g. a Python traceback)."""
    if not line.startswith(MARK):
        return None
    tag, sep, text = line[len(MARK):].partition("|")
    return (tag, text) if sep else None


@click.command("node-agent", hidden=True)
@click.option("--plan-file", required=True, help="The node's plan (JSON), removed once read.")
def node_agent(plan_file):
    """Run this node's share of a job (started by fluidctl over SSH)."""
    from fluidctl.launch import run
    from fluidctl.launch.plan import ProcSpec
    from fluidctl.launch.supervisor import LaunchLog, RunOptions
    from fluidctl.paths import LogLayout

    try:
        with open(plan_file, encoding="utf-8") as f:
            spec = json.load(f)
    except (OSError, ValueError) as exc:
        raise UsageError(f"cannot read the node plan {plan_file}: {exc}",
                         "node-agent is started by fluidctl train; do not run it by hand")
    finally:
        try:
            os.unlink(plan_file)
        except OSError:
            pass
    procs = [ProcSpec(**p) for p in spec["procs"]]
    layout = LogLayout(Path(spec["log_dir"]))
    layout.create()
    logs = [str(layout.for_role(p.role, p.rank)) for p in procs]
    launch_log = LaunchLog(str(layout.node_launch(spec["host"])))
    attempt = int(spec.get("attempt", 0))
    launch_log(f"node agent for {spec['host']}: attempt {attempt}, "
               + ", ".join(p.label for p in procs))
    if attempt:
        run.append_header(logs, attempt, int(spec.get("max_restarts", attempt)))

    def report(failure):
        record = {"label": failure.label, "host": failure.host, "returncode": failure.returncode,
                  "pid": failure.pid, "when": failure.when, "detail": failure.detail}
        sys.stdout.write(f"{MARK}{FAILURE_TAG}|{json.dumps(record)}\n")
        sys.stdout.flush()

    def lost():
        launch_log("the launcher's connection is gone: stopping this node's processes")
        os.kill(os.getpid(), signal.SIGTERM)

    result = run.run_supervised(
        lambda _attempt: run.start_local(procs, attempt, logs),
        logs=logs, fresh=not attempt, launch_log=launch_log,
        options=RunOptions(float(spec.get("grace", 5.0)), 0),
        sources=[(log, f"{MARK}{tag_for(p.role, p.rank)}|") for p, log in zip(procs, logs)],
        report=report, on_broken=lost, heartbeat=f"{MARK}{BEAT_TAG}|")
    launch_log.close()
    sys.exit(result.exit_code)
