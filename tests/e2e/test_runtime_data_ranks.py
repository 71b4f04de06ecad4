"""Shard readers in real trainer processes: each rank reads its own disjoint shards."""
import os
import subprocess
import sys

import pytest

from fluidctl import envs
from shardutil import four_shards


@pytest.fixture
def shards(tmp_path):
    return four_shards(tmp_path)


def test_trainers_read_disjoint_shards_as_real_processes(shards):
    """Two processes with the launcher's environment (collective_env), as fluidctl train sets it."""
    script = ("import sys; from fluidctl.runtime.data import ShardReader\n"
              "assert 'click' not in sys.modules and 'rich' not in sys.modules\n"
              "print('\\n'.join(r for b in ShardReader(sys.argv[1], 8) for r in b))\n")
    collected = []
    for rank in range(4):
        env = dict(os.environ)
        env.update(envs.collective_env(rank=rank, world_size=4, local_rank=rank, local_size=4,
                                       nnodes=1, endpoints=[f"127.0.0.1:{7000 + i}" for i in range(4)],
                                       master="127.0.0.1:7000"))
        out = subprocess.run([sys.executable, "-c", script, str(shards)], env=env,
                             capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stderr
        collected.append(out.stdout.splitlines())
    assert [r for part in collected for r in part] == [f"line {i}" for i in range(103)]
    assert all(collected)
