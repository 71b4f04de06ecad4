"""The Kubernetes-only options of ``fluidctl train`` (``--backend k8s``), as one decorator;
``fluidctl.launch.train.k8s_options`` gathers them (with ``--nodes`` and ``--job-name``) into
one ``K8sOptions`` for the backend (docs/kubernetes.md)."""
from __future__ import annotations

import click

from fluidctl.planning.k8s import KINDS

OPTIONS = (
    click.option("--kind", type=click.Choice(KINDS), default=None,
                 help="k8s: the job's kind: pytorchjob, mpijob, paddlejob (Kubeflow's training "
                      "operator) or jobset (JobSet), e.g. --kind pytorchjob."),
    click.option("--image", default=None,
                 help="k8s: the container image of every pod (fluidctl and the script in it), "
                      "e.g. --image registry.example.com/team/train:1.0."),
    click.option("--namespace", default=None,
                 help="k8s: the namespace (default: default), e.g. --namespace ml-team."),
    click.option("--apply", is_flag=True,
                 help="k8s: submit the job with your kubeconfig (without it: --dry-run prints "
                      "the YAML), e.g. --apply."),
)


def k8s_options(f):
    for option in reversed(OPTIONS):
        f = option(f)
    return f
