"""The Kubernetes-only options of ``fluidctl train`` (``--backend k8s``), declared once
(fastargs Options); ``plan.py`` parses them, and Kubernetes' meaning of the shared ``--nodes``
(the trainer pods) and ``--job-name`` (the job's name), into one ``K8sOptions``
(docs/kubernetes.md)."""
from __future__ import annotations

from fluidctl import fastargs


def _kinds():
    from fluidctl.backends.k8s.plan import KINDS
    return KINDS


OPTIONS = (
    fastargs.Option(["--kind"], "kind", type=fastargs.choice(_kinds),
                    help="k8s: the job's kind: pytorchjob, mpijob, paddlejob (Kubeflow's "
                         "training operator, mpi-operator), jobset (JobSet) or trainjob "
                         "(Kubeflow Trainer v2), e.g. --kind pytorchjob."),
    fastargs.Option(["--api-version"], "api_version",
                    help="k8s: the MPIJob version: v2beta1 (mpi-operator v0.8, the default) "
                         "or v1 (Kubeflow's training operator), e.g. --api-version v1."),
    fastargs.Option(["--restart-policy"], "restart_policy",
                    type=fastargs.choice(("group", "pod")),
                    help="k8s: on a failure, restart the whole group of pods (group, the "
                         "default) or only the failed pod (pod), up to --max-restarts times, "
                         "e.g. --restart-policy pod."),
    fastargs.Option(["--image"], "image",
                    help="k8s: the container image of every pod (fluidctl and the script in "
                         "it), e.g. --image registry.example.com/team/train:1.0."),
    fastargs.Option(["--namespace"], "namespace",
                    help="k8s: the namespace (default: default), e.g. --namespace ml-team."),
    fastargs.Option(["--apply"], "apply", fastargs.FLAG,
                    help="k8s: submit the job with your kubeconfig (without it: --dry-run "
                         "prints the YAML), e.g. --apply."),
)
