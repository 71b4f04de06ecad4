"""The pod and job fields Kubernetes users set (``fluidctl train --backend k8s``'s --mount,
--shm-size, --cpu, --memory, --node-selector, --toleration, --image-pull-secret,
--service-account, --priority-class, --queue, --scheduler, --ttl, --active-deadline, --label,
--annotation, --pod-template), and the fields fluidctl's own options mean on Kubernetes
(--grace-period, --hang-timeout, --checkpoint-signal): parsed once into ``PodOptions``
(one line for a mistake, nothing rendered), then written into the rendered objects by
``apply``, the one hook after ``render.render``: every pod template gets the pod fields, the
job object the job fields. ``--pod-template`` is merged last, as a strategic merge patch.

The checkpoint requests of ``fluidctl job checkpoint`` reach a pod through its annotation
``fluidctl.io/checkpoint``: the pod sees its own annotations in a downward API volume
(REQUESTS_DIR), which the kubelet refreshes, and the pod entry (pod.py) watches it.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Dict, List, Optional, Tuple

from fluidctl import envs
from fluidctl.errors import UsageError

# the pod's seconds after SIGTERM beyond --grace-period: the pod entry's own SIGTERM -> the
# ranks' checkpoint and exit -> its report, before the kubelet's SIGKILL
GRACE_MARGIN = 10
REQUESTS_DIR = "/etc/fluidctl-pod"       # the pod's own annotations (downward API)
REQUESTS_FILE = "annotations"
CHECKPOINT_ANNOTATION = "fluidctl.io/checkpoint"
MESSAGE_PATH = "/dev/termination-log"     # Kubernetes' terminationMessagePath default
SHM = "/dev/shm"
KUEUE_QUEUE = "kueue.x-k8s.io/queue-name"
SCHEDULERS = ("volcano",)
VOLCANO = "volcano"
MOUNT_TYPES = {"pvc": "persistentVolumeClaim", "hostpath": "hostPath", "bind": "hostPath",
               "configmap": "configMap", "secret": "secret", "emptydir": "emptyDir"}
EFFECTS = ("NoSchedule", "PreferNoSchedule", "NoExecute")
RESERVED_LABELS = ("app.kubernetes.io/managed-by", "fluidctl.io/job")
POD_ENTRY = "fluidctl.backends.k8s.pod"

_QUANTITY = re.compile(r"(\d+(\.\d+)?|\.\d+)([KMGTPE]i|[kMGTPEm])?")
_DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?")
_LABEL_VALUE = re.compile(r"(([A-Za-z0-9][-A-Za-z0-9_.]{0,61})?[A-Za-z0-9])?")
_LABEL_NAME = re.compile(r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?")


@dataclass(frozen=True)
class Mount:
    """One --mount: the volume's source of ``kind`` (the Volume field's name), at ``dst``."""
    kind: str
    src: str
    dst: str
    readonly: bool = False


@dataclass(frozen=True)
class PodOptions:
    mounts: Tuple[Mount, ...] = ()
    shm_size: Optional[str] = None
    cpu: Optional[str] = None
    memory: Optional[str] = None
    node_selector: Tuple[Tuple[str, str], ...] = ()
    tolerations: Tuple[Tuple[Tuple[str, str], ...], ...] = ()
    pull_secrets: Tuple[str, ...] = ()
    service_account: Optional[str] = None
    priority_class: Optional[str] = None
    queue: Optional[str] = None
    scheduler: Optional[str] = None
    ttl: Optional[int] = None
    active_deadline: Optional[int] = None
    labels: Tuple[Tuple[str, str], ...] = ()
    annotations: Tuple[Tuple[str, str], ...] = ()
    pod_template: Optional[dict] = None         # --pod-template's patch, read
    grace: float = 30.0                         # --grace-period
    hang_timeout: Optional[float] = None        # --hang-timeout
    checkpoint_signal: str = "TERM"             # --checkpoint-signal


# --- parsing: one line for each mistake ------------------------------------------------------

def _quantity(flag: str, value: str, example: str) -> str:
    if not _QUANTITY.fullmatch(value or "") or not re.search(r"[1-9]", value):
        raise UsageError(f"{flag} {value!r} is not a Kubernetes quantity",
                         f"give a positive amount such as {example}")
    return value


def _name(flag: str, value: str) -> str:
    if not _DNS_SUBDOMAIN.fullmatch(value or ""):
        raise UsageError(f"{flag} {value!r} is not a Kubernetes object name",
                         "use up to 253 lower-case letters, digits, '-' and '.', e.g. team-a")
    return value


def _label_key(flag: str, key: str) -> str:
    prefix, _, name = key.rpartition("/")
    if not _LABEL_NAME.fullmatch(name) or (prefix and not _DNS_SUBDOMAIN.fullmatch(prefix)):
        raise UsageError(f"{flag} key {key!r} is not a Kubernetes label key",
                         "write [PREFIX/]NAME, NAME up to 63 letters, digits, '-', '_', '.'")
    return key


def _pairs(flag: str, given, example: str, labels: bool = True) -> Tuple[Tuple[str, str], ...]:
    """KEY=VALUE, repeatable (and comma-separated, as kubectl's -l)."""
    out: Dict[str, str] = {}
    for item in given or ():
        for pair in (item.split(",") if labels else [item]):
            key, sep, value = pair.partition("=")
            if not sep or not key:
                raise UsageError(f"{flag} {pair!r} is not KEY=VALUE", f"e.g. {flag} {example}")
            _label_key(flag, key)
            if labels and not _LABEL_VALUE.fullmatch(value):
                raise UsageError(f"{flag} {pair!r}: {value!r} is not a label value",
                                 "use up to 63 letters, digits, '-', '_' and '.'")
            if key in RESERVED_LABELS:
                raise UsageError(f"{flag} {key} is fluidctl's own", "choose another key")
            out[key] = value
    return tuple(out.items())


def parse_mount(text: str) -> Mount:
    """type=pvc,src=NAME,dst=/data[,readonly] (docker's and torchx's form; kubectl's types)."""
    fields: Dict[str, str] = {}
    for part in text.split(","):
        key, sep, value = part.partition("=")
        key = {"source": "src", "target": "dst", "destination": "dst", "ro": "readonly",
               "read_only": "readonly"}.get(key.strip(), key.strip())
        if key == "readonly" and not sep:
            value = "true"
        if key not in ("type", "src", "dst", "readonly"):
            raise UsageError(f"--mount {text!r}: unknown field {key!r}",
                             "write type=pvc,src=NAME,dst=/data[,readonly]")
        fields[key] = value.strip()
    kind = MOUNT_TYPES.get(fields.get("type", "").lower())
    if kind is None:
        raise UsageError(f"--mount {text!r} needs type= one of pvc, hostPath, configMap, "
                         "secret, emptyDir", "e.g. --mount type=pvc,src=datasets,dst=/data")
    dst = fields.get("dst", "")
    if not dst.startswith("/"):
        raise UsageError(f"--mount {text!r} needs dst= an absolute path in the pod",
                         "e.g. --mount type=pvc,src=datasets,dst=/data")
    src = fields.get("src", "")
    if kind == "emptyDir":
        if src:
            raise UsageError(f"--mount {text!r}: an emptyDir has no src",
                             "e.g. --mount type=emptyDir,dst=/scratch")
    elif kind == "hostPath":
        if not src.startswith("/"):
            raise UsageError(f"--mount {text!r} needs src= an absolute path on the node",
                             "e.g. --mount type=hostPath,src=/mnt/data,dst=/data")
    else:
        _name(f"--mount type={fields['type']},src", src)
    readonly = fields.get("readonly", "false").lower()
    if readonly not in ("true", "false", "1", "0"):
        raise UsageError(f"--mount {text!r}: readonly={readonly!r}", "write readonly or "
                         "readonly=true")
    return Mount(kind, src, dst.rstrip("/") or "/", readonly in ("true", "1"))


def parse_toleration(text: str) -> Tuple[Tuple[str, str], ...]:
    """kubectl taint's form: KEY[=VALUE][:EFFECT] (no value: the key exists)."""
    body, _, effect = text.partition(":")
    key, sep, value = body.partition("=")
    if not key or (effect and effect not in EFFECTS):
        raise UsageError(f"--toleration {text!r} is not KEY[=VALUE][:EFFECT]",
                         f"EFFECT one of {', '.join(EFFECTS)}, e.g. --toleration "
                         "nvidia.com/gpu=present:NoSchedule")
    _label_key("--toleration", key)
    out = [("key", key), ("operator", "Equal" if sep else "Exists")]
    if sep:
        out.append(("value", value))
    if effect:
        out.append(("effect", effect))
    return tuple(out)


def _seconds(flag: str, value) -> Optional[int]:
    if value is None:
        return None
    try:
        seconds = int(value)
    except (TypeError, ValueError):
        seconds = -1
    if seconds < (0 if flag == "--ttl" else 1):
        raise UsageError(f"{flag} {value!r} is not a number of seconds",
                         f"e.g. {flag} 3600")
    return seconds


def read_pod_template(path: Optional[str]) -> Optional[dict]:
    """--pod-template FILE: a pod template (metadata, spec), a PodTemplate, or a Pod."""
    if not path:
        return None
    import yaml
    try:
        with open(path, encoding="utf-8") as f:
            patch = yaml.safe_load(f)
    except OSError as exc:
        raise UsageError(f"cannot read --pod-template {path}: {exc.strerror or exc}",
                         "check the path") from None
    except yaml.YAMLError as exc:
        raise UsageError(f"--pod-template {path} is not YAML: "
                         f"{str(exc).splitlines()[0]}", "fix the file") from None
    if isinstance(patch, dict) and patch.get("kind") == "PodTemplate":
        patch = patch.get("template")
    if isinstance(patch, dict) and patch.get("kind") == "Pod":
        patch = {k: v for k, v in patch.items() if k in ("metadata", "spec")}
    if not isinstance(patch, dict) or not set(patch) <= {"metadata", "spec"} or not patch:
        raise UsageError(f"--pod-template {path} is not a pod template",
                         "write a mapping with metadata: and/or spec: (as a Pod's)")
    return patch


def parse(values: dict, config, *, gang: bool = True,
          starter: Optional[str] = None) -> PodOptions:
    """The options' values (popped from ``values``) and the LaunchConfig's, checked.
    ``gang``: the kind has a Volcano gang form (Kubeflow's runPolicy.schedulingPolicy);
    ``starter``: what starts the ranks when fluidctl's pod entry does not (mpirun,
    torchrun)."""
    take = values.pop
    mounts = tuple(parse_mount(m) for m in take("mount", None) or ())
    shm = take("shm_size", None)
    if shm is not None:
        _quantity("--shm-size", shm, "--shm-size 16Gi")
    targets = [m.dst for m in mounts] + ([SHM] if shm else [])
    for dst in targets:
        if targets.count(dst) > 1:
            raise UsageError(f"two volumes at {dst}", "give each --mount its own dst; "
                             "/dev/shm is --shm-size's")
        if dst in ("/etc/fluidctl", REQUESTS_DIR):
            raise UsageError(f"--mount dst={dst} is where fluidctl puts the job's plan",
                             "mount it elsewhere")
    cpu, memory = take("cpu", None), take("memory", None)
    if cpu is not None:
        _quantity("--cpu", cpu, "--cpu 8 or --cpu 500m")
    if memory is not None:
        _quantity("--memory", memory, "--memory 64Gi")
    scheduler, queue = take("scheduler", None), take("queue", None)
    if scheduler is not None and scheduler not in SCHEDULERS:
        raise UsageError(f"--scheduler {scheduler!r} is not one fluidctl renders for",
                         "use --scheduler volcano, or --queue NAME alone for Kueue")
    if scheduler == VOLCANO and not gang:
        raise UsageError("--scheduler volcano has no gang form in a JobSet",
                         "use --queue NAME (Kueue admits JobSets whole), or --kind "
                         "pytorchjob or paddlejob")
    if queue is not None:
        _name("--queue", queue)             # a Kueue LocalQueue's or a Volcano queue's name
    if config.checkpoint_signal != "TERM" and starter:
        raise UsageError(f"--checkpoint-signal is what fluidctl sends the ranks, and {starter} "
                         "starts them itself", "drop --checkpoint-signal, or run a job "
                         "fluidctl supervises: a fixed --nodes N, a kind other than mpijob")
    if config.hang_timeout and starter:
        raise UsageError(f"--hang-timeout needs fluidctl supervising the ranks, and {starter} "
                         "starts them itself", "drop --hang-timeout, or run a job fluidctl "
                         "supervises: a fixed --nodes N, a kind other than mpijob")
    return PodOptions(
        mounts=mounts, shm_size=shm, cpu=cpu, memory=memory,
        node_selector=_pairs("--node-selector", take("node_selector", None),
                             "gpu-type=h100"),
        tolerations=tuple(parse_toleration(t) for t in take("tolerations", None) or ()),
        pull_secrets=tuple(_name("--image-pull-secret", s)
                           for s in take("image_pull_secrets", None) or ()),
        service_account=_optional(_name, "--service-account", take("service_account", None)),
        priority_class=_optional(_name, "--priority-class", take("priority_class", None)),
        queue=queue, scheduler=scheduler,
        ttl=_seconds("--ttl", take("ttl", None)),
        active_deadline=_seconds("--active-deadline", take("active_deadline", None)),
        labels=_pairs("--label", take("labels", None), "team=nlp"),
        annotations=_pairs("--annotation", take("annotations", None), "owner=ana",
                           labels=False),
        pod_template=read_pod_template(take("pod_template", None)),
        grace=config.grace_period, hang_timeout=config.hang_timeout,
        checkpoint_signal=config.checkpoint_signal)


def _optional(check, flag, value):
    return None if value is None else check(flag, value)


# --- rendering ------------------------------------------------------------------------------

def grace_seconds(grace: float) -> int:
    """terminationGracePeriodSeconds: --grace-period and the pod entry's margin."""
    return int(math.ceil(grace)) + GRACE_MARGIN


def _volume(name: str, mount: Mount) -> dict:
    source = {"persistentVolumeClaim": {"claimName": mount.src},
              "hostPath": {"path": mount.src},
              "configMap": {"name": mount.src},
              "secret": {"secretName": mount.src},
              "emptyDir": {}}[mount.kind]
    if mount.kind == "persistentVolumeClaim" and mount.readonly:
        source["readOnly"] = True
    return {"name": name, mount.kind: source}


def _runs_pod_entry(container: dict) -> bool:
    return POD_ENTRY in (container.get("command") or [])


def pod(template: dict, opts: PodOptions) -> None:
    """Write the pod fields into one pod template (a dict: metadata, spec)."""
    spec = template.setdefault("spec", {})
    meta = template.setdefault("metadata", {})
    container = spec["containers"][0]
    spec["terminationGracePeriodSeconds"] = grace_seconds(opts.grace)
    volumes, mounts = spec.setdefault("volumes", []), container.setdefault("volumeMounts", [])
    for i, mount in enumerate(opts.mounts):
        name = f"mount-{i}"
        volumes.append(_volume(name, mount))
        entry = {"name": name, "mountPath": mount.dst}
        if mount.readonly:
            entry["readOnly"] = True
        mounts.append(entry)
    if opts.shm_size:
        volumes.append({"name": "dshm", "emptyDir": {"medium": "Memory",
                                                     "sizeLimit": opts.shm_size}})
        mounts.append({"name": "dshm", "mountPath": SHM})
    if _runs_pod_entry(container):
        volumes.append({"name": "fluidctl-pod", "downwardAPI": {"items": [
            {"path": REQUESTS_FILE, "fieldRef": {"fieldPath": "metadata.annotations"}}]}})
        mounts.append({"name": "fluidctl-pod", "mountPath": REQUESTS_DIR, "readOnly": True})
        env = container.setdefault("env", [])
        env.append({"name": envs.K8S_REQUESTS, "value": f"{REQUESTS_DIR}/{REQUESTS_FILE}"})
        env.append({"name": envs.K8S_MESSAGE, "value": MESSAGE_PATH})
        env.append({"name": envs.CHECKPOINT_SIGNAL, "value": opts.checkpoint_signal})
        if opts.hang_timeout:
            env.append({"name": envs.HANG_TIMEOUT, "value": f"{opts.hang_timeout:g}"})
        container["terminationMessagePolicy"] = "FallbackToLogsOnError"
    for key in ("volumes",):
        if not spec[key]:
            del spec[key]
    if not mounts:
        del container["volumeMounts"]
    resources = {k: v for k, v in (("cpu", opts.cpu), ("memory", opts.memory)) if v}
    if resources:
        given = container.setdefault("resources", {})
        given["requests"] = {**given.get("requests", {}), **resources}
        given["limits"] = {**given.get("limits", {}), **resources}
    if opts.node_selector:
        spec["nodeSelector"] = dict(opts.node_selector)
    if opts.tolerations:
        spec["tolerations"] = [dict(t) for t in opts.tolerations]
    if opts.pull_secrets:
        spec["imagePullSecrets"] = [{"name": s} for s in opts.pull_secrets]
    if opts.service_account:
        spec["serviceAccountName"] = opts.service_account
    if opts.priority_class:
        spec["priorityClassName"] = opts.priority_class
    if opts.scheduler:
        spec["schedulerName"] = opts.scheduler
    if opts.labels:
        meta["labels"] = {**meta.get("labels", {}), **dict(opts.labels)}
    if opts.annotations:
        meta["annotations"] = {**meta.get("annotations", {}), **dict(opts.annotations)}
    if opts.pod_template:
        import copy
        merged = merge(template, copy.deepcopy(opts.pod_template))     # no shared parts
        template.clear()
        template.update(merged)


def merge(base, patch):
    """A strategic merge patch, as kubectl applies one to a pod: mappings merge key by key,
    lists of named items (containers, volumes, env, volumeMounts, ports, imagePullSecrets) by
    their name (an unnamed container patches the first), other lists and values replace;
    ``null`` removes a key."""
    if isinstance(base, dict) and isinstance(patch, dict):
        out = dict(base)
        for key, value in patch.items():
            if value is None:
                out.pop(key, None)
            elif key in out:
                out[key] = merge(out[key], value)
            else:
                out[key] = value
        return out
    if isinstance(base, list) and isinstance(patch, list) and _named(base) and all(
            isinstance(p, dict) for p in patch):
        out = list(base)
        for item in patch:
            name = item.get("name")
            at = next((i for i, b in enumerate(out) if b.get("name") == name), None)
            if at is None and name is None and out:
                at = 0
            if at is None:
                out.append(item)
            else:
                out[at] = merge(out[at], item)
        return out
    return patch


def _named(items: list) -> bool:
    return bool(items) and all(isinstance(i, dict) and "name" in i for i in items)


def pod_templates(obj, found: Optional[List[dict]] = None) -> List[dict]:
    """Every pod template in a rendered object (a dict whose spec holds containers)."""
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


def _pod_count(spec: dict) -> int:
    sets = next((v for k, v in spec.items() if k.endswith("ReplicaSpecs")), {})
    return sum(int(s.get("replicas") or 1) for s in sets.values())


def job(obj: dict, opts: PodOptions, runtime: Optional[dict] = None) -> None:
    """Write the job fields into the job object (the last rendered one); a TrainJob's Job
    fields go into its TrainingRuntime's JobSet template (``runtime``)."""
    meta = obj.setdefault("metadata", {})
    labels = dict(opts.labels)
    if opts.queue and opts.scheduler != VOLCANO:
        labels[KUEUE_QUEUE] = opts.queue
    if labels:
        meta["labels"] = {**meta.get("labels", {}), **labels}
    if opts.annotations:
        meta["annotations"] = {**meta.get("annotations", {}), **dict(opts.annotations)}
    spec, kind = obj["spec"], obj["kind"]
    if runtime is not None:
        spec, kind = runtime["spec"]["template"]["spec"], "JobSet"
    if kind == "JobSet":
        if opts.ttl is not None:
            spec["ttlSecondsAfterFinished"] = opts.ttl
        for rjob in spec["replicatedJobs"]:
            if opts.active_deadline is not None:
                rjob["template"]["spec"]["activeDeadlineSeconds"] = opts.active_deadline
        return
    policy = spec.setdefault("runPolicy", {})
    if opts.ttl is not None:
        policy["ttlSecondsAfterFinished"] = opts.ttl
    if opts.active_deadline is not None:
        policy["activeDeadlineSeconds"] = opts.active_deadline
    if opts.scheduler == VOLCANO:
        gang = {"minAvailable": _pod_count(spec)}
        if opts.queue:
            gang["queue"] = opts.queue
        if opts.priority_class:
            gang["priorityClass"] = opts.priority_class
        policy["schedulingPolicy"] = gang


def apply(objects: List[dict], opts: Optional[PodOptions]) -> List[dict]:
    """The hook: the options written into the rendered objects (in place; returned)."""
    if opts is None or not objects:
        return objects
    job_obj = objects[-1]
    runtime = None
    if job_obj["kind"] == "TrainJob":       # its pods are its TrainingRuntime's
        runtime = next(o for o in objects if o["kind"] == "TrainingRuntime")
    for template in pod_templates(runtime or job_obj):
        pod(template, opts)
    job(job_obj, opts, runtime)
    return objects
