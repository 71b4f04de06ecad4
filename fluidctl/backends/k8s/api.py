"""The Kubernetes API through the ``kubernetes`` client: submit a rendered job (``--apply``) and
``fluidctl job list|status|logs|cancel`` for the jobs fluidctl submitted (label
``app.kubernetes.io/managed-by=fluidctl``). A job is named ``KIND/NAME`` (e.g.
``pytorchjob/bert``). Every call has a deadline (TIMEOUT seconds); without a kubeconfig, or
with one that cannot be read, one line and exit 2.
"""
from __future__ import annotations

import os
from typing import List, Optional, Sequence, Tuple

from fluidctl.errors import UsageError
from fluidctl.backends.k8s.render import API, JOB_LABEL, MANAGED, RUNTIME
from fluidctl.backends.k8s.plan import API_VERSIONS, KINDS, TRAINJOB

TIMEOUT = 30.0              # seconds for each API call


def kubeconfig_path(environ=None) -> str:
    """$KUBECONFIG (its first file), else ~/.kube/config."""
    environ = os.environ if environ is None else environ
    given = environ.get("KUBECONFIG", "")
    first = given.split(os.pathsep)[0] if given else ""
    return first or os.path.expanduser("~/.kube/config")


def api_client(environ=None):
    """A client for the kubeconfig's current context (or the pod's service account inside a
    cluster); a UsageError when there is neither."""
    from kubernetes import client, config as kconfig
    environ = os.environ if environ is None else environ
    path = kubeconfig_path(environ)
    if os.path.exists(path):
        try:
            return kconfig.new_client_from_config(config_file=path)
        except Exception as exc:        # the client's own ConfigException and YAML errors
            raise UsageError(f"cannot use the kubeconfig {path}: {exc}".splitlines()[0],
                             "fix it, or point KUBECONFIG at a working one "
                             "(kubectl config view)") from None
    if environ.get("KUBERNETES_SERVICE_HOST"):
        kconfig.load_incluster_config()
        return client.ApiClient()
    why = "KUBECONFIG names it" if environ.get("KUBECONFIG") else "KUBECONFIG is not set"
    raise UsageError(f"no kubeconfig: {path} does not exist ({why})",
                     "point KUBECONFIG at your cluster's kubeconfig, or use --dry-run to "
                     "print the YAML")


def _fail(what: str, exc) -> UsageError:
    status = getattr(exc, "status", None)
    reason = getattr(exc, "reason", None) or str(exc).splitlines()[0]
    return UsageError(f"{what}: {status or ''} {reason}".replace("  ", " "),
                      "check the kubeconfig's context and your rights in the namespace "
                      "(kubectl auth can-i create pods)")


def apply(objects: Sequence[dict], namespace: str, environ=None) -> List[str]:
    """Create each object (Secret, ConfigMap, the job), in order; their KIND/NAME."""
    from kubernetes import client
    api = api_client(environ)
    core, custom = client.CoreV1Api(api), client.CustomObjectsApi(api)
    created = []
    for obj in objects:
        kind, name = obj["kind"], obj["metadata"]["name"]
        try:
            if kind == "Secret":
                core.create_namespaced_secret(namespace, obj, _request_timeout=TIMEOUT)
            elif kind == "ConfigMap":
                core.create_namespaced_config_map(namespace, obj, _request_timeout=TIMEOUT)
            else:
                group, version, plural = _crd(obj)
                custom.create_namespaced_custom_object(group, version, namespace, plural, obj,
                                                       _request_timeout=TIMEOUT)
        except client.ApiException as exc:
            raise _fail(f"creating {kind} {namespace}/{name} failed", exc) from None
        created.append(f"{kind}/{name}")
    return created


def _crd(obj: dict) -> Tuple[str, str, str]:
    group, _, version = obj["apiVersion"].partition("/")
    plural = next(p for _, k, p in (*API.values(), RUNTIME) if k == obj["kind"])
    return group, version, plural


def versions(kind: str) -> List[Tuple[str, str, str]]:
    """(group, version, plural) of each version a kind is served as, the default first
    (an MPIJob is v2beta1 where mpi-operator is installed, v1 where the training operator)."""
    api_version, _, plural = API[kind]
    out = []
    for v in API_VERSIONS.get(kind, (api_version,)):
        group, _, version = v.partition("/")
        out.append((group, version, plural))
    return out


def _each_version(kind: str, call):
    """``call(group, version, plural)`` for the kind's served versions until one is found."""
    from kubernetes import client
    served = versions(kind)
    for i, (group, version, plural) in enumerate(served):
        try:
            return call(group, version, plural)
        except client.ApiException as exc:
            if exc.status != 404 or i == len(served) - 1:
                raise


def parse_job_id(job_id: str) -> Tuple[str, str]:
    """'pytorchjob/bert' -> ('pytorchjob', 'bert')."""
    kind, _, name = job_id.partition("/")
    if kind.lower() not in KINDS or not name:
        raise UsageError(f"{job_id!r} is not a Kubernetes job of fluidctl's",
                         f"write KIND/NAME with KIND one of {', '.join(KINDS)}, "
                         "e.g. pytorchjob/bert")
    return kind.lower(), name


def is_k8s_job(job_id: str) -> bool:
    return job_id.partition("/")[0].lower() in KINDS and "/" in job_id


def _state(obj: dict) -> str:
    """The job's last true condition (Created, Running, Succeeded, Failed, ...)."""
    conditions = (obj.get("status") or {}).get("conditions") or []
    true = [c for c in conditions if c.get("status") == "True"]
    return true[-1]["type"] if true else "Pending"


def list_jobs(namespace: Optional[str], environ=None) -> List[dict]:
    """Every fluidctl-managed job of each kind: {job_id, namespace, state}."""
    from kubernetes import client
    custom = client.CustomObjectsApi(api_client(environ))
    selector = ",".join(f"{k}={v}" for k, v in MANAGED.items())
    rows = []
    for kind, group, version, plural in [(k, *v) for k in API for v in versions(k)]:
        try:
            if namespace:
                found = custom.list_namespaced_custom_object(
                    group, version, namespace, plural, label_selector=selector,
                    _request_timeout=TIMEOUT)
            else:
                found = custom.list_cluster_custom_object(
                    group, version, plural, label_selector=selector, _request_timeout=TIMEOUT)
        except client.ApiException as exc:
            if exc.status == 404:       # that operator is not installed
                continue
            raise _fail(f"listing {plural} failed", exc) from None
        for obj in found.get("items", []):
            rows.append({"job_id": f"{kind}/{obj['metadata']['name']}",
                         "namespace": obj["metadata"].get("namespace", ""),
                         "state": _state(obj)})
    return rows


def get_job(job_id: str, namespace: str, environ=None) -> dict:
    from kubernetes import client
    kind, name = parse_job_id(job_id)
    custom = client.CustomObjectsApi(api_client(environ))
    try:
        return _each_version(kind, lambda group, version, plural:
                             custom.get_namespaced_custom_object(
                                 group, version, namespace, plural, name,
                                 _request_timeout=TIMEOUT))
    except client.ApiException as exc:
        raise _fail(f"reading {job_id} in {namespace} failed", exc) from None


def status(job_id: str, namespace: str, environ=None) -> str:
    return _state(get_job(job_id, namespace, environ))


def pod_ends(job_id: str, namespace: str, environ=None) -> List[dict]:
    """The job's pods whose container ended with a non-zero code: {pod, exit_code, reason,
    message}, the message being what the pod left (a hang report, else its log's tail)."""
    from kubernetes import client
    core = client.CoreV1Api(api_client(environ))
    try:
        pods = _pods(core, job_id, namespace)
    except client.ApiException as exc:
        raise _fail(f"reading the pods of {job_id} failed", exc) from None
    out = []
    for pod in pods:
        for container in (pod.status.container_statuses or []) if pod.status else []:
            ended = container.state.terminated if container.state else None
            if ended is None and container.last_state is not None:
                ended = container.last_state.terminated      # restarted since
            if ended is not None and ended.exit_code:
                out.append({"pod": pod.metadata.name, "exit_code": ended.exit_code,
                            "reason": ended.reason or "", "message": ended.message or ""})
    return out


def annotate_pods(job_id: str, namespace: str, annotations: dict, environ=None) -> List[str]:
    """Set ``annotations`` on every pod of the job (a strategic merge patch); their names."""
    from kubernetes import client
    core = client.CoreV1Api(api_client(environ))
    try:
        names = [p.metadata.name for p in _pods(core, job_id, namespace)]
        for name in names:
            core.patch_namespaced_pod(name, namespace, {"metadata": {"annotations": annotations}},
                                      _request_timeout=TIMEOUT)
    except client.ApiException as exc:
        raise _fail(f"asking the pods of {job_id} failed", exc) from None
    return names


def _pods(core, job_id: str, namespace: str) -> list:
    """The job's pods (V1Pod), by name."""
    _, name = parse_job_id(job_id)
    pods = core.list_namespaced_pod(namespace, label_selector=f"{JOB_LABEL}={name}",
                                    _request_timeout=TIMEOUT).items
    return sorted(pods, key=lambda p: p.metadata.name)


def _pod_name(core, job_id: str, namespace: str, pod: int) -> str:
    """The job's ``pod``-th pod, by name."""
    names = [p.metadata.name for p in _pods(core, job_id, namespace)]
    if pod >= len(names):
        raise UsageError(f"{job_id} has {len(names)} pod(s) now, no pod {pod}",
                         "wait until it is scheduled (fluidctl job status), or pick "
                         "another --rank")
    return names[pod]


def pods(job_id: str, namespace: str, environ=None) -> List[dict]:
    """The job's pods by name, each with its node, phase, container restarts and the last
    line of its log (``fluidctl top``): one list call and one short log read per pod."""
    from kubernetes import client
    core = client.CoreV1Api(api_client(environ))
    _, name = parse_job_id(job_id)
    try:
        items = core.list_namespaced_pod(namespace, label_selector=f"{JOB_LABEL}={name}",
                                         _request_timeout=TIMEOUT).items
    except client.ApiException as exc:
        raise _fail(f"listing the pods of {job_id} failed", exc) from None
    out = []
    for pod in sorted(items, key=lambda p: p.metadata.name):
        status = pod.status
        restarts = sum(c.restart_count or 0 for c in (status.container_statuses or ())) \
            if status else 0
        try:
            tail = core.read_namespaced_pod_log(pod.metadata.name, namespace, tail_lines=1,
                                                _request_timeout=TIMEOUT)
        except client.ApiException:         # not started yet
            tail = ""
        out.append({"name": pod.metadata.name,
                    "node": pod.spec.node_name if pod.spec else None,
                    "phase": (status.phase if status else None) or "Pending",
                    "restarts": restarts, "last_line": (tail or "").strip()})
    return out


def logs(job_id: str, namespace: str, pod: int = 0, environ=None) -> str:
    """The log of the job's ``pod``-th pod (by name), which echoes all its processes."""
    from kubernetes import client
    core = client.CoreV1Api(api_client(environ))
    try:
        return core.read_namespaced_pod_log(_pod_name(core, job_id, namespace, pod),
                                            namespace, _request_timeout=TIMEOUT)
    except client.ApiException as exc:
        raise _fail(f"reading the logs of {job_id} failed", exc) from None


ENDED = ("Succeeded", "Failed")
QUIET = 30.0                # seconds a followed log may stay silent before the job is asked


def _stamp(text: str) -> Tuple[str, int]:
    """An RFC 3339 timestamp the API server put before a line ('...T03:30:00.5Z'; the
    fraction has up to 9 digits, trailing zeros cut): (its seconds part, nanoseconds),
    which order as the times do."""
    whole, _, frac = text.rstrip("Z").partition(".")
    return whole, int((frac + "000000000")[:9] or 0)


def follow_logs(job_id: str, namespace: str, pod: int, write, environ=None,
                quiet: Optional[float] = None) -> str:
    """Write the pod's log lines through ``write`` as they come, until the job ends; its
    final state. The stream is read with a deadline (``quiet`` seconds without a byte): then,
    or when the API server ends the stream (the container stopped, the connection dropped),
    the job's state is read and the stream opened again. Lines come with the server's
    timestamps, so a line seen before the reconnect is never written twice."""
    import time
    from kubernetes import client
    from urllib3.exceptions import HTTPError
    quiet = QUIET if quiet is None else quiet
    core = client.CoreV1Api(api_client(environ))
    last: Optional[Tuple[str, int]] = None
    last_at = 0.0
    try:
        name = _pod_name(core, job_id, namespace, pod)
        while True:
            since = int(time.time() - last_at) + 2 if last is not None else None
            extra = {"since_seconds": since} if since is not None else {}
            try:
                stream = core.read_namespaced_pod_log(
                    name, namespace, follow=True, timestamps=True, _preload_content=False,
                    _request_timeout=(TIMEOUT, quiet), **extra)
                pending = b""
                # read1: what has come, at once (read(amt) would wait for amt bytes)
                for chunk in iter(lambda: stream.read1(1 << 16), b""):
                    *lines, pending = (pending + chunk).split(b"\n")
                    for line in lines:
                        stamp_text, _, text = line.decode("utf-8", "replace").partition(" ")
                        stamp = _stamp(stamp_text)
                        if last is not None and stamp <= last:
                            continue                    # seen before the reconnect
                        last, last_at = stamp, time.time()
                        write(text + "\n")
                stream.release_conn()
            except (HTTPError, OSError):    # the read deadline or a dropped connection
                pass
            except client.ApiException as exc:
                if exc.status != 400:           # 400: the container is not started yet
                    raise
                time.sleep(1.0)
            state = _state(get_job(job_id, namespace, environ))
            if state in ENDED:
                return state
    except client.ApiException as exc:
        raise _fail(f"following the logs of {job_id} failed", exc) from None


def cancel(job_id: str, namespace: str, environ=None) -> None:
    """Delete the job, its Secret and ConfigMap (the operator stops its pods), and a
    TrainJob's TrainingRuntime."""
    from kubernetes import client
    kind, name = parse_job_id(job_id)
    api = api_client(environ)
    custom = client.CustomObjectsApi(api)
    calls = [lambda: _each_version(kind, lambda group, version, plural:
                                   custom.delete_namespaced_custom_object(
                                       group, version, namespace, plural, name,
                                       _request_timeout=TIMEOUT)),
             lambda: client.CoreV1Api(api).delete_namespaced_secret(
                 f"{name}-token", namespace, _request_timeout=TIMEOUT),
             lambda: client.CoreV1Api(api).delete_namespaced_config_map(
                 f"{name}-plan", namespace, _request_timeout=TIMEOUT)]
    if kind == TRAINJOB:
        group, _, version = RUNTIME[0].partition("/")
        calls.append(lambda: custom.delete_namespaced_custom_object(
            group, version, namespace, RUNTIME[2], name, _request_timeout=TIMEOUT))
    for i, call in enumerate(calls):
        try:
            call()
        except client.ApiException as exc:
            if exc.status == 404 and i:         # MPIJob has no ConfigMap
                continue
            raise _fail(f"cancelling {job_id} failed", exc) from None
