"""A job over canonical shards stopped at 4 ranks, resumed at 3, then at 4 again, each time from
the reader state its ranks saved: the samples consumed in the epoch are exactly the data set,
none twice, none left out. Real trainer processes under fluidctl train; the shards are written
by the real shard-data command."""
import json
from collections import Counter

from launchutil import ROOT, fluidctl

SCRIPT = ROOT / "tests" / "scripts" / "resume_samples.py"


def consumed(logdir, tag, world):
    lines = []
    for rank in range(world):
        lines += (logdir / f"{tag}-rank{rank}.samples").read_text().splitlines()
    return lines


def saved_state(logdir, tag, world):
    states = [json.loads((logdir / f"{tag}-rank{r}.state.json").read_text())
              for r in range(world)]
    assert all(s == states[0] for s in states), states        # every rank saves the same
    return states[0]


def test_stop_at_4_resume_at_3_then_4_consumes_the_epoch_exactly(tmp_path):
    (tmp_path / "train.txt").write_text("".join(f"sample-{i}\n" for i in range(103)))
    fluidctl("shard-data", "train.txt", "--shards", 5, "-o", "canon", "-q", cwd=tmp_path,
             check=0)
    logs = tmp_path / "logs"
    logs.mkdir()
    state = None
    for tag, nproc, steps in (("a", 4, 3), ("b", 3, 2), ("c", 4, 0)):
        resume = ["--state", logs / f"{state}-rank0.state.json"] if state else []
        fluidctl("train", "--nproc", nproc, SCRIPT, "canon", logs, tag, "--steps", steps,
                 *resume, cwd=tmp_path, timeout=120, check=0)
        state = tag
    assert saved_state(logs, "a", 4)["offset"] == 3 * 4 * 4
    assert saved_state(logs, "b", 3)["offset"] == 48 + 2 * 4 * 3
    assert saved_state(logs, "c", 4)["epoch"] == 1 and saved_state(logs, "c", 4)["offset"] == 0
    epoch = consumed(logs, "a", 4) + consumed(logs, "b", 3) + consumed(logs, "c", 4)
    assert Counter(epoch) == Counter(f"0 sample-{i}" for i in range(103))
