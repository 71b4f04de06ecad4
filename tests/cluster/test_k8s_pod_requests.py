"""A Kubernetes job's pods (network-namespace pods, tests/k8spods.py) answer what the kubelet
and ``fluidctl job checkpoint`` ask of them, as ``fluidctl train`` on one machine does:

- issue 42 item 4: the kubelet's SIGTERM (an eviction, a preemption) inside the rendered
  grace period commits a checkpoint, then the pods end; nothing needs the kubelet's SIGKILL;
- issue 39 item 12: the checkpoint annotation (what ``fluidctl job checkpoint KIND/NAME``
  sets) reaches every pod through its downward API file: every rank saves at the same step
  and the job goes on to its end;
- issue 42 item 3: --hang-timeout in the pods: the hang report in the pods' output (what
  ``fluidctl job logs`` prints) and in their termination message (what ``job status`` prints).
"""
import json
import time
from pathlib import Path

from k8spods import PodRun
from k8sutil import pod_templates, validate
from launchutil import ROOT, wait_for
from test_k8s_netns import rendered

TRAIN = ROOT / "tests" / "scripts" / "preempt_train.py"
HANG = ROOT / "tests" / "scripts" / "plain_hang.py"


def _lines(path: Path):
    try:
        return path.read_text().split("\n")
    except FileNotFoundError:
        return []


def _train(tmp_path, monkeypatch, steps, **settings):
    args = ("--ckpt", str(tmp_path / "ckpt"), "--out", str(tmp_path / "out"), "--steps",
            str(steps), "--dim", "64", "--step-time", "0.02")
    return rendered(tmp_path, monkeypatch, TRAIN, "pytorchjob", 2, script_args=args,
                    **settings)


def _started(objects, nodes, work, tmp_path):
    run = PodRun(objects, nodes, work)
    run.start()
    out = tmp_path / "out"
    try:
        wait_for(lambda: all(len(_lines(out / f"steps.{r}")) > 10 for r in (0, 1)), 90,
                 "ten steps in both pods")
    except AssertionError:
        run.close()
        raise
    return run, out


def test_sigterm_in_the_grace_period_commits_a_checkpoint(netns_nodes, tmp_path, monkeypatch):
    nodes = netns_nodes(2, sftp=False)
    work, objects = _train(tmp_path, monkeypatch, 100000, grace_period=20)
    grace = {t["spec"]["terminationGracePeriodSeconds"] for t in pod_templates(objects[-1])}
    assert grace == {30}
    run, out = _started(objects, nodes, work, tmp_path)
    try:
        began = time.monotonic()
        for proc in run.procs.values():         # the kubelet stops every pod of the job
            proc.terminate()
        codes = {name: proc.wait(timeout=30) for name, proc in run.procs.items()}
        took = time.monotonic() - began
    finally:
        run.close()
    print(f"SIGTERM to both pods ended: {took:.2f}s (grace period 20s)")
    assert took < 20, took                      # inside --grace-period, the kubelet's SIGKILL
                                                # 10 s later still
    stops = {r: [e for e in _lines(out / f"events.{r}") if e.startswith("stop ")]
             for r in (0, 1)}
    assert stops[0] and stops[0] == stops[1], stops             # the same step, saved
    found = sorted(work.glob("*/*/checkpoint.json"))          # LOG_DIR/<pod>/, rank 0's
    assert [p.parent.name for p in found] == ["preempt-train-master-0"], found
    commit = json.loads(found[0].read_text())
    assert commit["stop"] and int(commit["step"]) == int(stops[0][0].split()[1]), commit
    # each pod entry ended by itself, as a SIGTERMed fluidctl does (128 + 15), not killed
    assert set(codes.values()) == {143}, codes


def test_the_checkpoint_annotation_saves_and_the_job_goes_on(netns_nodes, tmp_path,
                                                            monkeypatch):
    nodes = netns_nodes(2, sftp=False)
    work, objects = _train(tmp_path, monkeypatch, 300)
    run, out = _started(objects, nodes, work, tmp_path)
    try:
        # fluidctl job checkpoint pytorchjob/NAME; the kubelets pass it on at their own moments
        for pod in reversed(run.pods):
            run.annotate(pod.name, **{"fluidctl.io/checkpoint": "save 1764300000.000"})
        wait_for(lambda: all(any(e.startswith("saved ") for e in _lines(out / f"events.{r}"))
                             for r in (0, 1)), 60, "both ranks saved")
        results = run.wait(120)
    finally:
        run.close()
    assert {code for code, _ in results.values()} == {0}, results
    saved = {r: [e for e in _lines(out / f"events.{r}") if e.startswith("saved ")]
             for r in (0, 1)}
    assert saved[0] == saved[1] and len(saved[0]) == 1, saved
    assert _lines(out / "events.0")[-2] == "finished"              # and it went on


def test_a_hang_is_reported_in_the_pods_logs_and_termination_message(netns_nodes, tmp_path,
                                                                     monkeypatch):
    nodes = netns_nodes(2, sftp=False)
    work, objects = rendered(tmp_path, monkeypatch, HANG, "pytorchjob", 1, nproc=2,
                             hang_timeout=3)
    validate(objects)
    run = PodRun(objects, nodes, work)
    try:
        run.start()
        results = run.wait(90)
        message = run.message("plain-hang-master-0")
    finally:
        run.close()
    (code, output), = results.values()
    assert code == 124, output
    assert "hung" in output and "read_batch" in output, output
    assert message.startswith("pod plain-hang-master-0: "), message
    assert "read_batch" in message and "every rank's full stack:" in message, message


def test_an_elastic_pytorchjob_runs_torchrun_in_every_pod(netns_nodes, tmp_path, monkeypatch):
    """Issue 42 item 5: --nodes 2:2 --kind pytorchjob (MIN = MAX: both pods in the first world,
    whatever their start order); the pods, given the operator's PET_* as it gives them, form
    one world through torchrun's c10d rendezvous and train to the end."""
    import importlib.util
    if importlib.util.find_spec("torch") is None:
        import pytest
        pytest.skip("torch not installed")
    from test_k8s_netns import _ok
    nodes = netns_nodes(2, sftp=False)
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    work, objects = rendered(tmp_path, monkeypatch, ROOT / "tests" / "scripts" /
                             "torch_elastic.py", "pytorchjob", 2, nproc=2,
                             script_args=("20", str(ckpt)))
    assert "elasticPolicy" not in objects[-1]["spec"]           # a fixed world: --nodes 2
    from k8sutil import render
    _, objects = render(str(work / "torch_elastic.py"), "pytorchjob", nodes=2, nproc=2,
                        script_args=("20", str(ckpt)), elastic=(2, 2))
    validate(objects)
    run = PodRun(objects, nodes, work)
    run.pytorch_elastic_operator()
    try:
        run.start()
        results = run.wait(150)
    finally:
        run.close()
    failed = {n: out for n, (code, out) in results.items() if not _ok(code, out, True)}
    assert not failed, failed
    log = (ckpt / "progress.log").read_text()
    assert "start 0 world 4" in log and "step 20 world 4" in log, log
    assert (ckpt / "final.json").exists()
