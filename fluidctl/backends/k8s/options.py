"""The Kubernetes-only options of ``fluidctl train`` (``--backend k8s``), declared once
(fastargs Options); ``plan.py`` parses them, and Kubernetes' meaning of the shared ``--nodes``
(the trainer pods) and ``--job-name`` (the job's name), into one ``K8sOptions``; the pod and
job fields (--mount to --pod-template) into its ``PodOptions`` (podspec.py;
docs/kubernetes.md, "Options")."""
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
    fastargs.Option(["--mount"], "mount", fastargs.MULTI, metavar="type=T,src=S,dst=D",
                    help="k8s: a volume in every pod (repeatable): type pvc, hostPath, "
                         "configMap, secret or emptyDir, readonly optional, e.g. --mount "
                         "type=pvc,src=datasets,dst=/data,readonly."),
    fastargs.Option(["--shm-size"], "shm_size", metavar="SIZE",
                    help="k8s: a memory-backed /dev/shm of this size (the container default "
                         "of 64Mi starves DataLoader workers), e.g. --shm-size 16Gi."),
    fastargs.Option(["--cpu"], "cpu", metavar="CPUS",
                    help="k8s: CPUs per pod (requests and limits), e.g. --cpu 8."),
    fastargs.Option(["--memory"], "memory", metavar="SIZE",
                    help="k8s: memory per pod (requests and limits), e.g. --memory 64Gi."),
    fastargs.Option(["--node-selector"], "node_selector", fastargs.MULTI, metavar="KEY=VALUE",
                    help="k8s: run on nodes with this label (repeatable), e.g. "
                         "--node-selector gpu-type=h100."),
    fastargs.Option(["--toleration"], "tolerations", fastargs.MULTI,
                    metavar="KEY[=VALUE][:EFFECT]",
                    help="k8s: tolerate this taint (repeatable; kubectl taint's form), e.g. "
                         "--toleration nvidia.com/gpu=present:NoSchedule."),
    fastargs.Option(["--image-pull-secret"], "image_pull_secrets", fastargs.MULTI,
                    metavar="NAME",
                    help="k8s: a Secret to pull --image with (repeatable), e.g. "
                         "--image-pull-secret regcred."),
    fastargs.Option(["--service-account"], "service_account", metavar="NAME",
                    help="k8s: the pods' service account, e.g. --service-account trainer."),
    fastargs.Option(["--priority-class"], "priority_class", metavar="NAME",
                    help="k8s: the pods' PriorityClass, e.g. --priority-class high."),
    fastargs.Option(["--queue"], "queue", metavar="NAME",
                    help="k8s: the Kueue LocalQueue (label kueue.x-k8s.io/queue-name), or "
                         "with --scheduler volcano the Volcano queue, e.g. --queue team-a."),
    fastargs.Option(["--scheduler"], "scheduler", metavar="NAME",
                    help="k8s: gang-schedule the pods with this scheduler (volcano: "
                         "schedulerName and minAvailable every pod), e.g. --scheduler volcano."),
    fastargs.Option(["--ttl"], "ttl", metavar="SECONDS",
                    help="k8s: delete the finished job after this many seconds "
                         "(ttlSecondsAfterFinished), e.g. --ttl 86400."),
    fastargs.Option(["--active-deadline"], "active_deadline", metavar="SECONDS",
                    help="k8s: fail the job after this many seconds running "
                         "(activeDeadlineSeconds), e.g. --active-deadline 172800."),
    fastargs.Option(["--label"], "labels", fastargs.MULTI, metavar="KEY=VALUE",
                    help="k8s: a label on the job and its pods (repeatable), e.g. --label "
                         "team=nlp."),
    fastargs.Option(["--annotation"], "annotations", fastargs.MULTI, metavar="KEY=VALUE",
                    help="k8s: an annotation on the job and its pods (repeatable), e.g. "
                         "--annotation owner=ana."),
    fastargs.Option(["--pod-template"], "pod_template", metavar="FILE",
                    help="k8s: a pod template (YAML: metadata, spec) merged into every pod "
                         "last, as a strategic merge patch, for any other field, e.g. "
                         "--pod-template pod.yaml."),
)
