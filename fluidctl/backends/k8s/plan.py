"""Planning for Kubernetes (pure): the options of ``fluidctl train --backend k8s`` and the Plan
of a job whose nodes are pods.

Each node of the plan is one pod; its address is the name the operator makes resolvable for
that pod (a per-pod Service for the Kubeflow kinds, the JobSet's headless Service for JobSet),
so ``make_plan`` writes every rank's environment (the one contract of ``fluidctl.envs``) exactly
as it does for hosts. A pod has its own network namespace, so the ports are fixed: trainers from
``--started-port`` (default 6170) up, then pservers, then the master's on node 0. In pserver mode
the pservers are pods of their own (a separate replica set), after the trainer pods.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Dict, List, Optional

from fluidctl.errors import UsageError

PYTORCHJOB, MPIJOB, PADDLEJOB, JOBSET = "pytorchjob", "mpijob", "paddlejob", "jobset"
TRAINJOB = "trainjob"
KINDS = (PYTORCHJOB, MPIJOB, PADDLEJOB, JOBSET, TRAINJOB)
# --api-version: the MPIJob versions (mpi-operator v0.8's v2beta1 first: the default)
MPI_V2, MPI_V1 = "kubeflow.org/v2beta1", "kubeflow.org/v1"
API_VERSIONS = {MPIJOB: (MPI_V2, MPI_V1)}
# --restart-policy: the whole group of pods restarts together, or each pod on its own
GROUP, POD = "group", "pod"
RESTART_POLICIES = (GROUP, POD)
DEFAULT_PORT = 6170
POD_PYTHON = "python3"          # the image's interpreter unless --python names another
# the replica sets (ecosystem names) and how a pod's name is formed, per kind
TRAINER_SET = {PYTORCHJOB: "worker", MPIJOB: "worker", PADDLEJOB: "worker", JOBSET: "trainer",
               TRAINJOB: "node"}
PSERVER_SET = {PADDLEJOB: "master", JOBSET: "pserver", TRAINJOB: "pserver"}
JOBSET_LIKE = (JOBSET, TRAINJOB)    # a TrainJob's pods are its JobSet's


@dataclass(frozen=True)
class K8sOptions:
    """The Kubernetes options of ``fluidctl train`` (``--backend k8s``)."""
    kind: Optional[str] = None
    image: Optional[str] = None
    namespace: str = "default"
    nodes: int = 1                      # pods that run trainers
    name: Optional[str] = None          # --job-name
    apply: bool = False
    api_version: Optional[str] = None   # --api-version (MPIJob's; None: the kind's default)
    restart: str = GROUP                # --restart-policy

    @property
    def version(self) -> Optional[str]:
        """The apiVersion the job is rendered as (None: the kind has only one)."""
        versions = API_VERSIONS.get(self.kind or "")
        if not versions:
            return None
        return next(v for v in versions if self.api_version in (None, v, v.split("/")[1]))

    def check(self) -> None:
        import re
        if self.kind not in KINDS:
            raise UsageError("--backend k8s needs --kind", f"choose one of {', '.join(KINDS)}, "
                             "e.g. --kind pytorchjob")
        if not self.image:
            raise UsageError("--backend k8s needs --image (the container image the pods run; "
                             "fluidctl and the script must be in it)",
                             "e.g. --image registry.example.com/team/train:1.0")
        # an RFC 1123 label, as Kubernetes requires of a namespace: at most 63 characters
        if len(self.namespace or "") > 63 or not re.fullmatch(
                r"[a-z0-9]([-a-z0-9]*[a-z0-9])?", self.namespace or ""):
            raise UsageError(f"--namespace {self.namespace!r} is not a Kubernetes namespace "
                             "name", "use up to 63 lower-case letters, digits and '-', "
                             "starting and ending with a letter or digit, e.g. "
                             "--namespace ml-team")
        versions = API_VERSIONS.get(self.kind, ())
        if self.api_version and not versions:
            raise UsageError(f"--api-version is for --kind mpijob; a {self.kind} has one "
                             "version", "drop --api-version")
        if self.api_version and self.api_version not in (
                *versions, *(v.split("/")[1] for v in versions)):
            raise UsageError(f"--api-version {self.api_version} is not an MPIJob version",
                             "use v2beta1 (mpi-operator v0.8, the default) or v1 (Kubeflow's "
                             "training operator)")
        if self.restart not in RESTART_POLICIES:
            raise UsageError(f"--restart-policy {self.restart!r} is not a policy",
                             "use group (the whole job restarts, the default) or pod")
        if self.restart == POD and self.kind == MPIJOB:
            raise UsageError("--restart-policy pod: an MPIJob's ranks are all mpirun's, so "
                             "it restarts as a whole", "drop --restart-policy, or use "
                             "--kind jobset for per-pod restarts")


def job_name(given: Optional[str], script: str) -> str:
    """A DNS-1035 label for the job (--job-name, else the script's name): lower case, '-',
    short enough that pod names and hostnames built from it stay within 63 characters."""
    import os
    import re
    raw = given or os.path.splitext(os.path.basename(script))[0]
    name = re.sub(r"[^a-z0-9-]+", "-", raw.lower()).strip("-")
    if given and (name != given or not name[:1].isalpha() or len(name) > 40):
        raise UsageError(f"--job-name {given!r} cannot name a Kubernetes job",
                         "use up to 40 lower-case letters, digits and '-', starting with a "
                         "letter, e.g. --job-name bert-large")
    name = name[:40].strip("-")
    return name if name[:1].isalpha() else f"job-{name}".strip("-")


def pod_address(kind: str, name: str, role_set: str, index: int, namespace: str,
                version: Optional[str] = None) -> str:
    """The name a pod is reached at inside the cluster. Kubeflow's training operator makes one
    Service per pod, named as the pod (``NAME-worker-2``); JobSet (and a TrainJob's JobSet)
    gives each pod the hostname ``NAME-RJOB-0-INDEX`` under its headless Service ``NAME``
    (subdomain); mpi-operator v2beta1 gives each Worker the hostname ``NAME-worker-INDEX``
    under its headless Service ``NAME``."""
    if kind in JOBSET_LIKE:
        return f"{name}-{role_set}-0-{index}.{name}.{namespace}"
    if kind == MPIJOB and version == MPI_V2:
        return f"{name}-{role_set}-{index}.{name}.{namespace}"
    return f"{name}-{role_set}-{index}.{namespace}"


def trainer_pods(kind: str, name: str, nodes: int, namespace: str,
                 version: Optional[str] = None) -> List[str]:
    """Addresses of the trainer pods in node order. PyTorchJob: node 0 is the Master replica
    (torch's rendezvous host), the others Worker 0..n-2; the other kinds: one replica set."""
    if kind == PYTORCHJOB:
        return ([pod_address(kind, name, "master", 0, namespace)]
                + [pod_address(kind, name, "worker", i, namespace) for i in range(nodes - 1)])
    return [pod_address(kind, name, TRAINER_SET[kind], i, namespace, version)
            for i in range(nodes)]


def pod_ports(job, port: int) -> Dict[int, List[int]]:
    """Each pod's ports (its own network namespace): from ``port`` up, as many as the node
    needs; the renderer and every pod compute them alike."""
    return {i: list(range(port, port + job.ports_needed(i))) for i in range(len(job.nodes))}


def pserver_pods(kind: str, name: str, count: int, namespace: str) -> List[str]:
    if kind not in PSERVER_SET:
        raise UsageError(f"--mode pserver has no replica set in a {kind}",
                         "use --kind paddlejob (pservers as its Master replicas) or --kind "
                         "jobset (a pserver replicated job)")
    return [pod_address(kind, name, PSERVER_SET[kind], i, namespace) for i in range(count)]


def configure(config, values: dict):
    from fluidctl.planning.elastic import node_count
    nodes = node_count(values.pop("nodes", None), "k8s", "a count of pods")
    options = K8sOptions(kind=values.pop("kind", None), image=values.pop("image", None),
                         namespace=values.pop("namespace", None) or "default",
                         nodes=nodes or 1, name=values.pop("job_name", None),
                         apply=bool(values.pop("apply", False)),
                         api_version=values.pop("api_version", None),
                         restart=values.pop("restart_policy", None) or GROUP)
    return replace(config, backend_options=options)
