"""The Slurm backend in-process: srun's argv against golden text and its failure parsing, a task
Slurm killed for memory, GPUs beyond the allocation's, and a step Slurm refuses."""
import signal

import pytest

from fluidctl.backends.slurm import step as backend


# --- pure ------------------------------------------------------------------------------------
def test_golden_srun_and_failure_parsing():
    argv = backend.srun_argv(nodes=2, ntasks_per_node=4, name="fluidctl-ab12",
                             command=["/py", "-m", "fluidctl", "worker", "t.py", "--lr", "1"],
                             extra=["--cpu-bind=cores"])
    assert " ".join(argv) == (
        "srun --kill-on-bad-exit=1 --nodes=2 --ntasks=8 --ntasks-per-node=4 "
        "--job-name=fluidctl-ab12 --cpu-bind=cores /py -m fluidctl worker t.py --lr 1")
    assert "--nodelist=n1 --overlap" in " ".join(backend.srun_argv(
        nodes=1, ntasks_per_node=1, name="x", command=["c"], nodelist=["n1"], overlap=True))
    report = ("srun: error: gpu002: task 3: Exited with exit code 7\n"
              "srun: launch/slurm: _step_signal: Terminating StepId=5.0\n"
              "srun: error: gpu001: tasks 0-1: Terminated\n")
    assert backend.first_failed_task(report) == (3, "gpu002", 7)
    assert backend.first_failed_task("srun: error: n1: tasks 4,6: Segmentation fault") == (
        4, "n1", -signal.SIGSEGV)
    assert backend.first_failed_task("srun: error: Unable to create step") is None


@pytest.mark.parametrize("report, task, host", [
    # Slurm 22.05+: slurmstepd's line, then srun's word for the task
    ("slurmstepd: error: Detected 1 oom_kill event in StepId=1054.0. Some of the step tasks "
     "have been OOM Killed.\nsrun: error: ana: task 0: Out Of Memory\n", 0, "ana"),
    # the killed task reported as Terminated by others, the event logged with a timestamp
    ("[2026-09-14T17:14:38.784] error: Detected 1 oom_kill event in StepId=22035606.1. Some of "
     "the step tasks have been OOM Killed.\nsrun: error: nid005475: tasks 0-2,5,7: Terminated\n"
     "srun: Force Terminated StepId=22035606.1\n", 0, "nid005475"),
    # older wordings
    ("slurmstepd: error: Detected 2 oom-kill event(s) in StepId=7.0. Some of your processes may "
     "have been killed by the cgroup out-of-memory handler.\nsrun: error: n3: task 5: Killed\n",
     5, "n3"),
    ("slurmstepd: error: StepId=7.0 exceeded memory limit (734003200 > 52428800), being killed\n"
     "srun: error: n1: task 2: Killed\n", 2, "n1"),
])
def test_a_task_slurm_killed_for_memory_is_reported_as_oom(tmp_path, report, task, host):
    """Slurm's memory cgroup kills a task on another node: this machine's kernel log knows
    nothing of it, srun's report does (wordings from Slurm's own output; this test cluster
    runs without cgroup memory enforcement, so a real one cannot be provoked here)."""
    from fluidctl.paths import LogLayout
    failure = backend.srun_failure(report, LogLayout(tmp_path))
    assert (failure.label, failure.host) == (f"trainer {task}", host)
    assert failure.kind == "oom"
    assert failure.explanation.startswith("killed for memory: Slurm's memory limit for the step")
    assert "--mem" in failure.explanation
    assert failure.log == str(tmp_path / f"workerlog.{task}")
    plain = backend.srun_failure("srun: error: n1: task 2: Exited with exit code 3\n",
                                 LogLayout(tmp_path))
    assert (plain.returncode, plain.kind, plain.explanation) == (3, "", "")


@pytest.mark.parametrize("gpus, message", [
    ("4", None), ("2", None), ("0,3", None), (None, None),
    ("8", "--gpus 8 asks for 8 GPU(s) per node, but allocation 7 has 4 GPU(s) on each node "
          "(pass --gpus 4 or less, or allocate more, e.g. salloc --gpus-per-node 8)"),
    ("1,4", "--gpus 1,4 names GPU 4, but allocation 7 has 4 GPU(s) on each node: they are 0-3 "
            "there (pick ids from 0 to 3)"),
])
def test_gpus_beyond_the_allocation_s_are_refused_before_srun(gpus, message):
    """Slurm sets SLURM_GPUS_ON_NODE in an allocation with GPUs (none here: the variables
    are what such an allocation has); more, or an id past the last, is one line, since the
    extra ranks would otherwise start and each fail on a device that is not there."""
    from fluidctl.errors import UsageError
    from fluidctl.backends.slurm import plan as slurmplan
    alloc = slurmplan.allocation({"SLURM_JOB_ID": "7", "SLURM_JOB_NODELIST": "gpu[1-2]",
                                 "SLURM_GPUS_ON_NODE": "4"})
    if message is None:
        slurmplan.check_gpus(alloc, gpus)
    else:
        with pytest.raises(UsageError) as refused:
            slurmplan.check_gpus(alloc, gpus)
        assert refused.value.one_line() == "error: " + message
    bare = {"SLURM_JOB_ID": "7", "SLURM_JOB_NODELIST": "n1"}
    gres = {**bare, "SLURM_JOB_GPUS": "0,1"}           # GPUs, but not how many per node:
    slurmplan.check_gpus(slurmplan.allocation(gres), "8", gres)              # not judged
    slurmplan.check_gpus(slurmplan.allocation(bare), "8", bare, ["--gres=gpu:8"])
    with pytest.raises(UsageError) as cpu_only:         # issue 25.5: no GPU at all
        slurmplan.check_gpus(slurmplan.allocation(bare), "8", bare)
    assert cpu_only.value.one_line() == (
        "error: --gpus 8 but allocation 7 has no GPUs (Slurm set none of SLURM_GPUS_ON_NODE, "
        "SLURM_JOB_GPUS, SLURM_GPUS_PER_NODE) (allocate some, e.g. salloc --gpus-per-node 8, "
        "or run on CPU with --nproc 8)")
    typed = slurmplan.allocation({"SLURM_JOB_ID": "7", "SLURM_JOB_NODELIST": "n1",
                                 "SLURM_GPUS_PER_NODE": "a100:4"})     # --gpus-per-node a100:4
    assert typed.gpus_per_node == 4


@pytest.mark.parametrize("reason, hint", [
    ("More processors requested than permitted", "run fewer ranks per node (--nproc)"),
    ("Requested node configuration is not available", "scontrol show job"),
    ("Memory required by task is not available", "salloc --mem"),
    ("Requested nodes are busy", "--slurm-arg=--overlap"),
    ("Invalid generic resource (gres) specification", ""),
])
def test_a_step_slurm_refuses_is_explained(tmp_path, reason, hint):
    """srun's 'Unable to create step' (no task ever ran): Slurm's refusal, with what to
    change, instead of 'exit code 1' (srun's wording, as Slurm 22.05 prints it here)."""
    from fluidctl.paths import LogLayout
    failure = backend.srun_failure(
        f"srun: error: Unable to create step for job 670842: {reason}\n", LogLayout(tmp_path))
    assert (failure.label, failure.kind, failure.log) == (
        "srun (trainers)", "refused", str(tmp_path / "srun.log"))
    assert failure.explanation.startswith(
        f"Slurm refused to start the step in job 670842: {reason}")
    assert hint in failure.explanation
    assert backend.srun_failure("srun: error: something else\n", LogLayout(tmp_path)) is None


def test_40_5_only_slurms_own_node_failure_is_node_evidence():
    assert backend.node_failure("srun: error: node2: task 1: Exited with exit code 3\n"
                                "srun: error: node1: task 0: Killed") is None
    assert backend.node_failure("srun: error: Node failure on node2\nsrun: Job step aborted: "
                                "Waiting up to 32 seconds for job step to finish.") == "node2"
