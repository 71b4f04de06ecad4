"""``--kind pytorchjob --nodes MIN:MAX``: an elastic PyTorchJob. The training operator scales
its Worker pods between MIN and MAX and hands each pod torchrun's rendezvous settings
(``PET_NNODES=MIN:MAX``, ``PET_RDZV_ENDPOINT=NAME-worker-0:PORT``, ``PET_RDZV_BACKEND``,
``PET_MAX_RESTARTS``: the operator's pytorch/elastic.go; ``PET_NPROC_PER_NODE`` from
``spec.nprocPerNode``, not from elasticPolicy's deprecated ``nProcPerNode``, whose variable
torchrun does not read), so each pod
runs ``python3 -m torch.distributed.run SCRIPT ARGS`` and torchrun forms each world: a plan of
a fixed world (fluidctl's pod entry) cannot follow it. The rendering is the fixed one turned
into that: one Worker replica set of MAX pods, torchrun as the command, the plan's ConfigMap
left out; the token (Secret) and the user's environment (--env, --env-file, --export) stay.
A fluidctl.runtime script runs under torchrun as it does by hand (docs/runtime.md).
"""
from __future__ import annotations

from typing import Dict, List, Sequence, Tuple

from fluidctl import envs

PORT_NAME, PORT = "pytorchjob-port", 23456      # the operator's default container port
TORCHRUN = ("-m", "torch.distributed.run")


def apply(objects: List[dict], nodes: Tuple[int, int], *, python: str, script: str,
          script_args: Sequence[str], user_env: Dict[str, str], nproc: int,
          max_restarts: int) -> List[dict]:
    """The rendered fixed-world PyTorchJob (and its Secret, ConfigMap) as an elastic one."""
    low, high = nodes
    job = objects[-1]
    sets = job["spec"]["pytorchReplicaSpecs"]
    worker = sets.get("Worker") or sets["Master"]
    template = worker["template"]
    container = template["spec"]["containers"][0]
    container["command"] = [python, *TORCHRUN, script, *script_args]
    container["env"] = [e for e in container.get("env", []) if e["name"] == envs.JOB_TOKEN] + [
        {"name": k, "value": v} for k, v in sorted(user_env.items())]
    container["ports"] = [{"name": PORT_NAME, "containerPort": PORT}]
    container.pop("volumeMounts", None)
    template["spec"].pop("volumes", None)
    job["spec"]["pytorchReplicaSpecs"] = {"Worker": {**worker, "replicas": high,
                                                     "restartPolicy": "OnFailure",
                                                     "template": template}}
    job["spec"]["elasticPolicy"] = {"minReplicas": low, "maxReplicas": high,
                                    "rdzvBackend": "c10d", "maxRestarts": max_restarts}
    job["spec"]["nprocPerNode"] = str(nproc)
    return [o for o in objects if o["kind"] != "ConfigMap"]
