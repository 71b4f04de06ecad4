"""A change of world size 4 -> 3 -> 4 across checkpoint stops on the real Slurm of
tests/slurm.py: inside one allocation, ``fluidctl train --backend slurm`` runs
tests/scripts/preempt_samples.py (canonical shards, ShardReader state and replicated float64
weights in one Checkpointer commit) at 2 nodes x 2 ranks, is asked for a checkpoint by SIGUSR1,
exits 75, resumes at 1 node x 3 ranks, is stopped the same way and finishes at 2 x 2 again.
Per epoch the consumed samples are a single-process run's (none twice, none left out), every
optimizer step runs once, and the final weights are an uninterrupted run's (tolerance 1e-9)."""
import signal
import subprocess
import sys
from collections import Counter

import numpy as np

from launchutil import ROOT, fluidctl as local_fluidctl, wait_for

sys.path.insert(0, str(ROOT / "tests" / "scripts"))
from preempt_samples import reference  # noqa: E402

SCRIPT = ROOT / "tests" / "scripts" / "preempt_samples.py"
SAMPLES, EPOCHS = 233, 3          # 20 steps of 12 samples an epoch, the last one of 5


def lines(path):
    try:
        return path.read_text().split("\n")[:-1]
    except FileNotFoundError:
        return []


def test_world_size_4_3_4_across_checkpoint_stops(slurm, tmp_path):
    (tmp_path / "train.txt").write_text("".join(f"sample-{i}\n" for i in range(SAMPLES)))
    local_fluidctl("shard-data", "train.txt", "--shards", 5, "-o", "canon", "-q", cwd=tmp_path,
                   check=0)
    alloc = slurm.allocate(2, 2, "--cpus-per-task=2")        # 4 CPUs on each node
    env = slurm.env(FLUIDCTL_STATE_DIR=str(tmp_path / "state"), **alloc)
    out, said = tmp_path / "out", {}
    runs = (("a", 2, 2, True), ("b", 1, 3, True), ("c", 2, 2, False))
    for tag, nodes, nproc, stop in runs:
        argv = [sys.executable, "-m", "fluidctl", "train", "--backend", "slurm", "--nodes",
                nodes, "--nproc", nproc, "--log-dir", tmp_path / f"log-{tag}", SCRIPT,
                tmp_path / "canon", "--ckpt", tmp_path / "ck", "--out", out, "--tag", tag,
                "--epochs", EPOCHS]
        proc = subprocess.Popen(list(map(str, argv)), env=env, cwd=tmp_path,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        if stop:
            wait_for(lambda: len(lines(out / f"{tag}.steps.{nodes * nproc - 1}")) >= 5
                     or proc.poll() is not None, 60, f"5 steps of run {tag}")
            proc.send_signal(signal.SIGUSR1)
        said[tag] = proc.communicate(timeout=90)[0]
        assert proc.returncode == (75 if stop else 0), said[tag]

    w_ref, ref_epochs = reference(str(tmp_path / "canon"), EPOCHS)
    consumed = [Counter() for _ in range(EPOCHS)]
    done = []
    for tag, nodes, nproc, stop in runs:
        world = nodes * nproc
        events = [lines(out / f"{tag}.events.{r}") for r in range(world)]
        assert all(e == events[0] for e in events), events       # one stop step for all
        steps = [lines(out / f"{tag}.steps.{r}") for r in range(world)]
        assert all(s == steps[0] for s in steps), steps
        if done:
            assert events[0][0] == f"resumed {done[-1]} world {world}", events[0]
        assert events[0][-1] == (f"stop {steps[0][-1]}" if stop else "finished"), events[0]
        if stop:        # every rank saved and exited 0: none killed during or after its save
            assert ("every rank exited on the checkpoint request after committing step "
                    f"{steps[0][-1]}; exit 75") in said[tag], said[tag]
        done += [int(s) for s in steps[0]]
        for r in range(world):
            for line in lines(out / f"{tag}.samples.{r}"):
                epoch, sample = line.split()
                consumed[int(epoch)][int(sample)] += 1
    assert done == list(range(EPOCHS * 20))              # no step lost, none repeated
    for epoch in range(EPOCHS):
        assert consumed[epoch] == Counter(ref_epochs[epoch]) == Counter(range(SAMPLES)), epoch
    np.testing.assert_allclose(np.load(out / "final.npy"), w_ref, rtol=0, atol=1e-9)
