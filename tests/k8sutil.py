"""Rendering a job for Kubernetes in-process, and checking every rendered object against the
schemas the ecosystem publishes:

- core objects (Secret, ConfigMap, and each pod template, as a ``v1 PodTemplate``) with
  ``kubernetes-validate`` (the Kubernetes API's own OpenAPI schemas, strict: unknown fields
  fail);
- PyTorchJob, MPIJob, PaddleJob with the models ``kubeflow-training`` generates from the
  training operator's OpenAPI spec, JobSet with ``kubeflow-trainer-api``'s (pydantic): the
  object is read into the model and written back, and must come back unchanged (a field the
  schema does not know is dropped on the way, a wrong type or a missing required field fails).
"""
from __future__ import annotations

from typing import List, Tuple

import kubernetes_validate

from fluidctl.backends.k8s.launcher import K8sLauncher
from fluidctl.backends.k8s.podspec import pod_templates  # noqa: F401 (the tests' too)
from fluidctl.planning.config import LaunchConfig
from fluidctl.backends.k8s.plan import K8sOptions

K8S_VERSION = "1.35.0"


def render(script: str, kind: str, nodes: int = 2, **settings) -> Tuple[object, List[dict]]:
    """(the plan, the objects) of ``fluidctl train --backend k8s --kind KIND``."""
    elastic = settings.pop("elastic", None)         # (MIN, MAX): --nodes MIN:MAX
    opts = K8sOptions(kind=kind, image=settings.pop("image", "registry.example/train:1"),
                      namespace=settings.pop("namespace", "ml"), nodes=nodes,
                      name=settings.pop("name", None), elastic=elastic)
    config = LaunchConfig(script=script, backend="k8s", backend_options=opts,
                          token=settings.pop("token", "t0ken"), **settings)
    launcher = K8sLauncher()
    plan = launcher.prepare(config)
    return plan, launcher.objects(plan)


def _round_trip_kubeflow(obj: dict) -> dict:
    from kubeflow.training import models
    from kubeflow.training.api_client import ApiClient

    class Response:
        def __init__(self, data):
            import json
            self.data = json.dumps(data)
    cls = f"KubeflowOrgV1{obj['kind']}"
    model = ApiClient().deserialize(Response(obj), getattr(models, cls))
    return ApiClient().sanitize_for_serialization(model)


def _round_trip_jobset(obj: dict) -> dict:
    from kubeflow_trainer_api.models import JobsetV1alpha2JobSet
    return JobsetV1alpha2JobSet.from_dict(obj).to_dict()


def validate(objects: List[dict]) -> None:
    """Raise for the first object the published schemas refuse."""
    for obj in objects:
        if obj["apiVersion"] == "v1":
            kubernetes_validate.validate(obj, K8S_VERSION, strict=True)
            continue
        for template in pod_templates(obj):
            kubernetes_validate.validate({"apiVersion": "v1", "kind": "PodTemplate",
                                          "metadata": {"name": "t"}, "template": template},
                                         K8S_VERSION, strict=True)
        back = (_round_trip_jobset(obj) if obj["kind"] == "JobSet"
                else _round_trip_kubeflow(obj))
        assert back == obj, f"{obj['kind']} changed through its schema's model"
