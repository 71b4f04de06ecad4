"""Running a rendered Kubernetes job's pods without a cluster: each pod is a network namespace
node (tests/netns.py), in which the pod's container command runs with the pod's environment.

What stands in for Kubernetes, and only that: the pods the operator would make (their names,
DNS names and downward-API fields, as the Kubeflow training operator and JobSet document them),
the Secret's key for a ``secretKeyRef``, the ConfigMap's files at the volume's ``mountPath`` (a
directory here), and the image's ``python3``, which is this checkout's Python. Everything else,
command, arguments, variables and addresses, is the rendered YAML's. This proves the rendering,
not a Kubernetes cluster.
"""
from __future__ import annotations

import copy
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Dict, List, NamedTuple

from fluidctl.backends.k8s.render import COMPLETION_INDEX, REPLICA_INDEX


class Pod(NamedTuple):
    name: str
    names: List[str]            # what resolves to it inside the cluster
    template: dict
    fields: Dict[str, str]      # downward API: fieldPath -> value
    decides: bool = True        # its success ends the job (the rest are then stopped)


def _as_jobset(objects: List[dict]) -> dict:
    """A TrainJob as the JobSet Kubeflow Trainer makes of it: its TrainingRuntime's JobSet
    template, named after the TrainJob, the trainer step's pod count from numNodes."""
    job = objects[-1]
    if job["kind"] != "TrainJob":
        return job
    ref = job["spec"]["runtimeRef"]["name"]
    (runtime,) = [o for o in objects if o["kind"] == "TrainingRuntime"
                  and o["metadata"]["name"] == ref]
    spec = copy.deepcopy(runtime["spec"]["template"]["spec"])
    for rjob in spec["replicatedJobs"]:
        labels = rjob["template"].get("metadata", {}).get("labels", {})
        if labels.get("trainer.kubeflow.org/trainjob-ancestor-step") == "trainer":
            count = job["spec"]["trainer"]["numNodes"]
            rjob["template"]["spec"].update(parallelism=count, completions=count)
    return {"kind": "JobSet", "metadata": job["metadata"], "spec": spec}


def pods(objects: List[dict]) -> List[Pod]:
    """The pods the operator makes for the job (the last object), in its naming."""
    job = _as_jobset(objects)
    name, ns = job["metadata"]["name"], job["metadata"]["namespace"]
    v2 = job["apiVersion"] == "kubeflow.org/v2beta1" if "apiVersion" in job else False
    out = []
    if job["kind"] == "JobSet":
        policy = job["spec"].get("successPolicy", {}).get("targetReplicatedJobs")
        for rjob in job["spec"]["replicatedJobs"]:
            spec = rjob["template"]["spec"]
            decides = not policy or rjob["name"] in policy
            for j in range(rjob["replicas"]):
                for index in range(spec["completions"]):
                    host = f"{name}-{rjob['name']}-{j}-{index}"
                    fqdn = [f"{host}.{name}", f"{host}.{name}.{ns}", f"{host}.{name}.{ns}.svc",
                            f"{host}.{name}.{ns}.svc.cluster.local"]
                    out.append(Pod(host, [host, *fqdn], spec["template"],
                                   {COMPLETION_INDEX: str(index)}, decides))
        return out
    key = next(k for k in job["spec"] if k.endswith("ReplicaSpecs"))
    for rtype, rspec in job["spec"][key].items():
        for index in range(rspec["replicas"]):
            pod = f"{name}-{rtype.lower()}-{index}"      # and its Service, of the same name
            if rtype == "Launcher":                      # MPIJob's one launcher: no index
                pod = f"{name}-launcher"
            names = [pod, f"{pod}.{ns}", f"{pod}.{ns}.svc", f"{pod}.{ns}.svc.cluster.local"]
            if v2:              # mpi-operator v2beta1: hostnames under the job's Service
                names = [pod, f"{pod}.{name}", f"{pod}.{name}.{ns}", f"{pod}.{name}.{ns}.svc",
                         f"{pod}.{name}.{ns}.svc.cluster.local"]
            out.append(Pod(pod, names,
                           rspec["template"], {REPLICA_INDEX: str(index)},
                           # PaddleJob: the Masters' success is the job's when it has
                           # Masters, else the Workers'; MPIJob: the Launcher's
                           _decides(job, rtype)))
    return out


def _decides(job: dict, rtype: str) -> bool:
    """Whether a replica type's success is the job's, as the training operator judges it."""
    if job["kind"] == "PaddleJob":
        return rtype == ("Master" if "Master" in job["spec"]["paddleReplicaSpecs"] else "Worker")
    return not (job["kind"] == "MPIJob" and rtype == "Worker")


def _by_kind(objects, kind) -> Dict[str, dict]:
    return {o["metadata"]["name"]: o for o in objects if o["kind"] == kind}


def container_env(container: dict, objects: List[dict], pod: Pod) -> Dict[str, str]:
    secrets = _by_kind(objects, "Secret")
    env = {}
    for var in container.get("env", []):
        if "value" in var:
            env[var["name"]] = var["value"]
            continue
        source = var["valueFrom"]
        if "secretKeyRef" in source:
            ref = source["secretKeyRef"]
            env[var["name"]] = secrets[ref["name"]]["stringData"][ref["key"]]
        else:
            env[var["name"]] = pod.fields[source["fieldRef"]["fieldPath"]]
    return env


class PodRun:
    """The job's pods started in namespace nodes; ``wait`` returns each pod's (code, output)."""

    SSH_PORT = 2222
    sshd: List[str] = []            # the image's sshd with its settings (mpi_operator_v2)

    def __init__(self, objects: List[dict], nodes, workdir: Path):
        self.objects, self.nodes, self.workdir = objects, nodes, workdir
        self.files: Dict[str, str] = {}     # path in the pod -> a file here (operator's)
        self.extra_env: Dict[str, Dict[str, str]] = {}     # pod -> what the operator adds
        self.pods = pods(objects)
        self.procs: Dict[str, subprocess.Popen] = {}
        self.downward: Dict[str, Path] = {}             # pod -> its annotations file
        self.annotations: Dict[str, Dict[str, str]] = {}
        self.etc: List[Path] = []
        aliases = list(nodes.nodes)
        assert len(aliases) >= len(self.pods), "one namespace node per pod"
        self.where = {pod.name: nodes.node(a) for pod, a in zip(self.pods, aliases)}
        self.nodes_alias = {pod.name: a for pod, a in zip(self.pods, aliases)}

    def write_hosts(self) -> None:
        """Every namespace resolves every pod's names to that pod's address (ip netns exec
        bind-mounts /etc/netns/NS/hosts over /etc/hosts)."""
        lines = ["127.0.0.1 localhost"] + [
            f"{self.where[p.name].address} {' '.join(p.names)}" for p in self.pods]
        for node in self.where.values():
            etc = Path("/etc/netns") / node.netns
            etc.mkdir(parents=True, exist_ok=True)
            (etc / "hosts").write_text("\n".join(lines) + "\n")
            self.etc.append(etc)

    def _volumes(self, pod: Pod) -> Dict[str, str]:
        """mountPath -> a directory holding the volume's files: a ConfigMap's, the pod's own
        annotations for a downward API volume (``annotate`` changes them, as the kubelet
        does), an empty one for an emptyDir."""
        maps = _by_kind(self.objects, "ConfigMap")
        volumes = {v["name"]: v for v in pod.template["spec"].get("volumes", [])}
        out = {}
        for mount in pod.template["spec"]["containers"][0].get("volumeMounts", []):
            volume = volumes[mount["name"]]
            where = self.workdir / "volumes" / pod.name / mount["name"]
            where.mkdir(parents=True, exist_ok=True)
            if "configMap" in volume:
                for key, text in maps[volume["configMap"]["name"]]["data"].items():
                    (where / key).write_text(text)
            elif "downwardAPI" in volume:
                (item,) = volume["downwardAPI"]["items"]
                assert item["fieldRef"]["fieldPath"] == "metadata.annotations", item
                self.downward[pod.name] = where / item["path"]
                self.annotate(pod.name)
            else:
                assert "emptyDir" in volume, volume
            out[mount["mountPath"]] = str(where)
        return out

    def annotate(self, pod: str, **annotations: str) -> None:
        """Set annotations of a running pod: its downward API file is rewritten (renamed into
        place, as the kubelet's atomic writer does), key="value" lines in key order."""
        template = next(p.template for p in self.pods if p.name == pod)
        self.annotations.setdefault(pod, dict(template.get("metadata", {}).get(
            "annotations", {})))
        self.annotations[pod].update(annotations)
        path = self.downward[pod]
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text("".join(f"{k}={json.dumps(v)}\n"
                               for k, v in sorted(self.annotations[pod].items())))
        os.replace(tmp, path)

    def message(self, pod: str) -> str:
        """The pod's termination message (what the kubelet reads from terminationMessagePath
        into the pod's status)."""
        path = self.workdir / f"{pod}.termination-log"
        return path.read_text() if path.exists() else ""

    @staticmethod
    def _in_pod(value: str, mounts: Dict[str, str]) -> str:
        for path, where in mounts.items():
            if value.startswith(path + "/"):
                return where + value[len(path):]
        return value

    def start(self) -> None:
        self.write_hosts()
        for pod in self.pods:
            self.start_pod(pod)

    def start_pod(self, pod: Pod) -> None:
        """Start (or start again, as a restarted pod) the pod's container; its output is
        appended to WORKDIR/POD.out."""
        (container,) = pod.template["spec"]["containers"]
        mounts = self._volumes(pod)
        argv = [self._in_pod(self.files.get(arg, arg), mounts) for arg in container["command"]]
        if argv[0] == "python3":                    # the image's entry: this checkout's
            argv[0] = sys.executable
        if argv == ["/usr/sbin/sshd", "-De"] and self.sshd:     # the image's sshd
            argv = list(self.sshd)
        env = {"PATH": os.environ["PATH"], "HOME": os.environ.get("HOME", "/root"),
               "LANG": "C.UTF-8", "FLUIDCTL_STATE_DIR": str(self.workdir / "state" / pod.name),
               **{k: self._in_pod(v, mounts) for k, v in
                                     container_env(container, self.objects, pod).items()},
               **self.extra_env.get(pod.name, {})}
        if env.get("FLUIDCTL_K8S_MESSAGE") == container.get(
                "terminationMessagePath", "/dev/termination-log"):    # the kubelet's file
            env["FLUIDCTL_K8S_MESSAGE"] = str(self.workdir / f"{pod.name}.termination-log")
        log = open(self.workdir / f"{pod.name}.out", "ab")
        node = self.where[pod.name]
        # the pod's own hostname (UTS namespace), as the kubelet sets it
        self.procs[pod.name] = subprocess.Popen(
            ["ip", "netns", "exec", node.netns, "unshare", "--uts", "--", "sh", "-c",
             'hostname "$0" && exec "$@"', pod.name, "env", "-i",
             *[f"{k}={v}" for k, v in env.items()], *argv],
            cwd=container.get("workingDir") or self.workdir, stdout=log,
            stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        log.close()

    def restart_after(self, victim: str, timeout: float = 60) -> str:
        """What the operator does once pod ``victim`` died, as the rendered policies say:
        JobSet (a TrainJob's too) with failurePolicy.maxRestarts and Jobs that may not
        replace a pod (backoffLimit 0) recreates every pod; an MPIJob's Worker is restarted
        by the kubelet (restartPolicy), and its Launcher, whose mpirun fails with the Worker,
        by the Launcher's Job (runPolicy.backoffLimit). Returns what restarted: "group"."""
        job = _as_jobset(self.objects)
        if job["kind"] == "JobSet":
            spec = job["spec"]
            assert spec["failurePolicy"]["maxRestarts"] >= 1, spec["failurePolicy"]
            assert all(r["template"]["spec"]["backoffLimit"] == 0
                       for r in spec["replicatedJobs"]), "a Job would replace the pod alone"
            for pod in self.pods:
                self.kill_pod(pod.name)
            for pod in self.pods:
                self.start_pod(pod)
            return "group"
        if job["kind"] in ("PyTorchJob", "PaddleJob"):
            return self._kubelet_restarts(job, victim, timeout)
        assert job["kind"] == "MPIJob", job["kind"]
        sets = job["spec"]["mpiReplicaSpecs"]
        assert sets["Worker"]["restartPolicy"] in ("OnFailure", "Always")
        self.start_pod(next(p for p in self.pods if p.name == victim))
        launcher = next(p for p in self.pods if p.decides)
        code = self.procs[launcher.name].wait(timeout)
        assert code != 0 and job["spec"]["runPolicy"]["backoffLimit"] >= 1, code
        self.start_pod(launcher)
        return "group"

    def _kubelet_restarts(self, job: dict, victim: str, timeout: float) -> str:
        """The training operator: each pod's container restarts in place when it fails
        (restartPolicy OnFailure), the victim's at once; "group" when every other pod's
        container failed too (its ranks lost their peer, its pod entry exited), "pod" when
        only the victim restarted."""
        key = next(k for k in job["spec"] if k.endswith("ReplicaSpecs"))
        assert {s["restartPolicy"] for s in job["spec"][key].values()} == {"OnFailure"}
        # the kubelet restarts a failed container after its back-off (10 s the first time:
        # kubernetes.io, "Container restarts"), by which time its peers' entries have exited;
        # restarting the victim at once would race the old world's last ranks
        failed = []
        for pod in self.pods:
            if pod.name == victim:
                continue
            try:
                code = self.procs[pod.name].wait(timeout)
            except subprocess.TimeoutExpired:
                continue
            if code != 0:
                failed.append(pod)
        for pod in [p for p in self.pods if p.name == victim] + failed:
            self.start_pod(pod)
        return "group" if len(failed) == len(self.pods) - 1 else "pod"

    def kill_pod(self, name: str) -> None:
        """The pod dies: SIGKILL to its container and every process it started, also those
        that left its process tree (a daemon mpirun started over SSH): every process of the
        pod's network namespace but the namespace node's own sshd and its sessions."""
        import psutil
        node = self.where[name]
        keep = set()
        try:
            own = psutil.Process(node.proc.pid)
            keep = {own.pid, *(c.pid for c in own.children(recursive=True))}
        except (psutil.NoSuchProcess, AttributeError):
            pass
        pids = set(self.nodes.pids(self.nodes_alias[name])) - keep
        try:
            top = psutil.Process(self.procs[name].pid)
            pids |= {top.pid, *(c.pid for c in top.children(recursive=True))}
        except psutil.NoSuchProcess:
            pass
        for pid in pids:
            try:
                psutil.Process(pid).kill()
            except psutil.NoSuchProcess:
                pass
        self.procs[name].wait(10)

    def wait(self, timeout: float, grace: float = 10) -> Dict[str, tuple]:
        """Wait for the pods whose success decides the job, then stop the others with SIGTERM
        (as the operator does once the job succeeded); each pod's (code, output), code None
        for a pod that had to be killed."""
        deadline = time.monotonic() + timeout
        codes = {}
        order = sorted(self.pods, key=lambda p: not p.decides)
        for pod in order:
            proc = self.procs[pod.name]
            if not pod.decides:
                proc.terminate()
                deadline = min(deadline, time.monotonic() + grace)
            try:
                codes[pod.name] = proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)
                codes[pod.name] = None
        return {pod.name: (codes[pod.name], (self.workdir / f"{pod.name}.out").read_text(
            errors="replace")) for pod in self.pods}

    def mpi_operator(self, sys_prefix: str) -> None:
        """What Kubeflow's MPIJob controller gives the Launcher: /etc/mpi/hostfile (a Worker
        per line with its slots) and a remote-exec agent that runs mpirun's daemon inside a
        Worker pod (kubectl exec there; ``ip netns exec`` into the Worker's namespace here)."""
        job = self.objects[-1]
        slots = job["spec"].get("slotsPerWorker", 1)
        workers = [p for p in self.pods if not p.decides]
        hostfile = self.workdir / "mpi-hostfile"
        hostfile.write_text("".join(f"{p.name} slots={slots}\n" for p in workers))
        self.files["/etc/mpi/hostfile"] = str(hostfile)
        agent = self.workdir / "kubexec.sh"
        cases = "".join(f"  {p.name}) NS={self.where[p.name].netns} ;;\n" for p in workers)
        agent.write_text(
            "#!/bin/sh\n# kubexec: run the command in the named pod\n"
            f"POD=$1; shift\ncase $POD in\n{cases}  *) echo \"no pod $POD\" >&2; exit 1 ;;\nesac\n"
            f"export PATH={sys_prefix}/bin:$PATH OPAL_PREFIX={sys_prefix}\n"
            # the pod's network and its hostname, as kubectl exec enters them
            'exec ip netns exec $NS unshare --uts -- sh -c "hostname $POD && $*"\n')
        agent.chmod(0o755)
        launcher = next(p for p in self.pods if p.decides)
        self.extra_env[launcher.name] = {"OMPI_MCA_plm_rsh_agent": str(agent),
                                         "PRTE_MCA_plm_ssh_agent": str(agent),
                                         "OMPI_MCA_orte_keep_fqdn_hostnames": "true"}

    def mpi_operator_v2(self, sys_prefix: str) -> None:
        """What mpi-operator v0.8 gives an MPIJob v2beta1, and what its image must hold: the
        hostfile (a Worker's FQDN per line), the key pair of the Secret NAME-ssh at
        ``sshAuthMountPath``, and the launcher's OMPI_* variables; the image's sshd (a host key,
        the mounted authorized_keys; port 2222 here, as each namespace node's own sshd has 22)
        and its ssh client settings (the key, no host key check)."""
        from sshd import keygen
        job = self.objects[-1]
        name, ns = job["metadata"]["name"], job["metadata"]["namespace"]
        slots = job["spec"].get("slotsPerWorker", 1)
        workers = [p for p in self.pods if not p.decides]
        ssh = self.workdir / "mpi-ssh"
        ssh.mkdir()
        keygen(ssh / "id_ed25519", "mpi-operator")
        (ssh / "authorized_keys").write_text((ssh / "id_ed25519.pub").read_text())
        keygen(ssh / "host_key", "image-host-key")
        hostfile = self.workdir / "mpi-hostfile"
        hostfile.write_text("".join(f"{p.name}.{name}.{ns}.svc slots={slots}\n"
                                    for p in workers))
        self.files["/etc/mpi/hostfile"] = str(hostfile)
        sshd_config = self.workdir / "image-sshd_config"
        sshd_config.write_text(
            f"Port {self.SSH_PORT}\nHostKey {ssh / 'host_key'}\n"
            f"AuthorizedKeysFile {ssh / 'authorized_keys'}\nPermitRootLogin prohibit-password\n"
            "PasswordAuthentication no\nUsePAM no\nStrictModes no\nPidFile none\n"
            f"SetEnv PATH={sys_prefix}/bin:{os.environ['PATH']} OPAL_PREFIX={sys_prefix}\n")
        self.sshd = ["/usr/sbin/sshd", "-De", "-f", str(sshd_config)]
        ssh_config = self.workdir / "image-ssh_config"
        ssh_config.write_text(f"Host *\n    Port {self.SSH_PORT}\n    User root\n"
                              f"    IdentityFile {ssh / 'id_ed25519'}\n"
                              "    StrictHostKeyChecking no\n    UserKnownHostsFile /dev/null\n"
                              "    LogLevel ERROR\n")
        args = f"-F {ssh_config} -o ConnectionAttempts=10"
        launcher = next(p for p in self.pods if p.decides)
        self.extra_env[launcher.name] = {
            "OMPI_MCA_orte_keep_fqdn_hostnames": "true",
            "OMPI_MCA_orte_default_hostfile": "/etc/mpi/hostfile",
            "OMPI_MCA_plm_rsh_args": args, "PRTE_MCA_plm_ssh_args": args,
            "OPAL_PREFIX": sys_prefix}

    def pytorch_elastic_operator(self) -> None:
        """What the training operator gives each pod of an elastic PyTorchJob (its
        pytorch/elastic.go and envvar.go): torchrun's settings as PET_* variables, the
        rendezvous endpoint being the first Worker's Service at the container's
        pytorchjob-port, the processes per pod ``spec.nprocPerNode``."""
        job = self.objects[-1]
        policy = job["spec"]["elasticPolicy"]
        (container,) = job["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"][
            "containers"]
        port = next(p["containerPort"] for p in container["ports"]
                    if p["name"] == "pytorchjob-port")
        env = {"PET_RDZV_ENDPOINT": f"{job['metadata']['name']}-worker-0:{port}",
               "PET_RDZV_BACKEND": policy.get("rdzvBackend", "c10d"),
               "PET_NNODES": f"{policy['minReplicas']}:{policy['maxReplicas']}",
               "PET_MAX_RESTARTS": str(policy["maxRestarts"]),
               "PET_NPROC_PER_NODE": job["spec"]["nprocPerNode"]}
        for pod in self.pods:
            self.extra_env[pod.name] = dict(env)

    def close(self) -> None:
        for name in self.procs:
            self.kill_pod(name)
        for etc in self.etc:
            shutil.rmtree(etc, ignore_errors=True)
