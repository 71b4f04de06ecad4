"""``--backend k8s``: every kind renders from the one plan, and every rendered object passes the
published schemas (tests/k8sutil.py: kubernetes-validate for core objects and pod templates,
the operators' generated models for the custom resources); the pods carry the plan's contract
(the ConfigMap is the --dry-run --json plan, token removed), the token only in a Secret; without
a kubeconfig --apply is one line; --apply and ``fluidctl job list|status|logs|cancel`` speak the
real client's HTTP to a small API server here."""
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import yaml

from fluidctl import envs
from fluidctl.backends.k8s.pod import my_share
from k8sutil import pod_templates, render, validate
from launchutil import BEHAVE
from test_cli_inprocess import run_cli

CASES = [("pytorchjob", "collective"), ("mpijob", "collective"), ("paddlejob", "collective"),
         ("jobset", "collective"), ("paddlejob", "pserver"), ("jobset", "pserver")]


@pytest.mark.parametrize("kind,mode", CASES, ids=[f"{k}-{m}" for k, m in CASES])
def test_every_kind_renders_and_passes_its_schemas(kind, mode):
    extra = {"mode": mode, "pservers": 2} if mode == "pserver" else {"gpus": "2"}
    plan, objects = render(BEHAVE, kind, nodes=3, max_restarts=2, **extra)
    validate(objects)
    secret, job = objects[0], objects[-1]
    assert secret["kind"] == "Secret" and secret["stringData"] == {"token": "t0ken"}
    templates = pod_templates(job)
    assert "t0ken" not in json.dumps(objects[1:])           # only in the Secret
    for template in templates:
        (container,) = template["spec"]["containers"]
        token = [e for e in container["env"] if e["name"] == envs.JOB_TOKEN]
        assert token == [{"name": envs.JOB_TOKEN, "valueFrom": {"secretKeyRef": {
            "name": secret["metadata"]["name"], "key": "token"}}}]
    if mode == "collective" and kind != "mpijob":
        limits = [t["spec"]["containers"][0]["resources"]["limits"] for t in templates]
        assert limits and all(lim == {"nvidia.com/gpu": "2"} for lim in limits)
        assert {p.env["FLAGS_selected_gpus"] for p in plan.trainers} == {"0", "1"}
    assert len(plan.trainers) == (6 if mode == "collective" else 3)


def test_replica_sets_and_restart_policy_follow_the_plan():
    _, objects = render(BEHAVE, "pytorchjob", nodes=3, max_restarts=2)
    sets = objects[-1]["spec"]["pytorchReplicaSpecs"]
    assert {k: v["replicas"] for k, v in sets.items()} == {"Master": 1, "Worker": 2}
    assert {v["restartPolicy"] for v in sets.values()} == {"OnFailure"}
    assert objects[-1]["spec"]["runPolicy"]["backoffLimit"] == 2 * 3    # a restart per pod
    _, objects = render(BEHAVE, "paddlejob", nodes=2, mode="pserver", pservers=3)
    sets = objects[-1]["spec"]["paddleReplicaSpecs"]
    assert {k: v["replicas"] for k, v in sets.items()} == {"Worker": 2, "Master": 3}
    assert {v["restartPolicy"] for v in sets.values()} == {"Never"}
    _, objects = render(BEHAVE, "jobset", nodes=2, mode="pserver", max_restarts=1)
    spec = objects[-1]["spec"]
    assert [(r["name"], r["template"]["spec"]["completions"]) for r in spec["replicatedJobs"]] \
        == [("trainer", 2), ("pserver", 1)]
    assert spec["failurePolicy"] == {"maxRestarts": 1}


def test_the_config_map_is_the_plan_every_backend_prints(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    args = ["train", "--backend", "k8s", "--kind", "jobset", "--image", "img:1", "--nodes", 2,
            "--nproc", 2, "--token-file", tmp_path / "tok", "--dry-run"]
    (tmp_path / "tok").write_text("s3cret\n")
    code, out, err = run_cli(capsys, *args, "--json", "--show-secrets", BEHAVE)
    assert code == 0, err
    plan = json.loads(out)
    assert plan["backend"] == "k8s" and len(plan["procs"]) == 4
    assert plan["master"] == "behave-trainer-0-0.behave.default:6172"
    code, out, err = run_cli(capsys, *args, BEHAVE)
    assert code == 0, err
    docs = list(yaml.safe_load_all(out))
    assert [d["kind"] for d in docs] == ["Secret", "ConfigMap", "JobSet"]
    assert docs[0]["stringData"] == {"token": envs.MASKED_TOKEN}    # masked by default
    (tmp_path / "plan.json").write_text(docs[1]["data"]["plan.json"])
    in_pods = []                        # what each pod derives from the ConfigMap's layout
    for index in range(2):
        _, procs = my_share(str(tmp_path / "plan.json"), {
            envs.K8S_NODE_BASE: "0", envs.K8S_NODE_INDEX: str(index), envs.JOB_TOKEN: "s3cret"})
        in_pods += [p.to_json() for p in procs]
    assert len(in_pods) == len(plan["procs"]) == 4
    for proc, printed in zip(in_pods, plan["procs"]):
        assert proc == printed                                     # the same contract
    code, out, _ = run_cli(capsys, *args, "--show-secrets", BEHAVE)
    assert next(yaml.safe_load_all(out))["stringData"] == {"token": "s3cret"}


@pytest.mark.parametrize("argv", [
    ["train", "--backend", "k8s", "--kind", "pytorchjob", "--image", "i", "--apply", BEHAVE],
    ["job", "status", "pytorchjob/x"], ["job", "list", "--k8s"]])
def test_without_a_kubeconfig_it_is_one_line(capsys, tmp_path, monkeypatch, argv):
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "none"))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    code, out, err = run_cli(capsys, *argv)
    assert code == 2 and out == ""
    assert err.startswith("error: no kubeconfig:") and len(err.strip().splitlines()) == 1


class FakeAPIServer(BaseHTTPRequestHandler):
    """The few Kubernetes API calls --apply and ``fluidctl job`` make, answered as the API
    server does (201 with the object on create, the object on get, a Status on delete)."""
    seen: list = []
    stored: dict = {}
    state = "Running"                   # the jobs' last true condition
    pod_status: dict = {}               # pod name -> its status (what the kubelet reports)
    followed: list = []                 # what each ``logs -f`` connection sends: lines, and
                                        # "idle" (the pod says nothing for a second) or "end"

    def _reply(self, code: int, body) -> None:
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.seen.append(("POST", self.path, self.headers.get("Authorization")))
        self.stored[f"{self.path}/{body['metadata']['name']}"] = body
        self._reply(201, body)

    def do_GET(self):
        self.seen.append(("GET", self.path, self.headers.get("Authorization")))
        path, _, query = self.path.partition("?")
        if path == "/apis/kubeflow.org/v1/pytorchjobs":        # list, every namespace
            assert "labelSelector=app.kubernetes.io%2Fmanaged-by%3Dfluidctl" in query, query
            return self._reply(200, {"items": [o for k, o in self.stored.items()
                                               if "/pytorchjobs/" in k]})
        if path.startswith("/apis/"):
            if path.count("/") <= 4:                             # another kind's list
                return self._reply(404, {"kind": "Status", "code": 404, "reason": "NotFound"})
        if path == "/api/v1/namespaces/ml/pods":
            assert "labelSelector=fluidctl.io%2Fjob%3D" in query, query
            names = (("behave-worker-0", "behave-master-0")
                     if "fluidctl.io%2Fjob%3Dbehave" in query else ())    # other jobs: none
            return self._reply(200, {"kind": "PodList", "items": [
                {"metadata": {"name": name},
                 "spec": {"nodeName": {"behave-worker-0": "n2"}.get(name, "n1"),
                          "containers": [{"name": "pytorch"}]},
                 "status": self.pod_status.get(name, {"phase": "Running"})}
                for name in names]})
        if path.endswith("/log") and "follow=true" in query.lower():
            lines, then = self.followed.pop(0)
            self.send_response(200)
            self.send_header("Content-Type", "text/plain")
            self.end_headers()                       # HTTP/1.0: the body ends at close
            self.wfile.write("".join(f"{t} {line}\n" for t, line in lines).encode())
            self.wfile.flush()
            if then == "idle":
                time.sleep(1.0)
            else:
                FakeAPIServer.state = "Succeeded"   # the container ended, the job with it
            return
        if path.endswith("/log"):
            data = f"[trainer 0] log of {path.split('/')[-2]}\n".encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/plain")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
            return
        obj = self.stored.get(path)
        if obj is None:
            return self._reply(404, {"kind": "Status", "status": "Failure", "code": 404,
                                     "reason": "NotFound", "message": "not found"})
        self._reply(200, {**obj, "status": {"conditions": [
            {"type": "Created", "status": "True"}, {"type": self.state, "status": "True"}]}})

    def do_PATCH(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.seen.append(("PATCH", self.path, self.headers.get("Content-Type"), body))
        self._reply(200, {"metadata": {"name": self.path.rsplit("/", 1)[-1]}})

    def do_DELETE(self):
        self.seen.append(("DELETE", self.path, self.headers.get("Authorization")))
        self._reply(200, {"kind": "Status", "status": "Success"})

    def log_message(self, *args):
        pass


@pytest.fixture
def api_server(tmp_path, monkeypatch):
    server = ThreadingHTTPServer(("127.0.0.1", 0), FakeAPIServer)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    config = tmp_path / "kubeconfig"
    config.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "here",
        "clusters": [{"name": "c", "cluster": {"server": f"http://127.0.0.1:{server.server_port}"}}],
        "users": [{"name": "u", "user": {"token": "bearer-1"}}],
        "contexts": [{"name": "here", "context": {"cluster": "c", "user": "u"}}]}))
    monkeypatch.setenv("KUBECONFIG", str(config))
    FakeAPIServer.seen, FakeAPIServer.stored = [], {}
    FakeAPIServer.state, FakeAPIServer.followed = "Running", []
    FakeAPIServer.pod_status = {}
    yield FakeAPIServer
    server.shutdown()
    server.server_close()


def test_apply_and_job_commands_through_the_client(capsys, tmp_path, monkeypatch, api_server):
    monkeypatch.chdir(tmp_path)
    code, out, err = run_cli(capsys, "train", "--backend", "k8s", "--kind", "pytorchjob",
                             "--image", "img:1", "--namespace", "ml", "--nodes", 2, "--apply",
                             BEHAVE)
    assert code == 0, err
    assert "submitted pytorchjob ml/behave" in err
    assert api_server.seen == [
        ("POST", "/api/v1/namespaces/ml/secrets", "Bearer bearer-1"),
        ("POST", "/api/v1/namespaces/ml/configmaps", "Bearer bearer-1"),
        ("POST", "/apis/kubeflow.org/v1/namespaces/ml/pytorchjobs", "Bearer bearer-1")]
    code, out, err = run_cli(capsys, "job", "status", "pytorchjob/behave", "--namespace", "ml")
    assert (code, out) == (0, "job pytorchjob/behave in ml: Running\n"), err
    code, out, err = run_cli(capsys, "job", "list", "--k8s", "--json")
    assert code == 0, err
    assert json.loads(out) == [{"job_id": "pytorchjob/behave", "namespace": "ml",
                                "state": "Pending"}]          # no status in the stored object
    code, out, err = run_cli(capsys, "job", "logs", "pytorchjob/behave", "--namespace", "ml",
                             "--rank", 1)
    assert (code, out) == (0, "[trainer 0] log of behave-worker-0\n"), err   # pods by name
    code, out, err = run_cli(capsys, "job", "cancel", "pytorchjob/behave", "--namespace", "ml")
    assert code == 0, err
    assert [s[:2] for s in api_server.seen if s[0] == "DELETE"] == [
        ("DELETE", "/apis/kubeflow.org/v1/namespaces/ml/pytorchjobs/behave"),
        ("DELETE", "/api/v1/namespaces/ml/secrets/behave-token"),
        ("DELETE", "/api/v1/namespaces/ml/configmaps/behave-plan")]
    code, out, err = run_cli(capsys, "job", "status", "jobset/nope", "--namespace", "ml")
    assert code == 2 and err.startswith("error: reading jobset/nope in ml failed: 404")


def test_a_missing_rendering_library_is_one_line(capsys, monkeypatch):
    import importlib.util
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "kubeflow_trainer_api" else real(name, *a))
    code, out, err = run_cli(capsys, "train", "--backend", "k8s", "--kind", "jobset", "--image",
                             "i", "--dry-run", BEHAVE)
    assert (code, out) == (2, "")
    assert err == ("error: --backend k8s needs the kubeflow-trainer-api package "
                   "(pip install 'fluidctl[k8s]')\n")


def test_job_logs_follow_a_pod_through_a_quiet_spell_until_the_job_ends(
        capsys, tmp_path, monkeypatch, api_server):
    """``job logs -f`` on a Kubernetes job: the stream is read with a deadline; after a quiet
    spell it asks the job's state and opens the stream again, and the lines the server sends
    again are not printed twice (their timestamps order as times, not as strings: .5 < .50001);
    the job's end ends it with the job's exit code."""
    from fluidctl.backends.k8s import api
    monkeypatch.setattr(api, "QUIET", 0.3)
    monkeypatch.chdir(tmp_path)
    code, _, err = run_cli(capsys, "train", "--backend", "k8s", "--kind", "pytorchjob",
                           "--image", "img:1", "--namespace", "ml", "--nodes", 2, "--apply",
                           BEHAVE)
    assert code == 0, err
    first = [("2026-11-26T03:30:00.5Z", "step 1"), ("2026-11-26T03:30:00.50001Z", "step 2")]
    api_server.followed = [(first, "idle"),
                           (first + [("2026-11-26T03:30:02.25Z", "step 3")], "end")]
    code, out, err = run_cli(capsys, "job", "logs", "pytorchjob/behave", "--namespace", "ml",
                             "-f")
    assert (code, out) == (0, "step 1\nstep 2\nstep 3\n"), err
    assert "job pytorchjob/behave Succeeded" in err
    follows = [s[1].lower() for s in api_server.seen if "follow=true" in s[1].lower()]
    assert len(follows) == 2 and all("timestamps=true" in f for f in follows), follows
    assert "sinceseconds=" not in follows[0] and "sinceseconds=" in follows[1], follows


def test_job_checkpoint_annotates_every_pod_and_status_shows_what_failed_pods_left(
        capsys, tmp_path, monkeypatch, api_server):
    """issue 39.12 (Kubernetes): ``job checkpoint KIND/NAME [--stop]`` is the annotation the
    pods watch (tests/cluster/test_k8s_pod_requests.py: what the pods do with it); issue 42.3:
    ``job status`` prints each failed pod's termination message (a hang report)."""
    monkeypatch.chdir(tmp_path)
    code, _, err = run_cli(capsys, "train", "--backend", "k8s", "--kind", "pytorchjob",
                           "--image", "img:1", "--namespace", "ml", "--nodes", 2, "--apply",
                           BEHAVE)
    assert code == 0, err
    for argv, kind in (([], "save"), (["--stop"], "stop")):
        api_server.seen = []
        code, out, err = run_cli(capsys, "job", "checkpoint", "pytorchjob/behave",
                                 "--namespace", "ml", *argv)
        assert code == 0, err
        assert out.startswith("asked the 2 pod(s) of pytorchjob/behave for a checkpoint"), out
        patches = [s for s in api_server.seen if s[0] == "PATCH"]
        assert [p[1] for p in patches] == ["/api/v1/namespaces/ml/pods/behave-master-0",
                                           "/api/v1/namespaces/ml/pods/behave-worker-0"]
        for _, _, content_type, body in patches:
            assert content_type == "application/strategic-merge-patch+json"
            (value,) = body["metadata"]["annotations"].values()
            assert list(body["metadata"]["annotations"]) == ["fluidctl.io/checkpoint"]
            assert value.split()[0] == kind and float(value.split()[1]) > 0
    code, out, err = run_cli(capsys, "job", "checkpoint", "mpijob/behave", "--namespace", "ml")
    assert code == 2 and "an MPIJob's ranks are started by mpirun" in err
    assert len(err.strip().splitlines()) == 1
    api_server.state = "Failed"
    api_server.pod_status = {"behave-master-0": {"containerStatuses": [{
        "name": "pytorch", "image": "img:1", "imageID": "", "ready": False, "restartCount": 0,
        "state": {"terminated": {"exitCode": 124, "reason": "Error", "message":
                                 "pod behave-master-0: the job hung\nrank 1 in read_batch"}}}]}}
    code, out, err = run_cli(capsys, "job", "status", "pytorchjob/behave", "--namespace", "ml")
    assert code == 1, err
    assert out == ("job pytorchjob/behave in ml: Failed\n"
                   "  pod behave-master-0: exit code 124 (Error)\n"
                   "    pod behave-master-0: the job hung\n"
                   "    rank 1 in read_batch\n"), out


def test_job_checkpoint_refuses_an_elastic_pytorchjob(capsys, tmp_path, monkeypatch,
                                                      api_server):
    """torchrun supervises an elastic PyTorchJob's ranks: no fluidctl in its pods to ask."""
    monkeypatch.chdir(tmp_path)
    code, _, err = run_cli(capsys, "train", "--backend", "k8s", "--kind", "pytorchjob",
                           "--image", "img:1", "--namespace", "ml", "--nodes", "1:2", "--apply",
                           BEHAVE)
    assert code == 0, err
    code, out, err = run_cli(capsys, "job", "checkpoint", "pytorchjob/behave", "--namespace", "ml")
    assert (code, out) == (2, "") and "is an elastic PyTorchJob" in err, err
    assert not [s for s in api_server.seen if s[0] == "PATCH"]


def test_top_shows_a_kubernetes_job_s_pods_through_the_api(capsys, api_server):
    """fluidctl top KIND/NAME: one row per pod (by name), its node, phase and last log line,
    read with one list call and a one-line log read per pod."""
    api_server.stored["/apis/kubeflow.org/v1/namespaces/ml/pytorchjobs/behave"] = {
        "metadata": {"name": "behave"}}
    code, out, err = run_cli(capsys, "top", "pytorchjob/behave", "--namespace", "ml",
                             "--once", "--json")
    assert code == 0, err
    frame = json.loads(out)
    assert (frame["job"], frame["backend"], frame["world"], frame["running"]) == \
        ("pytorchjob/behave", "k8s", 2, True)
    assert [(r["rank"], r["pod"], r["host"], r["state"]) for r in frame["ranks"]] == [
        (0, "behave-master-0", "n1", "running"), (1, "behave-worker-0", "n2", "running")]
    assert frame["ranks"][1]["last_line"] == "[trainer 0] log of behave-worker-0"
    logs = [s[1] for s in api_server.seen if s[1].split("?")[0].endswith("/log")]
    assert len(logs) == 2 and all("tailLines=1" in path for path in logs), logs
    code, out, err = run_cli(capsys, "top", "jobset/nope", "--namespace", "ml", "--once")
    assert code == 2 and err.startswith("error: reading jobset/nope in ml failed: 404")
