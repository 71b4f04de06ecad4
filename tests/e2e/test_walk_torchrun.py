"""A fluidctl.runtime script started by torchrun itself (docs/runtime.md names it): no
FLUIDCTL_JOB_TOKEN, and MASTER_PORT is already served by torchrun's agent store. The ranks
agree on a token and on fluidctl's store through torchrun's store (see
runtime/collective/torchrun.py), and the same script also calls torch.distributed."""
import importlib.util
import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.skipif(importlib.util.find_spec("torch") is None,
                                reason="torch not installed")

SCRIPT = """\
import torch, torch.distributed as dist
import fluidctl.runtime as rt
ctx = rt.init(timeout=120)
total = ctx.allreduce(torch.ones(3).numpy() * (ctx.rank + 1))
dist.init_process_group("gloo")
t = torch.tensor([float(ctx.rank + 1)])
dist.all_reduce(t)
print(f"rank {ctx.rank}/{ctx.world_size} fluidctl {total.tolist()} torch {t.item()}", flush=True)
dist.destroy_process_group()
ctx.close()
"""


def torchrun(tmp_path, **extra):
    (tmp_path / "both.py").write_text(SCRIPT)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("FLUIDCTL_", "PADDLE_"))
           and k not in ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE")}
    env.update(extra)
    return subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                           "--nproc_per_node", "2", "both.py"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize("token", [None, "a-token-every-rank-was-given"])
def test_a_runtime_script_runs_under_torchrun(tmp_path, token):
    res = torchrun(tmp_path, **({"FLUIDCTL_JOB_TOKEN": token} if token else {}))
    out = res.stdout + res.stderr
    # torch's gloo may abort in its exit handlers after the script ended (torch_exit_ok)
    assert res.returncode == 0 or "terminate called without an active exception" in out, out
    for rank in (0, 1):
        assert f"rank {rank}/2 fluidctl [3.0, 3.0, 3.0] torch 3.0" in res.stdout, out
