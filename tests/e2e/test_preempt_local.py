"""Checkpoint requests on the local backend: SIGTERM or SIGUSR1 to ``fluidctl train`` makes every
rank commit at the same step; the job run again resumes there with no optimizer step lost or
repeated and the weights of an uninterrupted run; a rank killed during a save, or a second
signal during it, leaves that checkpoint partial and the previous one is resumed
(``--max-restarts`` resumes the same way); a corrupted part is named and skipped."""
import json
import os
import signal
import sys

import numpy as np

from launchutil import ROOT, start_fluidctl, wait_for

sys.path.insert(0, str(ROOT / "tests" / "scripts"))
from preempt_train import reference  # noqa: E402

SCRIPT = ROOT / "tests" / "scripts" / "preempt_train.py"
STEPS, DIM, WORLD = 60, 1000, 3


def train(tmp_path, *extra, options=()):
    return start_fluidctl("train", "--nproc", WORLD, "--log-dir", tmp_path / "log", *options,
                          SCRIPT, "--ckpt", tmp_path / "ck", "--out", tmp_path / "out",
                          "--steps", STEPS, "--dim", DIM, "--step-time", 0.01, *extra,
                          cwd=tmp_path)


def steps_done(tmp_path, rank=WORLD - 1):
    try:
        return len((tmp_path / "out" / f"steps.{rank}").read_text().split())
    except FileNotFoundError:
        return 0


def events(tmp_path):
    return [(tmp_path / "out" / f"events.{r}").read_text().split("\n")[:-1]
            for r in range(WORLD)]


def logged_steps(tmp_path, rank):
    return [int(s) for s in (tmp_path / "out" / f"steps.{rank}").read_text().split()]


def assert_final(tmp_path):
    final = np.load(tmp_path / "out" / "final.npy")
    np.testing.assert_allclose(final, reference(WORLD, STEPS, DIM), rtol=0, atol=1e-9)


def test_sigterm_commits_every_rank_at_one_step_then_resumes(tmp_path):
    proc = train(tmp_path)
    wait_for(lambda: steps_done(tmp_path) >= 15, 60, "15 steps")
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 128 + signal.SIGTERM, err
    saved = {e for ev in events(tmp_path) for e in ev if e.startswith("saved")}
    assert len(saved) == 1, events(tmp_path)          # one step, the same on every rank
    step = int(saved.pop().split()[1])
    manifest = json.loads((tmp_path / "ck" / f"step-{step:09d}" / "manifest.json").read_text())
    assert manifest["step"] == step and len(manifest["parts"]) == WORLD
    record = json.loads((tmp_path / "log" / "checkpoint.json").read_text())
    assert record["step"] == step and record["stop"] is True

    again = train(tmp_path)
    out, err = again.communicate(timeout=120)
    assert again.returncode == 0, err
    for rank in range(WORLD):
        assert events(tmp_path)[rank][-2:] == [f"resumed {step}", "finished"]
        assert logged_steps(tmp_path, rank) == list(range(STEPS))   # none lost or repeated
    assert_final(tmp_path)


def test_rank_killed_during_save_resumes_previous_under_max_restarts(tmp_path):
    proc = train(tmp_path, "--every", 10, "--pause-save", "1:60:25", options=(
        "--max-restarts", 1))
    saving = tmp_path / "out" / "saving.1"
    wait_for(lambda: saving.exists() and saving.read_text(), 60, "rank 1 in its save")
    os.kill(int(saving.read_text()), signal.SIGKILL)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    for rank in range(WORLD):
        ev = events(tmp_path)[rank]
        assert "resumed 19" in ev and ev[-1] == "finished", ev   # step 29's save never committed
    assert_final(tmp_path)


def test_second_signal_during_save_kills_and_previous_checkpoint_stays(tmp_path):
    proc = train(tmp_path, "--every", 10, "--pause-save", "1:60:10")
    wait_for(lambda: steps_done(tmp_path) >= 12, 60, "12 steps")
    proc.send_signal(signal.SIGUSR1)
    wait_for(lambda: (tmp_path / "out" / "saving.1").exists(), 60, "rank 1 in its save")
    proc.send_signal(signal.SIGUSR1)              # a second signal: at once
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 128 + signal.SIGUSR1, err
    assert "second SIGUSR1: killing every process now" in (
        tmp_path / "log" / "launch.log").read_text()
    assert [p.name for p in sorted((tmp_path / "ck").iterdir())
            if p.name.startswith("step-")] == ["step-000000009"]
    again = train(tmp_path)
    out, err = again.communicate(timeout=120)
    assert again.returncode == 0, err
    assert events(tmp_path)[0][-2:] == ["resumed 9", "finished"]
    assert_final(tmp_path)


def test_sigusr1_exits_for_requeue(tmp_path):
    proc = train(tmp_path, options=("--checkpoint-signal", "USR2"))
    wait_for(lambda: steps_done(tmp_path) >= 5, 60, "5 steps")
    proc.send_signal(signal.SIGUSR1)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 75, err
    assert "checkpoint requested (SIGUSR1): SIGUSR2 to every rank" in out + err
    assert "exit 75: run the job again (requeue) to resume" in out + err


def test_corrupted_part_is_named_and_the_previous_checkpoint_resumed(tmp_path):
    first = train(tmp_path, "--every", 10)
    out, err = first.communicate(timeout=120)
    assert first.returncode == 0, err
    part = tmp_path / "ck" / "step-000000059" / "part-00001.bin"
    data = bytearray(part.read_bytes())
    data[len(data) // 2] ^= 0x01                  # one bit: same size, another digest
    part.write_bytes(bytes(data))
    again = train(tmp_path)
    out, err = again.communicate(timeout=120)
    assert again.returncode == 0, err
    assert f"{part} is corrupted" in (tmp_path / "log" / "workerlog.1").read_text()
    assert all(ev[-2:] == ["resumed 49", "finished"] for ev in events(tmp_path))
    assert_final(tmp_path)
