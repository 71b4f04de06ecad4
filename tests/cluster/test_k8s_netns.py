"""The rendered Kubernetes jobs, executed without a cluster: each pod a network namespace with
its own address, the pods' names resolving there as the cluster's DNS would resolve them, the
container's command and environment as the YAML says (tests/k8spods.py). The same scripts give
the same results as ``fluidctl train`` on the same world on this machine. This proves the
rendering (addresses, ports, the environment contract, the token's Secret, the plan's
ConfigMap), not a Kubernetes cluster."""
import importlib.util
import os
import re
import shutil
import sys

import pytest

from k8spods import PodRun
from k8sutil import render, validate
from launchutil import ROOT, fluidctl

TEMPLATES = ROOT / "templates"
SCRIPTS = ROOT / "tests" / "scripts"


# torch 2.13's gloo sometimes aborts in its exit handlers after the script has finished (see
# tests/e2e/test_peer_scripts.py): that end, and only it, is let through for torch scripts
GLOO_EXIT_ABORT = "terminate called without an active exception"


def _ok(code, output, torch_exit) -> bool:
    return code == 0 or (torch_exit and code in (134, 128 + 6) and GLOO_EXIT_ABORT in output)


def run_pods(objects, nodes, workdir, timeout=90, meanwhile=None, torch_exit=False):
    """Run the pods to the end; ``meanwhile()`` (the reference run here) runs while they do.
    Returns (the pods' results, what ``meanwhile`` returned)."""
    run = PodRun(objects, nodes, workdir)
    if objects[-1]["apiVersion"] == "kubeflow.org/v2beta1":
        run.mpi_operator_v2(sys.prefix)
    elif objects[-1]["kind"] == "MPIJob":
        run.mpi_operator(sys.prefix)
    try:
        run.start()
        beside = meanwhile() if meanwhile else None
        results = run.wait(timeout)
    finally:
        run.close()
    deciding = {p.name for p in run.pods if p.decides}
    failed = {name: code for name, (code, out) in results.items()
              if code is None or (name in deciding and not _ok(code, out, torch_exit))}
    assert not failed, f"pods exited {failed}:\n" + "\n".join(
        f"--- {name}\n{output}" for name, (_, output) in results.items())
    return results, beside


def rendered(tmp_path, monkeypatch, script, kind, nodes, **settings):
    """Render from a work dir holding the script (the image's working directory)."""
    work = tmp_path / kind
    work.mkdir()
    shutil.copy(script, work / script.name)
    monkeypatch.chdir(work)
    _, objects = render(str(work / script.name), kind, nodes=nodes, **settings)
    validate(objects)
    return work, objects


# The pods get the YAML's environment only. A variable of this shell that picks other math
# kernels (OPENBLAS_CORETYPE=Haswell on a Zen CPU, as some machines set it) would make the
# reference run round differently in the last bit: the reference runs without them.
KERNEL_CHOICE = ("OPENBLAS_", "GOTO_", "MKL_", "NVPL_", "BLIS_")


def local_run(tmp_path, script, *args, nproc=2, mode=(), torch_exit=False):
    work = tmp_path / "local"
    work.mkdir(exist_ok=True)
    with pytest.MonkeyPatch.context() as env:
        for name in [n for n in os.environ if n.startswith(KERNEL_CHOICE)]:
            env.delenv(name)
        res = fluidctl("train", "--nproc", nproc, *mode, "--tee", "all", script, *args,
                       cwd=work, timeout=240)
    assert _ok(res.returncode, res.stdout + res.stderr, torch_exit), res.stdout + res.stderr
    return work, res.stdout


RUNTIME_ARGS = ["--epochs", "2", "--samples", "512", "--save-params", "w.npz"]


@pytest.fixture(scope="module")
def local_weights(tmp_path_factory):
    """The runtime script's weights under ``fluidctl train --nproc 2`` here (shared memory)."""
    import numpy as np
    work, stdout = local_run(tmp_path_factory.mktemp("k8s-local"), TEMPLATES / "train_nccl2.py",
                             *RUNTIME_ARGS)
    assert "transport shm" in stdout, stdout
    return dict(np.load(work / "w.npz"))


KINDS = [("pytorchjob", None), ("paddlejob", None), ("jobset", None), ("trainjob", None),
         ("mpijob", "v2beta1"), ("mpijob", "v1")]


@pytest.mark.parametrize("kind,version", KINDS, ids=[k + (f"-{v}" if v else "") for k, v in KINDS])
def test_runtime_script_gives_the_same_weights_as_fluidctl_train(netns_nodes, tmp_path,
                                                                  monkeypatch, kind, version,
                                                                  local_weights):
    import numpy as np
    nodes = netns_nodes(3 if kind == "mpijob" else 2, sftp=False)
    script = TEMPLATES / "train_nccl2.py"
    work, objects = rendered(tmp_path, monkeypatch, script, kind, 2, api_version=version,
                             script_args=tuple(RUNTIME_ARGS))
    results, _ = run_pods(objects, nodes, work)
    logs = "".join(out for _, out in results.values())
    assert "2 trainer(s), transport ring" in logs, logs      # TCP between the pods
    if version == "v2beta1":            # mpirun reached each Worker through its sshd
        workers = [out for name, (_, out) in results.items() if "-worker-" in name]
        assert len(workers) == 2 and all("Accepted publickey for root" in out
                                         for out in workers), workers
    in_pods = np.load(work / "w.npz")
    assert sorted(in_pods.files) == sorted(local_weights)
    for key, here in local_weights.items():
        assert np.array_equal(in_pods[key], here), key


@pytest.mark.parametrize("kind", ["jobset", "paddlejob"])
def test_pserver_mode_as_a_separate_replica_set(netns_nodes, tmp_path, monkeypatch, kind):
    """The pservers are pods of their own; they end once every trainer left (a PaddleJob
    succeeds when its Masters, the pservers, do)."""
    nodes = netns_nodes(3, sftp=False)
    script = TEMPLATES / "train_pserver.py"
    args = ("--steps", "20")
    work, objects = rendered(tmp_path, monkeypatch, script, kind, 2, mode="pserver",
                             pservers=1, script_args=args)
    results, (_, stdout) = run_pods(objects, nodes, work, meanwhile=lambda: local_run(
        tmp_path, script, *args, mode=("--mode", "pserver")))
    done = sorted(re.findall(r"trainer \d done: loss .*", "".join(
        out for _, out in results.values())))
    assert len(done) == 2 and done == sorted(re.findall(r"trainer \d done: loss .*", stdout))


@pytest.mark.skipif(importlib.util.find_spec("paddle") is None, reason="paddle not installed")
def test_paddle_dataparallel_in_paddlejob_pods(netns_nodes, tmp_path, monkeypatch):
    nodes = netns_nodes(2, sftp=False)
    work, objects = rendered(tmp_path, monkeypatch, SCRIPTS / "paddle_dp.py", "paddlejob", 2)
    results, (_, stdout) = run_pods(objects, nodes, work, timeout=150, meanwhile=lambda: local_run(
        tmp_path, SCRIPTS / "paddle_dp.py"))
    pattern = r"paddle rank (\d)/2 allreduce 3\.0 weights (\[.*\])"
    found = re.findall(pattern, "".join(out for _, out in results.values()))
    assert sorted(found) == sorted(re.findall(pattern, stdout)) and len(found) == 2


@pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="torch not installed")
def test_torch_ddp_in_pytorchjob_pods(netns_nodes, tmp_path, monkeypatch):
    nodes = netns_nodes(2, sftp=False)
    work, objects = rendered(tmp_path, monkeypatch, SCRIPTS / "torch_ddp.py", "pytorchjob", 2)
    results, (_, stdout) = run_pods(objects, nodes, work, torch_exit=True,
                                    meanwhile=lambda: local_run(tmp_path, SCRIPTS / "torch_ddp.py",
                                                                torch_exit=True))
    # a set: a pod whose torch aborted in its exit handlers (GLOO_EXIT_ABORT) shows its
    # rank's log tail in the failure report, this line again among it
    found = sorted(set(re.findall(r"torch rank (\d)/2 .*allreduce 3\.0 weights (\[.*\])",
                                  "".join(out for _, out in results.values()))))
    here = re.findall(r"torch rank (\d)/2 .*allreduce 3\.0 weights (\[.*\])", stdout)
    # DDP keeps every rank's weights equal. Locally, one rank's gloo abort at exit may end the
    # job before the other's line is out, so the reference is whichever lines it printed.
    assert len(found) == 2 and len({w for _, w in found}) == 1, found
    assert here and set(here) <= set(found), (here, found)


RESUME_STEPS = 12


def _saved_step(work, rank: int) -> int:
    import json
    try:
        return max(int(s) for s in json.loads((work / f"ckpt.{rank}.json").read_text()))
    except (OSError, ValueError):
        return 0


@pytest.mark.parametrize("kind,version", [("trainjob", None), ("mpijob", "v2beta1"),
                                          ("pytorchjob", None)])
def test_a_killed_pod_restarts_the_group_which_resumes_from_its_checkpoint(
        netns_nodes, tmp_path, monkeypatch, kind, version):
    """The whole group restarts (JobSet's failurePolicy; mpirun's Launcher retried; under the
    training operator, every other pod's entry exits when its ranks lose their peer, and the
    kubelet restarts each) and every rank goes on from the checkpoint: the result is the one of
    a run without a failure."""
    import time
    nodes = netns_nodes(3 if kind == "mpijob" else 2, sftp=False)
    work, objects = rendered(tmp_path, monkeypatch, SCRIPTS / "k8s_resume.py", kind, 2,
                             api_version=version, max_restarts=1,
                             script_args=(str(RESUME_STEPS), "0.3"))
    run = PodRun(objects, nodes, work)
    if version:
        run.mpi_operator_v2(sys.prefix)
    try:
        run.start()
        deadline = time.monotonic() + 90
        while min(_saved_step(work, r) for r in (0, 1)) < 3:     # mid-job: step 3 saved
            assert time.monotonic() < deadline, "the job did not reach step 3"
            assert all(p.poll() is None for p in run.procs.values()), "a pod ended early"
            time.sleep(0.1)
        victim = [p for p in run.pods if not p.decides or kind != "mpijob"][1]
        run.kill_pod(victim.name)
        assert run.restart_after(victim.name) == "group"
        results = run.wait(120)
    finally:
        run.close()
    logs = "".join(out for _, out in results.values())
    expected = float(sum((1 + 2) * step for step in range(1, RESUME_STEPS + 1)))
    done = sorted(re.findall(r"rank (\d) done: step (\d+) value (\S+)", logs))
    assert done == [("0", str(RESUME_STEPS), str(expected)),
                    ("1", str(RESUME_STEPS), str(expected))], logs
    starts = re.findall(r"rank (\d) started at step (\d+)", logs)
    assert sorted(r for r, _ in starts) == ["0", "0", "1", "1"], logs   # every rank restarted
    resumed = {int(step) for _, step in starts} - {0}
    assert resumed and min(resumed) >= 3, logs               # from the checkpoint, not step 0
