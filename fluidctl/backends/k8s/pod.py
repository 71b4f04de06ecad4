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

The pod entry supervises its processes as ``fluidctl train`` does a job on one machine, with
LOG_DIR/<pod> as its log dir: the --hang-timeout watchdog and report, checkpoint requests
(the kubelet's SIGTERM: the request file, then the ranks save within the grace period).

``fluidctl job checkpoint KIND/NAME`` sets the annotation ``fluidctl.io/checkpoint`` on each of
the job's pods (``save TIME`` or ``stop TIME``). A pod sees its own annotations in a downward API
volume (podspec.py; FLUIDCTL_K8S_REQUESTS names the file), which the kubelet rewrites when they
change: ``AnnotationWatch`` turns a new value into what the pod's supervisor understands, as
``fluidctl job checkpoint LOG_DIR`` does for a job on this machine: ``save`` is the request
file the ranks read (every rank saves at the same step and goes on), ``stop`` is SIGUSR1 (the
checkpoint signal to every rank, the grace period, exit 75). A value found at the pod's start
is an earlier attempt's. A pod that hung writes its report to its termination message
(FLUIDCTL_K8S_MESSAGE, the container's terminationMessagePath), which the API server keeps in
the pod's status for ``fluidctl job status``.
"""
from __future__ import annotations

import json
import os
import signal
import sys
from typing import Callable, Dict, Optional

from fluidctl import envs
from fluidctl.backends.k8s.podspec import CHECKPOINT_ANNOTATION as ANNOTATION
from fluidctl.errors import UsageError
from fluidctl.launch.relay import RequestRelay

NODE_BASE, NODE_INDEX = envs.K8S_NODE_BASE, envs.K8S_NODE_INDEX
NOT_BY_HAND = "the pod entry is written by fluidctl train --backend k8s; do not run it by hand"
MESSAGE_LIMIT = 4000        # the API server keeps 4096 bytes of a termination message


def read_annotations(path: str) -> Dict[str, str]:
    """The downward API's annotations file: one ``key="value"`` a line, the value quoted as
    Go's %q quotes it (a JSON string for what fluidctl writes)."""
    out = {}
    try:
        with open(path, encoding="utf-8") as f:
            lines = f.read().splitlines()
    except OSError:
        return out
    for line in lines:
        key, sep, value = line.partition("=")
        if not sep:
            continue
        try:
            out[key] = json.loads(value)
        except ValueError:
            out[key] = value.strip('"')
    return out


class AnnotationWatch(RequestRelay):
    """While entered: each new value of the checkpoint annotation goes to ``on_request(kind,
    why)`` (kind ``save`` or ``stop``); the file looked at as RequestRelay looks at one."""

    def __init__(self, path: Optional[str], on_request: Callable[[str, str], None]):
        super().__init__(path or os.devnull, lambda _: None)
        self.on_request, self.given = on_request, bool(path)
        self._value_seen = self._value()

    def _value(self) -> Optional[str]:
        return read_annotations(self.path).get(ANNOTATION) if self.given else None

    def check(self) -> bool:
        value = self._value()
        if value is None or value == self._value_seen:
            return False
        self._value_seen = value
        kind = value.split()[0] if value.split() else ""
        if kind not in ("save", "stop"):
            return False
        self.on_request(kind, f"fluidctl job checkpoint ({value})")
        return True


def requester(layout, launch_log, leads: bool) -> Callable[[str, str], None]:
    """What a request does in the pod whose logs are ``layout`` (LOG_DIR/<pod>). A ``save``
    is written only where trainer 0 runs (``leads``): the ranks agree on any one rank's
    request (runtime/request.py), and the kubelet updates each pod's annotations at its own
    moment, so a request file in every pod could be seen once before and once after the
    agreement, and save twice."""
    from fluidctl.launch import requests

    def on_request(kind: str, why: str) -> None:
        launch_log(f"checkpoint requested: {why}")
        if kind == requests.SAVE and not leads:
            launch_log("save: trainer 0's pod asks every rank")
        elif kind == requests.SAVE:
            try:
                requests.ask(layout, requests.SAVE, why)
            except OSError as exc:
                launch_log(f"could not write {layout.checkpoint_request}: {exc}")
        else:
            os.kill(os.getpid(), signal.SIGUSR1)    # the supervisor's checkpoint request
    return on_request


def write_message(lines, environ=None) -> None:
    """The pod's termination message (what ``job status`` shows), cut to what the API keeps."""
    environ = os.environ if environ is None else environ
    path = environ.get(envs.K8S_MESSAGE)
    if not path:
        return
    text = "\n".join(lines)
    data = text.encode("utf-8")[:MESSAGE_LIMIT].decode("utf-8", "ignore")
    try:
        with open(path, "w", encoding="utf-8") as f:
            f.write(data + "\n")
    except OSError:
        pass                # no message: the log still has the report


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


def settings(environ):
    """What the rendering put in the container's environment for the pod entry itself (the
    ranks get the plan's): --hang-timeout and --checkpoint-signal (podspec.py)."""
    hang = environ.get(envs.HANG_TIMEOUT, "")
    try:
        hang_timeout = float(hang) if hang else None
    except ValueError:
        raise UsageError(f"{envs.HANG_TIMEOUT}={hang!r} is not a number of seconds",
                         NOT_BY_HAND) from None
    return hang_timeout, environ.get(envs.CHECKPOINT_SIGNAL) or None


def run_pod(path: str) -> int:
    """This pod's processes, supervised as ``fluidctl train`` supervises a job on one machine,
    with the pod's logs (LOG_DIR/<pod>) as its log dir: the --hang-timeout watchdog and report
    (hang-<time>/, failure.json), checkpoint requests (SIGTERM from the kubelet: the request
    file, then the ranks save within the grace period; ``fluidctl job checkpoint``'s
    annotation: py)."""
    from pathlib import Path
    from fluidctl.diagnostics.watch import HANG_EXIT, Diagnostics
    from fluidctl.launch import run
    from fluidctl.launch.requests import RequestChannel
    from fluidctl.launch.supervisor import LaunchLog, RunOptions
    from fluidctl.paths import LogLayout
    from fluidctl.planning.plan import PSERVER
    from fluidctl.procs.local import start_procs
    share, procs = my_share(path, os.environ)
    hang_timeout, signal_name = settings(os.environ)
    logs = [p.log for p in procs]
    for log in logs:
        os.makedirs(os.path.dirname(log) or ".", exist_ok=True)
    layout = LogLayout((Path(share.log_dir) / share.host).resolve())    # the pod's own
    layout.create()
    launch_log = LaunchLog(str(layout.launch))
    launch_log(f"pod {share.host}: " + ", ".join(p.label for p in procs))
    diagnostics = Diagnostics(hang_timeout=hang_timeout, log_root=layout.root)
    channel = RequestChannel(layout.root, signal_name or share.checkpoint_signal)

    serves_only = all(p.role == PSERVER for p in procs)

    def start(attempt):
        channel.clear()
        handles = start_procs(procs, attempt, logs,
                              extra_env={**diagnostics.env(), **channel.rank_env()})
        if serves_only:     # a pserver pod runs until its pservers end or the job stops it
            for handle in handles:
                handle.service = False
        diagnostics.current = handles
        return handles
    hang_report: list = []

    def on_hang(lines, where):
        hang_report[:] = [f"pod {share.host}: {lines[0]}", *lines[1:]] + (
            [f"every rank's full stack: {where}/"] if where is not None else [])
        run.hang_reporter(lines, where)
    shown = run.ConsoleOutput(sources=[(p.log, f"[{p.label}] ") for p in procs],
                              report=run.failure_reporter(20, layout.failure_json),
                              on_hang=on_hang)
    leads = any(p.role != PSERVER and p.rank == 0 for p in procs)
    with AnnotationWatch(os.environ.get(envs.K8S_REQUESTS),
                         requester(layout, launch_log, leads)):
        result = run.run_supervised(start, logs=logs, launch_log=launch_log,
                                    options=RunOptions(share.grace, 0, channel), shown=shown,
                                    watchers=run.RunWatchers(diagnostics=diagnostics))
    if result.exit_code == HANG_EXIT and hang_report:
        write_message(hang_report)
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
