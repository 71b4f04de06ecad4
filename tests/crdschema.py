"""The real CRDs' ``openAPIV3Schema`` as strict validators: what the API server would do with a
custom resource, with unknown fields an error instead of silently pruned (kubectl's
``--validate=strict``).

The CRD YAML is vendored under tests/crds/ (gzip), unchanged from upstream, each with its
repository, path and commit in a header comment (tests/crds/README.md lists them). The schema is
made strict the way the API server prunes: every object schema that neither lists
``additionalProperties`` nor carries ``x-kubernetes-preserve-unknown-fields`` gets
``additionalProperties: false``. The root ``metadata`` (an ObjectMeta, which the API server checks
itself) is checked with kubernetes-validate. CEL rules (``x-kubernetes-validations``) are not
evaluated here.
"""
from __future__ import annotations

import copy
import functools
import gzip
from pathlib import Path
from typing import Dict, Tuple

CRDS = Path(__file__).resolve().parent / "crds"
# (apiVersion, kind) -> the vendored CRD that serves it
SERVED: Dict[Tuple[str, str], str] = {
    ("kubeflow.org/v1", "PyTorchJob"): "training-operator-v1.9.0_pytorchjobs.yaml.gz",
    ("kubeflow.org/v1", "PaddleJob"): "training-operator-v1.9.0_paddlejobs.yaml.gz",
    ("kubeflow.org/v1", "MPIJob"): "training-operator-v1.9.0_mpijobs.yaml.gz",
    ("kubeflow.org/v2beta1", "MPIJob"): "mpi-operator-v0.8.2_mpijobs.yaml.gz",
    ("jobset.x-k8s.io/v1alpha2", "JobSet"): "jobset-v0.12.0_jobsets.yaml.gz",
    ("trainer.kubeflow.org/v1alpha1", "TrainJob"): "trainer-v2.3.0_trainjobs.yaml.gz",
    ("trainer.kubeflow.org/v1alpha1", "TrainingRuntime"): "trainer-v2.3.0_trainingruntimes.yaml.gz",
    ("trainer.kubeflow.org/v1alpha1", "ClusterTrainingRuntime"):
        "trainer-v2.3.0_clustertrainingruntimes.yaml.gz",
}
PRESERVE = "x-kubernetes-preserve-unknown-fields"


def strict(schema):
    """A copy of ``schema`` in which unknown fields fail (where the API server would prune)."""
    schema = copy.deepcopy(schema)

    def walk(node) -> None:
        if isinstance(node, list):
            for item in node:
                walk(item)
            return
        if not isinstance(node, dict):
            return
        is_object = node.get("type") == "object" or "properties" in node
        if is_object and not node.get(PRESERVE) and "additionalProperties" not in node:
            node["additionalProperties"] = False
        for key in ("properties",):
            for sub in node.get(key, {}).values():
                walk(sub)
        for key in ("items", "additionalProperties", "not"):
            if isinstance(node.get(key), dict):
                walk(node[key])
        for key in ("allOf", "anyOf", "oneOf"):
            walk(node.get(key, []))
    walk(schema)
    return schema


@functools.lru_cache(maxsize=None)
def crd(api_version: str, kind: str) -> dict:
    import yaml
    name = SERVED.get((api_version, kind))
    assert name, f"no vendored CRD serves {api_version} {kind}"
    with gzip.open(CRDS / name, "rt") as f:
        return yaml.load(f, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))


@functools.lru_cache(maxsize=None)
def validator(api_version: str, kind: str):
    """A jsonschema validator of the served version's schema, strict, root metadata open."""
    import jsonschema
    version = api_version.rpartition("/")[2]
    doc = crd(api_version, kind)
    assert doc["spec"]["names"]["kind"] == kind
    (served,) = [v for v in doc["spec"]["versions"] if v["name"] == version and v["served"]]
    schema = strict(served["schema"]["openAPIV3Schema"])
    schema["properties"]["metadata"] = {"type": "object"}   # ObjectMeta: kubernetes-validate
    return jsonschema.Draft7Validator(schema)


def errors(obj: dict) -> list:
    """What the CRD's strict schema says is wrong with ``obj`` (empty: nothing)."""
    found = validator(obj["apiVersion"], obj["kind"]).iter_errors(obj)
    return sorted(f"{'.'.join(str(p) for p in e.absolute_path)}: {e.message}" for e in found)


def validate(obj: dict, k8s_version: str) -> None:
    """Raise AssertionError for a custom resource its CRD refuses (strict), or whose metadata
    is not an ObjectMeta."""
    import kubernetes_validate
    problems = errors(obj)
    assert not problems, f"{obj['kind']} {obj['apiVersion']}:\n" + "\n".join(problems[:20])
    kubernetes_validate.validate({"apiVersion": "v1", "kind": "ConfigMap",
                                  "metadata": obj["metadata"]}, k8s_version, strict=True)
