"""The k8s backend's job verbs: ``fluidctl job list|status|logs|checkpoint|cancel`` for the
Kubernetes jobs fluidctl submitted (``KIND/NAME``, e.g. ``pytorchjob/bert``), through the API
(``fluidctl.backends.k8s.api``).

``checkpoint`` sets the annotation ``fluidctl.io/checkpoint`` on each of the job's pods; each
pod sees it in its downward API volume when the kubelet next refreshes it (within about a
minute) and its pod entry turns it into a request (``pod.py``). An annotation needs no exec
rights and no API access from the pods."""
from __future__ import annotations

import json
import sys

from fluidctl.backends.k8s import api

FAILED = ("Failed",)


def owns(job_id: str) -> bool:
    """A KIND/NAME (``api.parse_job_id`` says what is wrong with a bad one)."""
    return "/" in job_id


def list_jobs(as_json: bool = False, namespace=None, **_) -> None:
    rows = api.list_jobs(namespace)
    if as_json:
        print(json.dumps(rows, indent=1), flush=True)
        return
    from fluidctl.tables import print_table
    print_table("fluidctl Kubernetes jobs", ("job", "namespace", "state"),
                [(r["job_id"], r["namespace"], r["state"]) for r in rows])


def status(job_id: str, as_json: bool = False, namespace: str = "default", **_) -> None:
    """The job's state (its last true condition) and each pod that failed, with what it left
    (a hang report, else its log's tail); exit 1 for a failed job."""
    state = api.status(job_id, namespace)
    ends = api.pod_ends(job_id, namespace) if state not in ("Succeeded",) else []
    if as_json:
        print(json.dumps({"job_id": job_id, "namespace": namespace, "state": state,
                          "failed_pods": ends}, indent=1))
    else:
        print(f"job {job_id} in {namespace}: {state}")
        for end in ends:
            print(f"  pod {end['pod']}: exit code {end['exit_code']}"
                  + (f" ({end['reason']})" if end["reason"] else ""))
            for line in end["message"].strip().splitlines():
                print(f"    {line}")
    sys.exit(1 if state in FAILED else 0)


def logs(job_id: str, rank: int = 0, follow: bool = False, namespace: str = "default",
         **_) -> None:
    """Print the ``rank``-th pod's log; ``follow``: as it grows, until the job ends, then exit
    0 (Succeeded) or 1 (Failed); Ctrl-C: 130, after saying the job keeps running."""
    pod = rank
    if not follow:
        sys.stdout.write(api.logs(job_id, namespace, pod))
        return

    def write(text: str) -> None:
        sys.stdout.write(text)
        sys.stdout.flush()
    try:
        state = api.follow_logs(job_id, namespace, pod, write)
    except KeyboardInterrupt:
        print(f"fluidctl: stopped following {job_id}; the job keeps running in {namespace} "
              f"('fluidctl job cancel {job_id} --namespace {namespace}' cancels it)",
              file=sys.stderr, flush=True)
        sys.exit(130)
    print(f"fluidctl: job {job_id} {state}", file=sys.stderr, flush=True)
    sys.exit(1 if state in FAILED else 0)


def checkpoint(job_id: str, stop: bool = False, namespace: str = "default", **_) -> None:
    """Ask every pod of the job for a checkpoint (``save``: every rank saves at the same step
    and goes on; ``stop``: then the pods end with exit 75)."""
    import time
    from fluidctl.backends.k8s.podspec import CHECKPOINT_ANNOTATION
    from fluidctl.backends.k8s.plan import MPIJOB
    from fluidctl.errors import UsageError
    if api.parse_job_id(job_id)[0] == MPIJOB:
        raise UsageError(f"{job_id}: an MPIJob's ranks are started by mpirun, with no fluidctl "
                         "in its pods to pass a request on", "run the job as --kind "
                         "pytorchjob, paddlejob or jobset to ask it for checkpoints")
    if (api.get_job(job_id, namespace).get("spec") or {}).get("elasticPolicy"):
        raise UsageError(f"{job_id} is an elastic PyTorchJob: torchrun starts its ranks, with "
                         "no fluidctl in its pods to pass a request on",
                         "checkpoint from the script, or run a fixed --nodes N")
    kind = "stop" if stop else "save"
    pods = api.annotate_pods(job_id, namespace,
                             {CHECKPOINT_ANNOTATION: f"{kind} {time.time():.3f}"})
    if not pods:
        raise UsageError(f"{job_id} has no pods in {namespace} now",
                         "check it with fluidctl job status")
    then = ("every rank saves at the same step, then the pods end with exit 75" if stop
            else "every rank saves at the same step and goes on")
    print(f"asked the {len(pods)} pod(s) of {job_id} for a checkpoint (annotation "
          f"{CHECKPOINT_ANNOTATION}, seen by the pods when the kubelet refreshes it, within "
          f"about a minute): {then}", flush=True)


class PodsReader:
    """``fluidctl top KIND/NAME``: one row per pod, through the API (its node, phase,
    restarts and last log line); the step columns stay empty (the pods' pages stay in
    them)."""

    def __init__(self, job_id: str, namespace: str):
        self.job_id, self.namespace = job_id, namespace

    def read(self) -> dict:
        from fluidctl.observe.snapshot import blank
        state = api.status(self.job_id, self.namespace)
        rows = [{"rank": i, "host": p["node"], "pid": None, "state": p["phase"].lower(),
                 "step": None, "p50": None, "p99": None, "rate": None, "shares": None,
                 "cpu": None, "rss": None, "last_line": p["last_line"],
                 "verdict": f"{p['restarts']} restart(s)" if p["restarts"] else "",
                 "pod": p["name"]}
                for i, p in enumerate(api.pods(self.job_id, self.namespace))]
        return blank(self.job_id, "k8s", rows, running=state not in api.ENDED,
                     state=state, namespace=self.namespace)


def reader(job_id: str, namespace: str = "default", **_) -> PodsReader:
    api.parse_job_id(job_id)            # a bad KIND/NAME is one line
    return PodsReader(job_id, namespace)


def cancel(job_id: str, namespace: str = "default", **_) -> None:
    api.cancel(job_id, namespace)
    print(f"cancelled {job_id} in {namespace}")
