"""Rendering a job for Kubernetes in-process, and checking every rendered object against the
schemas the ecosystem publishes:

- core objects (Secret, ConfigMap, and each pod template, as a ``v1 PodTemplate``) with
  ``kubernetes-validate`` (the Kubernetes API's own OpenAPI schemas, strict: unknown fields
  fail);
- every custom resource (PyTorchJob, PaddleJob, MPIJob v1 and v2beta1, JobSet, TrainJob,
  TrainingRuntime) against its real CRD's ``openAPIV3Schema``, strict (tests/crdschema.py,
  the CRDs vendored under tests/crds/).
"""
from __future__ import annotations

from typing import List, Tuple

import kubernetes_validate

import crdschema

from fluidctl.backends.k8s.launcher import K8sLauncher
from fluidctl.planning.config import LaunchConfig
from fluidctl.backends.k8s.plan import K8sOptions

K8S_VERSION = "1.35.0"


def render(script: str, kind: str, nodes: int = 2, **settings) -> Tuple[object, List[dict]]:
    """(the plan, the objects) of ``fluidctl train --backend k8s --kind KIND``."""
    opts = K8sOptions(kind=kind, image=settings.pop("image", "registry.example/train:1"),
                      namespace=settings.pop("namespace", "ml"), nodes=nodes,
                      name=settings.pop("name", None),
                      api_version=settings.pop("api_version", None),
                      restart=settings.pop("restart", "group"))
    config = LaunchConfig(script=script, backend="k8s", backend_options=opts,
                          token=settings.pop("token", "t0ken"), **settings)
    launcher = K8sLauncher()
    plan = launcher.prepare(config)
    return plan, launcher.objects(plan)


def pod_templates(obj, found=None) -> List[dict]:
    """Every pod template in an object (a dict holding ``spec.containers``)."""
    found = [] if found is None else found
    if isinstance(obj, dict):
        if isinstance(obj.get("spec"), dict) and "containers" in obj["spec"]:
            found.append(obj)
        for value in obj.values():
            pod_templates(value, found)
    elif isinstance(obj, list):
        for value in obj:
            pod_templates(value, found)
    return found


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
        crdschema.validate(obj, K8S_VERSION)
