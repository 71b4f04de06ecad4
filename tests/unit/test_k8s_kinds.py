"""``--backend k8s``'s kinds as the current operators serve them: MPIJob ``v2beta1``
(mpi-operator v0.8, sshd Workers) by default and ``v1`` behind ``--api-version``; Kubeflow
Trainer v2's TrainJob with its TrainingRuntime; whole-group restarts by default and per-pod ones
on request. Every rendering passes the real CRDs (tests/crds/) in strict mode, and each
validator is shown to fail on a broken object. The plan ConfigMap stays O(nodes): under 1 MiB
at 1,000 pods x 8 ranks, and a render that would pass the API server's limit is refused."""
import copy
import json
import time

import kubernetes_validate
import pytest

import crdschema
from k8sutil import K8S_VERSION, pod_templates, render, validate
from launchutil import BEHAVE
from test_cli_inprocess import run_cli
from test_k8s_render import FakeAPIServer, api_server  # noqa: F401 (the fixture)

K8S = ["train", "--backend", "k8s", "--image", "img:1", "--dry-run"]


@pytest.mark.parametrize("version,served", [(None, "kubeflow.org/v2beta1"),
                                            ("v2beta1", "kubeflow.org/v2beta1"),
                                            ("v1", "kubeflow.org/v1"),
                                            ("kubeflow.org/v1", "kubeflow.org/v1")])
def test_mpijob_is_v2beta1_with_sshd_workers_unless_v1_is_asked(version, served):
    from fluidctl.backends.k8s.plan import K8sOptions
    from fluidctl.planning.config import LaunchConfig
    from fluidctl.backends.k8s.launcher import K8sLauncher
    opts = K8sOptions(kind="mpijob", image="img:1", namespace="ml", nodes=3, api_version=version)
    launcher = K8sLauncher()
    plan = launcher.prepare(LaunchConfig(script=BEHAVE, backend="k8s", backend_options=opts,
                                         token="t0ken", gpus="2", max_restarts=1))
    objects = launcher.objects(plan)
    validate(objects)
    job = objects[-1]
    assert job["apiVersion"] == served and [o["kind"] for o in objects] == ["Secret", "MPIJob"]
    sets = job["spec"]["mpiReplicaSpecs"]
    (worker,) = sets["Worker"]["template"]["spec"]["containers"]
    (launch,) = sets["Launcher"]["template"]["spec"]["containers"]
    assert sets["Worker"]["replicas"] == 3 and job["spec"]["slotsPerWorker"] == 2
    assert launch["command"][:4] == ["python3", "-m", "fluidctl.backends.k8s.mpilaunch", "mpirun"]
    assert "/etc/mpi/hostfile" in launch["command"]
    assert worker["resources"] == {"limits": {"nvidia.com/gpu": "2"}}
    if served.endswith("v2beta1"):
        assert worker["command"] == ["/usr/sbin/sshd", "-De"]
        assert job["spec"]["sshAuthMountPath"] == "/root/.ssh"
        assert job["spec"]["launcherCreationPolicy"] == "WaitForWorkersReady"
    else:
        assert worker["command"] == ["sleep", "infinity"]


def test_trainjob_references_the_training_runtime_it_renders():
    plan, objects = render(BEHAVE, "trainjob", nodes=3, gpus="2", max_restarts=2)
    validate(objects)
    assert [o["kind"] for o in objects] == ["Secret", "ConfigMap", "TrainingRuntime", "TrainJob"]
    runtime, job = objects[2], objects[3]
    assert job["apiVersion"] == runtime["apiVersion"] == "trainer.kubeflow.org/v1alpha1"
    assert job["spec"]["runtimeRef"] == {"apiGroup": "trainer.kubeflow.org",
                                         "kind": "TrainingRuntime",
                                         "name": runtime["metadata"]["name"]}
    assert job["spec"]["trainer"] == {"numNodes": 3} == runtime["spec"]["mlPolicy"]
    (node,) = runtime["spec"]["template"]["spec"]["replicatedJobs"]
    assert node["name"] == "node" and node["template"]["spec"]["completions"] == 3
    assert node["template"]["metadata"]["labels"] == {
        "trainer.kubeflow.org/trainjob-ancestor-step": "trainer"}
    assert runtime["spec"]["template"]["spec"]["failurePolicy"] == {"maxRestarts": 2}
    # the pods are a JobSet's, named after the TrainJob
    assert plan.master.startswith("behave-node-0-0.behave.ml:")
    (container,) = pod_templates(runtime)[0]["spec"]["containers"]
    assert container["name"] == "node"


def _restarts(objects):
    """(how a failure restarts the job: whole group / per pod, and how many times)."""
    job = objects[-1]
    if job["kind"] == "TrainJob":
        job = objects[-2]["spec"]["template"]
    if "replicatedJobs" in job["spec"]:
        rjob = job["spec"]["replicatedJobs"][0]["template"]["spec"]
        return job["spec"]["failurePolicy"]["maxRestarts"], rjob["backoffLimit"]
    key = next(k for k in job["spec"] if k.endswith("ReplicaSpecs"))
    policies = {s["restartPolicy"] for s in job["spec"][key].values()}
    return policies, job["spec"]["runPolicy"]["backoffLimit"]


@pytest.mark.parametrize("kind,group,pod", [
    ("jobset", (3, 0), (0, 3 * 2)),                     # JobSet recreates every Job / the pod
    ("trainjob", (3, 0), (0, 3 * 2)),
    ("pytorchjob", ({"OnFailure"}, 3 * 2), ({"OnFailure"}, 3)),
    ("paddlejob", ({"OnFailure"}, 3 * 2), ({"OnFailure"}, 3))])
def test_the_whole_group_restarts_by_default_and_each_pod_on_request(kind, group, pod):
    _, objects = render(BEHAVE, kind, nodes=2, max_restarts=3)
    assert _restarts(objects) == group
    validate(objects)
    _, objects = render(BEHAVE, kind, nodes=2, max_restarts=3, restart="pod")
    assert _restarts(objects) == pod
    validate(objects)


@pytest.mark.parametrize("extra,says", [
    (["--kind", "jobset", "--api-version", "v1"], "error: --api-version is for --kind mpijob"),
    (["--kind", "mpijob", "--api-version", "v3"], "error: --api-version v3 is not an MPIJob"),
    (["--kind", "mpijob", "--restart-policy", "pod"], "error: --restart-policy pod: an MPIJob"),
    (["--kind", "jobset", "--env", "BIG=" + "x" * (1 << 20)],
     "error: the ConfigMap behave-plan would be")])
def test_wrong_combinations_and_oversized_renders_are_one_line(capsys, tmp_path, monkeypatch,
                                                               extra, says):
    monkeypatch.chdir(tmp_path)
    code, out, err = run_cli(capsys, *K8S, *extra, BEHAVE)
    assert (code, out) == (2, "") and err.startswith(says), err
    assert len(err.strip().splitlines()) == 1


def _plan_map(nodes: int) -> int:
    _, objects = render(BEHAVE, "jobset", nodes=nodes, gpus="8")
    (config_map,) = [o for o in objects if o["kind"] == "ConfigMap"]
    return len(json.dumps(config_map, separators=(",", ":")))


def test_the_plan_config_map_grows_linearly_and_fits_at_1000_pods_of_8():
    """Issue 37 item 4: the ConfigMap is O(nodes), not O(nodes x ranks x world)."""
    sizes = {n: _plan_map(n) for n in (16, 32, 64, 128)}
    per_node = [(sizes[b] - sizes[a]) / (b - a) for a, b in ((16, 32), (32, 64), (64, 128))]
    assert max(per_node) < 1.2 * min(per_node), sizes        # linear: a constant per pod
    assert max(per_node) < 400, sizes                         # bytes per pod
    start = time.monotonic()
    size = _plan_map(1000)
    took = time.monotonic() - start
    print(f"1000 x 8 render: {took:.2f} s, plan ConfigMap {size} bytes")
    assert size < 1 << 20 and took < 30


def test_a_pod_of_1000_derives_its_share_from_the_layout(tmp_path):
    from fluidctl import envs
    from fluidctl.backends.k8s.pod import my_share
    plan, objects = render(BEHAVE, "jobset", nodes=1000, gpus="8")
    (tmp_path / "plan.json").write_text(objects[1]["data"]["plan.json"])
    start = time.monotonic()
    share, procs = my_share(str(tmp_path / "plan.json"), {
        envs.K8S_NODE_BASE: "0", envs.K8S_NODE_INDEX: "999", envs.JOB_TOKEN: "t0ken"})
    print(f"pod 999 of 1000 x 8 derives its share in {time.monotonic() - start:.2f} s")
    assert [p.to_json() for p in procs] == [p.to_json() for p in plan.on_node(999)]
    assert share.host == "behave-trainer-0-999" and [p.rank for p in procs] == list(
        range(7992, 8000))


# --- each validator can fail ---------------------------------------------------------------

def _one(kind: str) -> dict:
    _, objects = render(BEHAVE, kind, nodes=2)
    return objects


@pytest.mark.parametrize("kind", ["pytorchjob", "paddlejob", "mpijob", "jobset", "trainjob"])
def test_each_crd_validator_refuses_an_unknown_field_and_a_wrong_type(kind):
    for obj in _one(kind)[2 if kind != "mpijob" else 1:]:
        crdschema.validate(obj, K8S_VERSION)                       # as rendered: valid
        unknown = copy.deepcopy(obj)
        unknown["spec"]["replicaz"] = 1                            # pruned by the API server
        assert any("replicaz" in e for e in crdschema.errors(unknown))
        template = copy.deepcopy(obj)
        for pod in pod_templates(template):         # (a TrainJob holds none: its runtime does)
            pod["spec"]["containers"][0]["imagePullPolicy"] = 3
            assert any("imagePullPolicy" in e for e in crdschema.errors(template))
        meta = copy.deepcopy(obj)
        meta["metadata"]["labels"] = {"a": 1}
        with pytest.raises(Exception):
            crdschema.validate(meta, K8S_VERSION)


def test_the_mpijob_versions_are_told_apart_by_their_crds():
    """A v2beta1 MPIJob is not a v1 one: the v1 CRD refuses v2beta1's fields."""
    v2 = _one("mpijob")[-1]
    as_v1 = {**v2, "apiVersion": "kubeflow.org/v1"}
    assert any("sshAuthMountPath" in e for e in crdschema.errors(as_v1))


@pytest.mark.parametrize("kind", ["Secret", "ConfigMap"])
def test_kubernetes_validate_refuses_a_broken_core_object(kind):
    (obj,) = [o for o in _one("jobset") if o["kind"] == kind]
    kubernetes_validate.validate(obj, K8S_VERSION, strict=True)
    broken = {**obj, "dataz": {}}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, K8S_VERSION, strict=True)


def test_apply_status_and_cancel_of_a_trainjob_and_a_v1_mpijob(capsys, tmp_path, monkeypatch,
                                                              api_server):
    """--apply creates the TrainingRuntime before the TrainJob and cancel deletes it too; a
    job read as ``mpijob/NAME`` is found where the cluster serves v1 only (v2beta1: 404)."""
    monkeypatch.chdir(tmp_path)
    base = ["train", "--backend", "k8s", "--image", "img:1", "--namespace", "ml", "--apply"]
    code, _, err = run_cli(capsys, *base, "--kind", "trainjob", BEHAVE)
    assert code == 0, err
    assert [s[1] for s in api_server.seen] == [
        "/api/v1/namespaces/ml/secrets", "/api/v1/namespaces/ml/configmaps",
        "/apis/trainer.kubeflow.org/v1alpha1/namespaces/ml/trainingruntimes",
        "/apis/trainer.kubeflow.org/v1alpha1/namespaces/ml/trainjobs"]
    code, out, err = run_cli(capsys, "job", "status", "trainjob/behave", "--namespace", "ml")
    assert (code, out) == (0, "job trainjob/behave in ml: Running\n"), err
    code, out, err = run_cli(capsys, "job", "cancel", "trainjob/behave", "--namespace", "ml")
    assert code == 0, err
    assert [s[1] for s in api_server.seen if s[0] == "DELETE"] == [
        "/apis/trainer.kubeflow.org/v1alpha1/namespaces/ml/trainjobs/behave",
        "/api/v1/namespaces/ml/secrets/behave-token",
        "/api/v1/namespaces/ml/configmaps/behave-plan",
        "/apis/trainer.kubeflow.org/v1alpha1/namespaces/ml/trainingruntimes/behave"]
    api_server.seen.clear()
    code, _, err = run_cli(capsys, *base, "--kind", "mpijob", "--api-version", "v1",
                           "--job-name", "pi", BEHAVE)
    assert code == 0, err
    assert api_server.seen[-1][1] == "/apis/kubeflow.org/v1/namespaces/ml/mpijobs"
    code, out, err = run_cli(capsys, "job", "status", "mpijob/pi", "--namespace", "ml")
    assert (code, out) == (0, "job mpijob/pi in ml: Running\n"), err
    gets = [s[1] for s in api_server.seen if s[0] == "GET"]
    assert gets == ["/apis/kubeflow.org/v2beta1/namespaces/ml/mpijobs/pi",
                    "/apis/kubeflow.org/v1/namespaces/ml/mpijobs/pi"]


@pytest.mark.parametrize("says,code,expected", [
    ("PRTE has lost communication with a remote daemon.", 0, 1),   # prterun's false success
    ("all ranks done", 0, 0), ("rank 1 failed", 3, 3)])
def test_the_launcher_entry_fails_when_mpirun_lost_a_worker_yet_exited_0(says, code, expected):
    import io
    from fluidctl.backends.k8s.mpilaunch import run
    out = io.BytesIO()
    assert run(["sh", "-c", f"echo '{says}'; exit {code}"], out) == expected
    assert out.getvalue().decode().startswith(says + "\n")


def test_a_trainjob_in_pserver_mode_has_its_pservers_beside_the_trainer_step():
    plan, objects = render(BEHAVE, "trainjob", nodes=2, mode="pserver", pservers=2)
    validate(objects)
    runtime = objects[2]
    rjobs = runtime["spec"]["template"]["spec"]["replicatedJobs"]
    assert [(r["name"], r["template"]["spec"]["completions"]) for r in rjobs] == [
        ("node", 2), ("pserver", 2)]
    assert "metadata" not in rjobs[1]["template"]      # not the Trainer's trainer step
    assert plan.pserver_endpoints == ["behave-pserver-0-0.behave.ml:6170",
                                      "behave-pserver-0-1.behave.ml:6170"]
