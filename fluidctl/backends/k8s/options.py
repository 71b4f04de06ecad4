"""The Kubernetes-only options of ``fluidctl train`` (``--backend k8s``), declared once
(fastargs Options), and Kubernetes' meaning of the shared ``--nodes`` (the trainer pods) and
``--job-name`` (the job's name), parsed into one ``K8sOptions`` (docs/kubernetes.md)."""
from __future__ import annotations

import dataclasses

from fluidctl import fastargs


def _kinds():
    from fluidctl.backends.k8s.plan import KINDS
    return KINDS


OPTIONS = (
    fastargs.Option(["--kind"], "kind", type=fastargs.choice(_kinds),
                    help="k8s: the job's kind: pytorchjob, mpijob, paddlejob (Kubeflow's "
                         "training operator) or jobset (JobSet), e.g. --kind pytorchjob."),
    fastargs.Option(["--image"], "image",
                    help="k8s: the container image of every pod (fluidctl and the script in "
                         "it), e.g. --image registry.example.com/team/train:1.0."),
    fastargs.Option(["--namespace"], "namespace",
                    help="k8s: the namespace (default: default), e.g. --namespace ml-team."),
    fastargs.Option(["--apply"], "apply", fastargs.FLAG,
                    help="k8s: submit the job with your kubeconfig (without it: --dry-run "
                         "prints the YAML), e.g. --apply."),
)


def configure(config, values: dict):
    from fluidctl.backends.k8s.plan import K8sOptions
    from fluidctl.planning.elastic import node_count
    nodes = node_count(values.pop("nodes", None), "k8s", "a count of pods")
    options = K8sOptions(kind=values.pop("kind", None), image=values.pop("image", None),
                         namespace=values.pop("namespace", None) or "default",
                         nodes=nodes or 1, name=values.pop("job_name", None),
                         apply=bool(values.pop("apply", False)))
    return dataclasses.replace(config, backend_options=options)
