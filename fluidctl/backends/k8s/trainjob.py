"""Kubeflow Trainer v2: a ``TrainJob`` (``trainer.kubeflow.org/v1alpha1``) and the namespaced
``TrainingRuntime`` it references, both named after the job.

fluidctl renders its own runtime rather than referencing a cluster's (``torch-distributed`` and
the like): that runtime's JobSet template is what every other kind's pods are (the pod entry,
the plan's ConfigMap, the token's Secret), so the job does not depend on which runtimes a
cluster installed, nor on the Trainer's per-version override fields. The runtime is a JobSet
spec (``render.jobset_spec``) whose trainer replicated job is ``node``, marked as the Trainer's
``trainer`` step; the TrainJob sets ``trainer.numNodes``. Pods are then named and reached as a
JobSet's: ``NAME-node-0-INDEX.NAME``.
"""
from __future__ import annotations

from typing import List

from fluidctl.backends.k8s import plan as kplan

ANCESTOR = "trainer.kubeflow.org/trainjob-ancestor-step"


API = ("trainer.kubeflow.org/v1alpha1", "TrainJob", "trainjobs")
RUNTIME = ("trainer.kubeflow.org/v1alpha1", "TrainingRuntime", "trainingruntimes")


def objects(name: str, meta: dict, jobset_spec: dict, trainers: int) -> List[dict]:
    """[the TrainingRuntime, the TrainJob], checked through the Trainer API's models."""
    from kubeflow_trainer_api import models as tr
    for rjob in jobset_spec["replicatedJobs"]:
        if rjob["name"] == kplan.TRAINER_SET[kplan.TRAINJOB]:
            rjob["template"].setdefault("metadata", {}).setdefault("labels", {})[ANCESTOR] = \
                "trainer"
    api_version, kind, _ = API
    runtime = {"apiVersion": RUNTIME[0], "kind": RUNTIME[1], "metadata": meta,
               "spec": {"mlPolicy": {"numNodes": trainers},
                        "template": {"spec": jobset_spec}}}
    job = {"apiVersion": api_version, "kind": kind, "metadata": meta,
           "spec": {"runtimeRef": {"apiGroup": api_version.split("/")[0],
                                   "kind": RUNTIME[1], "name": name},
                    "trainer": {"numNodes": trainers}}}
    return [tr.TrainerV1alpha1TrainingRuntime.from_dict(runtime).to_dict(),
            tr.TrainerV1alpha1TrainJob.from_dict(job).to_dict()]
