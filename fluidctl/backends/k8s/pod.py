"""The entry of every pod of a Kubernetes job (``python3 -m fluidctl.backends.k8s.pod
PLAN.json``, the container command ``render.py`` writes; users never type it).

The ConfigMap holds the job's compact layout (``layout.py``: the JobSpec, O(nodes), without the
token); the pod plans the world from it as the renderer did and runs its own node's
``NodeShare`` (``fluidctl.agentproto``, as the SSH agents get theirs). This pod's node is
FLUIDCTL_K8S_NODE_BASE + FLUIDCTL_K8S_INDEX (its replica index, from the downward API); the
token comes from the Secret
(FLUIDCTL_JOB_TOKEN, a secretKeyRef). Its processes start with exactly the environment the plan
gave them (what the operator injected, e.g. RANK or MASTER_ADDR, is replaced by the plan's), each
writing LOG_DIR/<pod>/workerlog.N, every line echoed to stdout with a ``[trainer N]`` prefix
(``kubectl logs``). The pod exits with the first failing process's code. A pod of pservers only
runs until they end: the job's success policy (its trainers done) stops it with SIGTERM, and
each pserver saves its checkpoint in the grace period.
"""
from __future__ import annotations

import json
import os
import sys

from fluidctl import envs
from fluidctl.errors import UsageError

NODE_BASE, NODE_INDEX = envs.K8S_NODE_BASE, envs.K8S_NODE_INDEX
NOT_BY_HAND = "the pod entry is written by fluidctl train --backend k8s; do not run it by hand"


def node_index(environ) -> int:
    try:
        return int(environ.get(NODE_BASE, "0")) + int(environ.get(NODE_INDEX, "") or "0")
    except ValueError:
        raise UsageError(f"{NODE_BASE}/{NODE_INDEX} are not numbers "
                         f"({environ.get(NODE_BASE)!r}, {environ.get(NODE_INDEX)!r})",
                         NOT_BY_HAND) from None


def my_share(path: str, environ):
    """(this pod's NodeShare, its processes as ProcSpecs with the token put back)."""
    from fluidctl.agentproto import NodeShare, RecordError
    from fluidctl.backends.k8s import layout
    from fluidctl.planning.plan import ProcSpec
    try:
        with open(path) as f:
            record = json.load(f)
        nodes = record["job"]["nodes"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise UsageError(f"cannot read the job's plan {path}: {exc}", NOT_BY_HAND) from None
    index = node_index(environ)
    if not 0 <= index < len(nodes):
        raise UsageError(f"this pod is node {index}, but the plan has {len(nodes)} nodes",
                         NOT_BY_HAND)
    try:
        if record.get("format") != layout.FORMAT:
            raise RecordError(f"layout format {record.get('format')!r}")
        share = layout.node_share(layout.plan_of(record), index, record["grace"])
        share = NodeShare.from_record(share.to_record())
        procs = [ProcSpec(**p) for p in share.procs]
    except (RecordError, TypeError, KeyError) as exc:
        raise UsageError(f"the plan is not this fluidctl version's ({exc})",
                         "use the same fluidctl in the image as the one that rendered the job") \
            from None
    token = environ.get(envs.JOB_TOKEN, "")
    if token == envs.MASKED_TOKEN:
        raise UsageError("the job token is --dry-run's placeholder, not a secret",
                         "render the job with --dry-run --show-secrets, or start it with "
                         "fluidctl train --backend k8s")
    for p in procs:
        if token:
            p.env[envs.JOB_TOKEN] = token
    return share, procs


def run_pod(path: str) -> int:
    from fluidctl.diagnostics.watch import Diagnostics
    from fluidctl.launch import run
    from fluidctl.launch.supervisor import LaunchLog, RunOptions
    from fluidctl.planning.plan import PSERVER
    from fluidctl.procs.local import start_procs
    share, procs = my_share(path, os.environ)
    logs = [p.log for p in procs]
    for log in logs:
        os.makedirs(os.path.dirname(log) or ".", exist_ok=True)
    launch_log = LaunchLog(os.path.join(share.log_dir, share.host, "launch.log"))
    launch_log(f"pod {share.host}: " + ", ".join(p.label for p in procs))
    diagnostics = Diagnostics()

    serves_only = all(p.role == PSERVER for p in procs)

    def start(attempt):
        handles = start_procs(procs, attempt, logs, extra_env=diagnostics.env())
        if serves_only:     # a pserver pod runs until its pservers end or the job stops it
            for handle in handles:
                handle.service = False
        diagnostics.current = handles
        return handles
    shown = run.ConsoleOutput(sources=[(p.log, f"[{p.label}] ") for p in procs],
                              report=run.failure_reporter(20))
    result = run.run_supervised(start, logs=logs, launch_log=launch_log,
                                options=RunOptions(share.grace, 0), shown=shown,
                                watchers=run.RunWatchers(diagnostics=diagnostics))
    launch_log.close()
    return result.exit_code


def main(argv=None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    try:
        if len(argv) != 1:
            raise UsageError("usage: python -m fluidctl.backends.k8s.pod PLAN.json", NOT_BY_HAND)
        sys.exit(run_pod(argv[0]))
    except UsageError as exc:
        print(exc.one_line(), file=sys.stderr)
        sys.exit(exc.exit_code)


if __name__ == "__main__":
    main()
