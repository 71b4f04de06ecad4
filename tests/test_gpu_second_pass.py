"""Issue 26, "GPU path, second pass": one test (or a few) per defect, each failing on the code
before its fix. GPU parts run against the strict CuPy/NCCL double (tests/cupy_double)."""
import os
import subprocess
import sys
import textwrap

import pytest

import launchutil

ROOT = str(launchutil.ROOT)


# --- 1: torch and fluidctl's runtime in one script ------------------------------------------
TORCH_AND_FLUIDCTL = textwrap.dedent("""
    import os
    import fluidctl.runtime as rt
    ctx = rt.init()
    import torch
    import torch.distributed as dist
    dist.init_process_group("gloo")              # env:// : MASTER_ADDR / MASTER_PORT
    t = torch.ones(4) * (ctx.rank + 1)
    dist.all_reduce(t)
    x = __import__("numpy").ones(4) * (ctx.rank + 1)
    ctx.allreduce(x)
    print("RESULT", ctx.rank, t.tolist(), x.tolist(), os.environ["MASTER_PORT"],
          os.environ["PADDLE_MASTER"], flush=True)
    dist.destroy_process_group()
    rt.finalize()
""")


def test_torch_process_group_beside_fluidctl_runtime_under_train(tmp_path):
    pytest.importorskip("torch")
    script = tmp_path / "both.py"
    script.write_text(TORCH_AND_FLUIDCTL)
    res = launchutil.fluidctl("train", "--nproc", "2", "--tee", "all", "--log-dir",
                              tmp_path / "log", script, cwd=tmp_path,
                              env={"GLOO_SOCKET_IFNAME": "lo"}, timeout=180)
    assert res.returncode == 0, res.stdout + res.stderr
    lines = [l.split("RESULT", 1)[1].split() for l in res.stdout.splitlines() if "RESULT" in l]
    assert len(lines) == 2, res.stdout
    for words in lines:
        assert "[3.0," in "".join(words)
        torch_port, master = int(words[-2]), words[-1]
        assert torch_port != int(master.rsplit(":", 1)[1])   # torch got its own port
    assert lines[0][-2] == lines[1][-2]                       # the same one on every rank
