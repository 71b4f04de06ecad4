"""Issue 40 (hardening), local: checkpoints saved back to back by two ranks (#2). Rank 0's
prune after a commit runs while the other rank already writes the next save: it must never
touch that save's .partial- directory."""
from launchutil import fluidctl

SAVES = """
import sys
import numpy as np
import fluidctl.runtime as rt
from fluidctl.runtime.checkpoint import Checkpointer

ctx = rt.init()
ckpt = Checkpointer(ctx, sys.argv[1], keep=1)
for step in range(int(sys.argv[2])):        # no collective between two saves
    ckpt.save(step, {"w": np.full(1 << 16, float(step + ctx.rank))})
found = ckpt.load()
assert found.step == int(sys.argv[2]) - 1 and float(found.arrays["w"][0]) == found.step + ctx.rank
print(f"rank {ctx.rank} resumed at {found.step}")
"""


def test_40_2_saves_back_to_back_never_lose_a_part_to_the_prune(tmp_path):
    (tmp_path / "saves.py").write_text(SAVES)
    res = fluidctl("train", "--nproc", 2, "--log-dir", tmp_path / "log", "--tee", "all",
                   tmp_path / "saves.py", tmp_path / "ck", 100, cwd=tmp_path, timeout=300)
    logs = "".join((tmp_path / "log" / f"workerlog.{r}").read_text() for r in range(2))
    assert res.returncode == 0, logs + res.stderr
    assert "rank 0 resumed at 99" in logs and "rank 1 resumed at 99" in logs
    assert sorted(p.name for p in (tmp_path / "ck").iterdir()) == ["step-000000099"]
