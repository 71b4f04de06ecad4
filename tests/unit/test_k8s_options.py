"""``--backend k8s``'s pod and job options (issue 42 item 6, and items 3 and 4's fields): each
renders where Kubernetes and the operators read it, for every kind, and every rendered object
still passes the published schemas strictly (tests/k8sutil.py); a mistake or a combination
that cannot be rendered is one line, exit 2, nothing printed."""
import pytest
import yaml

from k8sutil import pod_templates, validate
from launchutil import BEHAVE
from test_cli_inprocess import run_cli

KINDS = ["pytorchjob", "paddlejob", "jobset", "mpijob", "trainjob"]
EVERY = ["--mount", "type=pvc,src=datasets,dst=/data,readonly",
         "--mount", "type=hostPath,src=/mnt/cache,dst=/cache",
         "--mount", "type=configMap,src=vocab,dst=/vocab",
         "--mount", "type=secret,src=creds,dst=/creds,ro",
         "--mount", "type=emptyDir,dst=/scratch",
         "--shm-size", "16Gi", "--cpu", "8", "--memory", "64Gi", "--gpus", "2",
         "--node-selector", "gpu-type=h100", "--toleration", "nvidia.com/gpu=present:NoSchedule",
         "--toleration", "spot", "--image-pull-secret", "regcred",
         "--service-account", "trainer", "--priority-class", "high", "--queue", "team-a",
         "--ttl", "86400", "--active-deadline", "172800", "--label", "team=nlp",
         "--annotation", "owner=ana b", "--grace-period", "45"]


def dry_run(capsys, tmp_path, kind, *argv):
    code, out, err = run_cli(capsys, "train", "--backend", "k8s", "--kind", kind, "--image",
                             "img:1", "--nodes", 2, *argv, "--dry-run", BEHAVE)
    assert code == 0, err
    return list(yaml.safe_load_all(out))


@pytest.mark.parametrize("kind", KINDS)
def test_every_pod_and_job_option_renders_and_passes_the_schemas(capsys, tmp_path, kind):
    objects = dry_run(capsys, tmp_path, kind, *EVERY)
    validate(objects)
    job = objects[-1]
    # a TrainJob's pods and Job fields are its TrainingRuntime's (a JobSet template)
    holder = objects[-2] if kind == "trainjob" else job
    templates = pod_templates(holder)
    assert templates
    for template in templates:
        spec, (container,) = template["spec"], template["spec"]["containers"]
        assert spec["terminationGracePeriodSeconds"] == 45 + 10
        volumes = {v["name"]: v for v in spec["volumes"]}
        mounts = {m["mountPath"]: m for m in container["volumeMounts"]}
        assert volumes[mounts["/data"]["name"]]["persistentVolumeClaim"] == {
            "claimName": "datasets", "readOnly": True} and mounts["/data"]["readOnly"]
        assert volumes[mounts["/cache"]["name"]]["hostPath"] == {"path": "/mnt/cache"}
        assert volumes[mounts["/vocab"]["name"]]["configMap"] == {"name": "vocab"}
        assert volumes[mounts["/creds"]["name"]]["secret"] == {"secretName": "creds"}
        assert volumes[mounts["/scratch"]["name"]]["emptyDir"] == {}
        assert volumes[mounts["/dev/shm"]["name"]]["emptyDir"] == {"medium": "Memory",
                                                                   "sizeLimit": "16Gi"}
        resources = container["resources"]
        assert resources["requests"] == {"cpu": "8", "memory": "64Gi"}
        assert {k: v for k, v in resources["limits"].items() if k != "nvidia.com/gpu"} == \
            {"cpu": "8", "memory": "64Gi"}
        assert spec["nodeSelector"] == {"gpu-type": "h100"}
        assert spec["tolerations"] == [
            {"key": "nvidia.com/gpu", "operator": "Equal", "value": "present",
             "effect": "NoSchedule"}, {"key": "spot", "operator": "Exists"}]
        assert spec["imagePullSecrets"] == [{"name": "regcred"}]
        assert (spec["serviceAccountName"], spec["priorityClassName"]) == ("trainer", "high")
        assert template["metadata"]["labels"]["team"] == "nlp"
        assert template["metadata"]["annotations"] == {"owner": "ana b"}
    gpus = [t["spec"]["containers"][0]["resources"]["limits"].get("nvidia.com/gpu")
            for t in templates]
    assert "2" in gpus
    assert job["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "team-a"
    assert job["metadata"]["labels"]["team"] == "nlp"
    assert job["metadata"]["annotations"] == {"owner": "ana b"}
    if kind in ("jobset", "trainjob"):
        spec = job["spec"] if kind == "jobset" else holder["spec"]["template"]["spec"]
        assert spec["ttlSecondsAfterFinished"] == 86400
        assert {r["template"]["spec"]["activeDeadlineSeconds"]
                for r in spec["replicatedJobs"]} == {172800}
    else:
        policy = job["spec"]["runPolicy"]
        assert (policy["ttlSecondsAfterFinished"], policy["activeDeadlineSeconds"]) == \
            (86400, 172800)


@pytest.mark.parametrize("kind,pods", [("pytorchjob", 3), ("paddlejob", 3), ("mpijob", 4)])
def test_volcano_gang_schedules_every_pod(capsys, tmp_path, kind, pods):
    objects = dry_run(capsys, tmp_path, kind, "--nodes", 3, "--scheduler", "volcano", "--queue",
                      "research", "--priority-class", "high")
    validate(objects)
    job = objects[-1]
    assert job["spec"]["runPolicy"]["schedulingPolicy"] == {
        "minAvailable": pods, "queue": "research", "priorityClass": "high"}
    assert "kueue.x-k8s.io/queue-name" not in job["metadata"]["labels"]
    assert {t["spec"]["schedulerName"] for t in pod_templates(job)} == {"volcano"}


def test_hang_timeout_grace_and_checkpoint_signal_reach_the_pod_entry(capsys, tmp_path):
    """Items 3 and 4: what the pod entry reads (its container's environment) and the kubelet's
    grace (terminationGracePeriodSeconds, the pod entry's margin beyond --grace-period)."""
    objects = dry_run(capsys, tmp_path, "pytorchjob", "--hang-timeout", "90",
                      "--grace-period", "12.5", "--checkpoint-signal", "USR1")
    validate(objects)
    for template in pod_templates(objects[-1]):
        (container,) = template["spec"]["containers"]
        env = {e["name"]: e.get("value") for e in container["env"]}
        assert env["FLUIDCTL_HANG_TIMEOUT"] == "90"
        assert env["FLUIDCTL_CHECKPOINT_SIGNAL"] == "USR1"
        assert env["FLUIDCTL_K8S_REQUESTS"] == "/etc/fluidctl-pod/annotations"
        assert template["spec"]["terminationGracePeriodSeconds"] == 13 + 10
        assert container["terminationMessagePolicy"] == "FallbackToLogsOnError"
        downward = [v for v in template["spec"]["volumes"] if "downwardAPI" in v]
        assert downward[0]["downwardAPI"]["items"] == [
            {"path": "annotations", "fieldRef": {"fieldPath": "metadata.annotations"}}]


def test_the_pod_template_is_merged_last(capsys, tmp_path):
    patch = tmp_path / "pod.yaml"
    patch.write_text(yaml.safe_dump({"metadata": {"labels": {"extra": "yes"}}, "spec": {
        "containers": [{"securityContext": {"capabilities": {"add": ["IPC_LOCK"]}},
                        "env": [{"name": "NCCL_DEBUG", "value": "INFO"}]}],
        "hostIPC": True, "nodeSelector": {"zone": "b"}}}))
    objects = dry_run(capsys, tmp_path, "jobset", "--node-selector", "gpu=h100",
                      "--pod-template", patch)
    validate(objects)
    for template in pod_templates(objects[-1]):
        (container,) = template["spec"]["containers"]
        assert container["securityContext"] == {"capabilities": {"add": ["IPC_LOCK"]}}
        names = [e["name"] for e in container["env"]]
        assert names[0] == "FLUIDCTL_JOB_TOKEN" and names[-1] == "NCCL_DEBUG"  # merged by name
        assert container["command"][2] == "fluidctl.backends.k8s.pod"
        assert template["spec"]["hostIPC"] is True
        assert template["spec"]["nodeSelector"] == {"gpu": "h100", "zone": "b"}
        assert template["metadata"]["labels"]["extra"] == "yes"


@pytest.mark.parametrize("argv, words", [
    (["--mount", "type=nfs,dst=/x"], "--mount 'type=nfs,dst=/x' needs type= one of pvc"),
    (["--mount", "type=pvc,src=data"], "needs dst= an absolute path in the pod"),
    (["--mount", "type=pvc,src=Data,dst=/d"], "is not a Kubernetes object name"),
    (["--mount", "type=hostPath,src=rel,dst=/d"], "needs src= an absolute path on the node"),
    (["--mount", "type=emptyDir,dst=/d", "--mount", "type=pvc,src=a,dst=/d"], "two volumes at"),
    (["--shm-size", "1Gi", "--mount", "type=emptyDir,dst=/dev/shm"], "two volumes at /dev/shm"),
    (["--mount", "type=pvc,src=a,dst=/etc/fluidctl"], "is where fluidctl puts the job's plan"),
    (["--cpu", "lots"], "--cpu 'lots' is not a Kubernetes quantity"),
    (["--memory", "0"], "--memory '0' is not a Kubernetes quantity"),
    (["--shm-size", "16GB"], "--shm-size '16GB' is not a Kubernetes quantity"),
    (["--node-selector", "gpu"], "--node-selector 'gpu' is not KEY=VALUE"),
    (["--toleration", "a:Never"], "is not KEY[=VALUE][:EFFECT]"),
    (["--scheduler", "yunikorn"], "--scheduler 'yunikorn' is not one fluidctl renders for"),
    (["--kind", "jobset", "--scheduler", "volcano"], "has no gang form in a JobSet"),
    (["--label", "fluidctl.io/job=x"], "--label fluidctl.io/job is fluidctl's own"),
    (["--label", "team=a b"], "is not a label value"),
    (["--ttl", "-3"], "--ttl '-3' is not a number of seconds"),
    (["--active-deadline", "0"], "--active-deadline '0' is not a number of seconds"),
    (["--pod-template", "nope.yaml"], "cannot read --pod-template nope.yaml"),
    (["--kind", "mpijob", "--hang-timeout", "5"], "--hang-timeout needs fluidctl supervising"),
    (["--kind", "mpijob", "--checkpoint-signal", "USR1"], "--checkpoint-signal is what"),
    (["--service-account", "Bad_Name"], "--service-account 'Bad_Name' is not a Kubernetes"),
])
def test_a_wrong_or_conflicting_option_is_one_line(capsys, tmp_path, monkeypatch, argv, words):
    monkeypatch.chdir(tmp_path)
    code, out, err = run_cli(capsys, "train", "--backend", "k8s", "--kind", "pytorchjob",
                             "--image", "img:1", *argv, "--dry-run", BEHAVE)
    assert (code, out) == (2, ""), err
    assert err.startswith("error: ") and words in err and len(err.strip().splitlines()) == 1, err


def test_a_pod_template_that_is_not_one_is_one_line(capsys, tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("- just\n- a list\n")
    code, out, err = run_cli(capsys, "train", "--backend", "k8s", "--kind", "pytorchjob",
                             "--image", "img:1", "--pod-template", bad, "--dry-run", BEHAVE)
    assert (code, out) == (2, "") and "is not a pod template" in err, err


def test_nodes_min_max_is_an_elastic_pytorchjob(capsys, tmp_path):
    """Issue 42 item 5: the operator scales the Workers between MIN and MAX and gives each
    pod torchrun's rendezvous (PET_*); the pods run torchrun, the token and --env stay."""
    objects = dry_run(capsys, tmp_path, "pytorchjob", "--nodes", "2:4", "--nproc", 3,
                      "--max-restarts", 5, "--env", "NCCL_DEBUG=INFO", "--cpu", "4")
    validate(objects)
    assert [o["kind"] for o in objects] == ["Secret", "PyTorchJob"]     # no plan to read
    spec = objects[-1]["spec"]
    assert spec["elasticPolicy"] == {"minReplicas": 2, "maxReplicas": 4, "rdzvBackend": "c10d",
                                     "maxRestarts": 5}
    assert spec["nprocPerNode"] == "3"              # the operator's PET_NPROC_PER_NODE
    assert list(spec["pytorchReplicaSpecs"]) == ["Worker"]
    worker = spec["pytorchReplicaSpecs"]["Worker"]
    assert (worker["replicas"], worker["restartPolicy"]) == (4, "OnFailure")
    (container,) = worker["template"]["spec"]["containers"]
    assert container["command"][:3] == ["python3", "-m", "torch.distributed.run"]
    assert container["command"][3].endswith("behave.py")
    assert [e["name"] for e in container["env"]] == ["FLUIDCTL_JOB_TOKEN", "NCCL_DEBUG"]
    assert container["ports"] == [{"name": "pytorchjob-port", "containerPort": 23456}]
    assert container["resources"]["limits"]["cpu"] == "4"


@pytest.mark.parametrize("argv, words", [
    (["--kind", "jobset", "--nodes", "1:2"], "--nodes 1:2 (an elastic job) needs --kind "
                                            "pytorchjob"),
    (["--nodes", "1:2", "--hang-timeout", "9"], "and torchrun (an elastic PyTorchJob) starts"),
    (["--nodes", "1:2", "--checkpoint-signal", "USR1"], "and torchrun (an elastic PyTorchJob)"),
])
def test_what_an_elastic_job_cannot_do_is_one_line(capsys, tmp_path, argv, words):
    code, out, err = run_cli(capsys, "train", "--backend", "k8s", "--kind", "pytorchjob",
                             "--image", "img:1", *argv, "--dry-run", BEHAVE)
    assert (code, out) == (2, "") and words in err and len(err.strip().splitlines()) == 1, err
