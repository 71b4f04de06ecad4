"""A Plan as Kubernetes objects, built with the ecosystem's own models: the ``kubernetes``
client's for the core objects (Secret, ConfigMap, pod templates), the Kubeflow training SDK's
(``kubeflow-training``) for PyTorchJob, MPIJob v1 and PaddleJob, and the Kubeflow Trainer API's
models (``kubeflow-trainer-api``, pydantic: checked as they are built) for JobSet, TrainJob and
TrainingRuntime (``trainjob.py``); MPIJob v2beta1 (``mpijob.py``) is plain data. Every pod
template is made by ``pod_template``.

What every pod gets:
- the job token in a Secret ``NAME-token``, read through ``secretKeyRef`` (never in a pod spec);
- the plan's layout, token removed, in a ConfigMap ``NAME-plan`` (``plan.json``, O(nodes):
  ``layout.py``), mounted at ``/etc/fluidctl``; the container runs ``python3 -m
  fluidctl.backends.k8s.pod``, which finds its node from FLUIDCTL_K8S_NODE_BASE +
  FLUIDCTL_K8S_INDEX (the pod's replica index, from the downward API), derives that node's
  processes from the layout, puts the token back and starts them with the environment the plan
  gives them: the same PADDLE_* and torch variables every backend gives.
MPIJob is the exception: mpirun in the Launcher pod starts every rank as ``fluidctl worker``
(as ``--backend mpi`` does), so its pod gets the plan's one exported environment directly.
"""
from __future__ import annotations

import json
from typing import Dict, List, Optional, Sequence

from fluidctl import envs
from fluidctl.backends.k8s import mpijob as mpi_v2, plan as kplan, trainjob
from fluidctl.sigs import GRACE_PERIOD
from fluidctl.planning.plan import PSERVER, Plan

PLAN_DIR = "/etc/fluidctl"
PLAN_FILE = "plan.json"
TOKEN_KEY = "token"
NODE_BASE, NODE_INDEX = envs.K8S_NODE_BASE, envs.K8S_NODE_INDEX
GPU = "nvidia.com/gpu"
MANAGED = {"app.kubernetes.io/managed-by": "fluidctl"}
JOB_LABEL = "fluidctl.io/job"
REPLICA_INDEX = "metadata.labels['training.kubeflow.org/replica-index']"
COMPLETION_INDEX = "metadata.annotations['batch.kubernetes.io/job-completion-index']"
CONTAINER = {kplan.PYTORCHJOB: "pytorch", kplan.PADDLEJOB: "paddle", kplan.MPIJOB: "mpi",
             kplan.JOBSET: "trainer", kplan.TRAINJOB: "node"}
# each kind's (default apiVersion, Kind, plural); MPIJob's other version is kplan.API_VERSIONS'
API = {kplan.PYTORCHJOB: ("kubeflow.org/v1", "PyTorchJob", "pytorchjobs"),
       kplan.MPIJOB: (kplan.MPI_V2, "MPIJob", "mpijobs"),
       kplan.PADDLEJOB: ("kubeflow.org/v1", "PaddleJob", "paddlejobs"),
       kplan.JOBSET: ("jobset.x-k8s.io/v1alpha2", "JobSet", "jobsets"),
       kplan.TRAINJOB: trainjob.API}
RUNTIME = trainjob.RUNTIME      # a TrainJob's TrainingRuntime, also created by fluidctl


class Spec:
    """What the rendering needs beside the plan."""

    def __init__(self, kind: str, name: str, namespace: str, image: str, python: str,
                 token: str, max_restarts: int = 0, gpus_per_pod: int = 0,
                 workdir: Optional[str] = None, mpirun: Sequence[str] = (),
                 grace: float = GRACE_PERIOD, api_version: Optional[str] = None,
                 restart: str = kplan.GROUP, port: int = kplan.DEFAULT_PORT):
        self.kind, self.name, self.namespace, self.image = kind, name, namespace, image
        self.python, self.token, self.max_restarts = python, token, max_restarts
        self.gpus_per_pod, self.workdir, self.mpirun = gpus_per_pod, workdir, list(mpirun)
        self.grace = grace          # --grace-period: SIGTERM to SIGKILL inside a pod
        self.api_version = api_version or API[kind][0]
        self.restart, self.port = restart, port     # --restart-policy, the pods' first port


def _client():
    from kubernetes import client
    return client


def to_dict(obj) -> dict:
    """A kubernetes or kubeflow model as the API's JSON (camelCase keys, no None)."""
    from kubernetes.client import ApiClient
    return ApiClient().sanitize_for_serialization(obj)


def _meta(spec: Spec, name: str):
    c = _client()
    return c.V1ObjectMeta(name=name, namespace=spec.namespace,
                          labels={**MANAGED, JOB_LABEL: spec.name})


def shares(plan: Plan, grace: float = GRACE_PERIOD) -> List[dict]:
    """Each node's processes as the NodeShare record its pod derives (the token left out)."""
    from fluidctl.backends.k8s.layout import node_share
    return [node_share(plan, i, grace).to_record() for i in range(len(plan.job.nodes))]


def secret(spec: Spec):
    c = _client()
    return c.V1Secret(api_version="v1", kind="Secret", metadata=_meta(spec, f"{spec.name}-token"),
                      type="Opaque", string_data={TOKEN_KEY: spec.token})


def config_map(spec: Spec, plan: Plan):
    """The plan as the compact layout every pod derives its own share from (O(nodes))."""
    from fluidctl.backends.k8s import layout
    c = _client()
    data = layout.to_text({"name": spec.name, "kind": spec.kind,
                           **layout.record(plan, spec.port, spec.grace)})
    return c.V1ConfigMap(api_version="v1", kind="ConfigMap",
                         metadata=_meta(spec, f"{spec.name}-plan"), data={PLAN_FILE: data})


def _env_var(name: str, value: Optional[str] = None, field: Optional[str] = None):
    c = _client()
    if field:
        return c.V1EnvVar(name=name, value_from=c.V1EnvVarSource(
            field_ref=c.V1ObjectFieldSelector(field_path=field)))
    return c.V1EnvVar(name=name, value=value)


def _token_env(spec: Spec):
    c = _client()
    return c.V1EnvVar(name=envs.JOB_TOKEN, value_from=c.V1EnvVarSource(
        secret_key_ref=c.V1SecretKeySelector(name=f"{spec.name}-token", key=TOKEN_KEY)))


def pod_template(spec: Spec, command: List[str], env: List, *, gpus: int = 0,
                 plan_volume: bool = True, restart: Optional[str] = None):
    """One replica set's pod: the image, its command, env (the token by secretKeyRef), the
    plan's ConfigMap at /etc/fluidctl, ``nvidia.com/gpu`` limits."""
    c = _client()
    token = _token_env(spec)
    resources = c.V1ResourceRequirements(limits={GPU: str(gpus)}) if gpus else None
    mounts = [c.V1VolumeMount(name="fluidctl-plan", mount_path=PLAN_DIR, read_only=True)] \
        if plan_volume else None
    volumes = [c.V1Volume(name="fluidctl-plan", config_map=c.V1ConfigMapVolumeSource(
        name=f"{spec.name}-plan"))] if plan_volume else None
    container = c.V1Container(name=CONTAINER[spec.kind], image=spec.image, command=command,
                              env=[token, *env], resources=resources, volume_mounts=mounts,
                              working_dir=spec.workdir)
    return c.V1PodTemplateSpec(
        metadata=c.V1ObjectMeta(labels={**MANAGED, JOB_LABEL: spec.name}),
        spec=c.V1PodSpec(containers=[container], volumes=volumes, restart_policy=restart))


def pod_command(spec: Spec) -> List[str]:
    return [spec.python, "-m", "fluidctl.backends.k8s.pod", f"{PLAN_DIR}/{PLAN_FILE}"]


def node_env(base: int, index_field: Optional[str]) -> List:
    """Where the pod finds its node: a fixed base plus its index in the replica set."""
    index = _env_var(NODE_INDEX, field=index_field) if index_field else _env_var(NODE_INDEX, "0")
    return [_env_var(NODE_BASE, str(base)), index]


def _restart(spec: Spec) -> str:
    return "OnFailure" if spec.max_restarts else "Never"


def render(spec: Spec, plan: Plan) -> List[dict]:
    """Every object of the job, in the order to create them (Secret, ConfigMap, the job);
    a UsageError when one would pass the API server's limit on an object."""
    objects = [to_dict(secret(spec))]
    if spec.kind == kplan.MPIJOB:
        job = mpijob_v2(spec, plan) if spec.api_version == kplan.MPI_V2 \
            else to_dict(mpijob(spec, plan))
        return refuse_oversized(objects + [job])
    objects.append(to_dict(config_map(spec, plan)))
    trainers = sum(1 for n in plan.job.nodes if n.nproc)
    pservers = len(plan.job.nodes) - trainers
    if spec.kind == kplan.JOBSET:
        objects.append(jobset(spec, trainers, pservers))
    elif spec.kind == kplan.TRAINJOB:
        objects += trainjob.objects(spec.name, to_dict(_meta(spec, spec.name)),
                                    jobset_spec(spec, trainers, pservers), trainers)
    else:
        objects.append(to_dict(kubeflow_job(spec, trainers, pservers)))
    return refuse_oversized(objects)


def refuse_oversized(objects: List[dict]) -> List[dict]:
    """The objects, unless one is over the API server's 1 MiB (then one line, exit 2)."""
    from fluidctl.backends.k8s.layout import LIMIT
    from fluidctl.errors import UsageError
    for obj in objects:
        size = len(json.dumps(obj, separators=(",", ":")))
        if size > LIMIT:
            raise UsageError(f"the {obj['kind']} {obj['metadata']['name']} would be {size} "
                             f"bytes, over the API server's limit of {LIMIT} bytes per object",
                             "shorten what it holds (--env values, script arguments) or split "
                             "the job")
    return objects


def kubeflow_job(spec: Spec, trainers: int, pservers: int):
    """PyTorchJob (Master = node 0, Worker = the rest) or PaddleJob (Worker = the trainers,
    Master = the pservers in pserver mode)."""
    from kubeflow.training import models as kf
    cmd = pod_command(spec)

    def replicas(count: int, base: int, field: Optional[str]):
        return kf.KubeflowOrgV1ReplicaSpec(
            replicas=count, restart_policy=_restart(spec),
            template=pod_template(spec, cmd, node_env(base, field), gpus=spec.gpus_per_pod))
    # Running: once the trainers are done, pods still running (pservers) are deleted
    run_policy = kf.KubeflowOrgV1RunPolicy(backoff_limit=backoff_limit(spec, trainers + pservers),
                                           clean_pod_policy="Running")
    api_version, kind, _ = API[spec.kind]
    meta = _meta(spec, spec.name)
    if spec.kind == kplan.PYTORCHJOB:
        sets = {"Master": replicas(1, 0, None)}
        if trainers > 1:
            sets["Worker"] = replicas(trainers - 1, 1, REPLICA_INDEX)
        return kf.KubeflowOrgV1PyTorchJob(
            api_version=api_version, kind=kind, metadata=meta,
            spec=kf.KubeflowOrgV1PyTorchJobSpec(pytorch_replica_specs=sets, run_policy=run_policy))
    sets = {"Worker": replicas(trainers, 0, REPLICA_INDEX)}
    if pservers:
        sets["Master"] = kf.KubeflowOrgV1ReplicaSpec(
            replicas=pservers, restart_policy=_restart(spec),
            template=pod_template(spec, cmd, node_env(trainers, REPLICA_INDEX)))
    return kf.KubeflowOrgV1PaddleJob(
        api_version=api_version, kind=kind, metadata=meta,
        spec=kf.KubeflowOrgV1PaddleJobSpec(paddle_replica_specs=sets, run_policy=run_policy))


def mpijob(spec: Spec, plan: Plan):
    """MPIJob ``kubeflow.org/v1`` (``--api-version v1``): the Launcher runs the plan's mpirun
    (``launcher_command``; every rank is ``fluidctl worker``, which
    writes the contract from OMPI_*, as under ``--backend mpi``) over the operator's hostfile;
    the Workers only host the ranks (``sleep infinity`` until mpirun starts them)."""
    from kubeflow.training import models as kf
    launcher_env = mpi_env(plan)
    kind = API[spec.kind][1]
    workers = len(plan.job.nodes)
    launcher = kf.KubeflowOrgV1ReplicaSpec(
        replicas=1, restart_policy=_restart(spec),
        template=pod_template(spec, launcher_command(spec), launcher_env, plan_volume=False))
    worker = kf.KubeflowOrgV1ReplicaSpec(
        replicas=workers, restart_policy=_restart(spec),
        template=pod_template(spec, ["sleep", "infinity"], [], gpus=spec.gpus_per_pod,
                              plan_volume=False))
    return kf.KubeflowOrgV1MPIJob(
        api_version=kplan.MPI_V1, kind=kind, metadata=_meta(spec, spec.name),
        spec=kf.KubeflowOrgV1MPIJobSpec(
            slots_per_worker=plan.job.nodes[0].nproc,
            mpi_replica_specs={"Launcher": launcher, "Worker": worker},
            run_policy=kf.KubeflowOrgV1RunPolicy(backoff_limit=spec.max_restarts,
                                                 clean_pod_policy="Running")))


def backoff_limit(spec: Spec, pods: int) -> int:
    """The training operator's backoffLimit counts pod restarts, and it has no group restart:
    under ``--restart-policy group`` a failure ends every pod's ranks (their collectives
    break; each pod entry then exits) and each pod restarts, so a restart of the job costs
    one per pod."""
    return spec.max_restarts * (pods if spec.restart == kplan.GROUP else 1)


def mpijob_v2(spec: Spec, plan: Plan) -> dict:
    """MPIJob v2beta1 (``mpijob.py``): mpirun in the Launcher, sshd in the Workers."""
    launcher = pod_template(spec, launcher_command(spec), mpi_env(plan), plan_volume=False)
    worker = pod_template(spec, list(mpi_v2.SSHD), [], gpus=spec.gpus_per_pod,
                          plan_volume=False)
    return mpi_v2.mpijob(spec, plan, to_dict(_meta(spec, spec.name)), to_dict(launcher),
                         to_dict(worker))


def launcher_command(spec: Spec) -> List[str]:
    """The plan's mpirun, under the entry that makes its exit status true (``mpilaunch.py``)."""
    return [spec.python, "-m", "fluidctl.backends.k8s.mpilaunch", *spec.mpirun]


def mpi_env(plan: Plan) -> List:
    """The Launcher's environment: what mpirun exports to every rank (the token by Secret)."""
    env = {k: v for k, v in plan.procs[0].env.items() if k != envs.JOB_TOKEN}
    return [_env_var(k, v) for k, v in sorted(env.items())]


def jobset_spec(spec: Spec, trainers: int, pservers: int) -> dict:
    """A JobSet's spec: a replicated Job of trainers (Indexed, one pod per node) and, in
    pserver mode, one of pservers; pods reach each other as NAME-RJOB-0-INDEX.NAME (DNS
    hostnames on). ``--restart-policy group``: the JobSet recreates every Job on a failure
    (failurePolicy.maxRestarts); ``pod``: each Job replaces its failed pods (backoffLimit)."""
    cmd = pod_command(spec)
    group = spec.restart == kplan.GROUP

    def rjob(role: str, count: int, base: int, gpus: int) -> dict:
        template = to_dict(pod_template(spec, cmd, node_env(base, COMPLETION_INDEX), gpus=gpus,
                                        restart="Never"))
        return {"name": role, "replicas": 1, "template": {"spec": {
            "parallelism": count, "completions": count, "completionMode": "Indexed",
            "backoffLimit": 0 if group else spec.max_restarts * count, "template": template}}}
    rjobs = [rjob(kplan.TRAINER_SET[spec.kind], trainers, 0, spec.gpus_per_pod)]
    if pservers:
        rjobs.append(rjob(kplan.PSERVER_SET[spec.kind], pservers, trainers, 0))
    return {"replicatedJobs": rjobs,
            "network": {"enableDNSHostnames": True, "subdomain": spec.name},
            "failurePolicy": {"maxRestarts": spec.max_restarts if group else 0},
            "successPolicy": {"operator": "All", "targetReplicatedJobs": [rjobs[0]["name"]]}}


def jobset(spec: Spec, trainers: int, pservers: int) -> dict:
    """JobSet (``jobset_spec``), checked through the Kubeflow Trainer API's JobSet model."""
    from kubeflow_trainer_api import models as js
    api_version, kind, _ = API[spec.kind]
    record = {"apiVersion": api_version, "kind": kind,
              "metadata": to_dict(_meta(spec, spec.name)),
              "spec": jobset_spec(spec, trainers, pservers)}
    return js.JobsetV1alpha2JobSet.from_dict(record).to_dict()


def masked(objects: Sequence[dict]) -> List[dict]:
    """The objects with the Secret's token replaced by ``envs.MASKED_TOKEN`` (what --dry-run
    prints unless --show-secrets: plans get pasted into issues). Applied as it is, the job's
    pods refuse that token in one line (node/pod.py) instead of keying every connection with
    a public string."""
    out = []
    for obj in objects:
        if obj.get("kind") == "Secret":
            obj = {**obj, "stringData": {k: envs.MASKED_TOKEN for k in obj.get("stringData", {})}}
        out.append(obj)
    return out


def to_yaml(objects: Sequence[dict]) -> str:
    """YAML documents, multi-line strings (the plan) as literal blocks."""
    import yaml

    class Dumper(yaml.SafeDumper):
        pass

    def text(dumper, value):
        style = "|" if "\n" in value else None
        return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)
    Dumper.add_representer(str, text)
    return yaml.dump_all(list(objects), Dumper=Dumper, sort_keys=False,
                         default_flow_style=False)
