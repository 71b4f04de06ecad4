"""The plan ConfigMap's content: the job's compact layout, O(nodes), from which each pod derives
its own ``NodeShare`` with the planner every backend uses (``make_plan``), so a 1,000-pod job's
ConfigMap stays far below the API server's 1 MiB per object.

The record holds the ``JobSpec`` (nodes, script, arguments, mode, the user's variables; never the
token), the first port (each pod's ports follow ``plan.pod_ports``), the backend and the grace
period. A pod plans the world as the renderer did and keeps its own node's processes: the same
environment, rank for rank, that ``--dry-run --json`` prints.
"""
from __future__ import annotations

import json
from dataclasses import asdict, fields
from typing import List, Mapping

from fluidctl import envs
from fluidctl.planning.plan import JobSpec, Node, Plan

FORMAT = 1
LIMIT = 1 << 20             # the API server's limit on one object (etcd's request limit: 1.5 MiB)


def record(plan: Plan, port: int, grace: float) -> dict:
    """The layout a pod derives its share from (no token)."""
    job = {}
    for f in fields(plan.job):
        value = getattr(plan.job, f.name)
        if f.name == "token":
            continue
        if f.name == "nodes":
            value = [asdict(n) for n in value]
        elif isinstance(value, Mapping):
            value = dict(value)
        elif isinstance(value, (list, tuple)):
            value = list(value)
        job[f.name] = value
    return {"format": FORMAT, "backend": plan.backend, "port": port, "grace": grace,
            "job": job}


def to_text(layout: dict) -> str:
    return json.dumps(layout, separators=(",", ":"), sort_keys=True)


def job_spec(layout: dict) -> JobSpec:
    fields = dict(layout["job"])
    fields["nodes"] = [Node(**{**n, "gpus": tuple(n.get("gpus", ()))}) for n in fields["nodes"]]
    return JobSpec(**fields)


def plan_of(layout: dict) -> Plan:
    """The whole plan, as the renderer made it (the token left out)."""
    from fluidctl.backends.k8s.plan import pod_ports
    from fluidctl.planning.plan import make_plan
    job = job_spec(layout)
    return make_plan(job, pod_ports(job, layout["port"]), backend=layout["backend"])


def node_share(plan: Plan, index: int, grace: float):
    """Node ``index``'s processes as the NodeShare its pod runs (the token left out)."""
    from fluidctl.agentproto import NodeShare
    procs: List[dict] = []
    for p in plan.on_node(index):
        proc = p.to_json()
        proc["env"] = {k: v for k, v in proc["env"].items() if k != envs.JOB_TOKEN}
        procs.append(proc)
    node = plan.job.nodes[index]
    return NodeShare(procs, plan.job.log_dir, node.label, grace=grace)
