"""No rank's environment holds a string that grows with the world beyond envs.ENV_BOUND
(64 KiB): execve refuses any one string over 128 KiB (E2BIG), which a 9,000-rank job's
PADDLE_TRAINER_ENDPOINTS is. The ranks of one node of such a plan are started for real (the
starter the local launcher, the node agent and a Kubernetes pod share) and find their node's
endpoints in the file FLUIDCTL_ENDPOINTS_FILE names, through fluidctl.runtime's reader."""
import json
import sys
from pathlib import Path

from fluidctl import envs
from fluidctl.paths import DiagDir
from fluidctl.planning import plan as planner
from fluidctl.planning.config import LaunchConfig
from fluidctl.procs.local import start_procs

READER = """
import json, os, sys
from fluidctl import envs
env = envs.read()
print(json.dumps({"world": env.world_size, "rank": env.rank,
                  "listed": envs.TRAINER_ENDPOINTS in os.environ,
                  "node": {str(r): ep for r, ep in env.node_endpoints.items()},
                  "largest": max(len(v) for v in os.environ.values())}))
"""


def big_plan(tmp_path, n_nodes=1125, gpus=8):
    script = tmp_path / "reader.py"
    script.write_text(READER)
    cfg = LaunchConfig(script=str(script), token="t", python=sys.executable,
                       log_dir=str(tmp_path / "log"), backend="ssh")
    nodes = [planner.remote_node(f"n{i}", f"198.18.{i // 250}.{1 + i % 250}", None, None, None,
                                 [str(g) for g in range(gpus)], 0) for i in range(n_nodes)]
    spec = cfg.job(nodes, multi_node_logs=True)
    ports = {i: list(range(7000, 7001 + gpus)) for i in range(n_nodes)}
    return planner.make_plan(spec, ports, backend="ssh")


def test_a_9000_rank_plans_node_starts_and_its_ranks_read_their_node_file(tmp_path):
    plan = big_plan(tmp_path)
    assert len(",".join(plan.trainer_endpoints)) > 128 << 10     # what execve would refuse
    node1 = plan.on_node(1)
    for proc in node1:
        Path(proc.log).parent.mkdir(parents=True, exist_ok=True)
    diag = DiagDir(tmp_path / "diag")
    diag.root.mkdir()
    handles = start_procs(node1, 0, extra_env={envs.DIAG_DIR: str(diag.root)})
    try:
        codes = [h.popen.wait(60) for h in handles]
    finally:
        for h in handles:
            h.close()
    seen = [json.loads(Path(p.log).read_text().strip().splitlines()[-1]) for p in node1]
    assert codes == [0] * 8, [Path(p.log).read_text()[-400:] for p in node1]
    expected = {str(p.rank): p.endpoint for p in node1}
    for proc, got in zip(node1, seen):
        assert got["rank"] == proc.rank and got["world"] == 9000
        assert not got["listed"] and got["largest"] <= envs.ENV_BOUND
        assert got["node"] == expected
