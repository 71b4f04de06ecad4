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


JOINER = """
import json, numpy
from fluidctl import runtime
ctx = runtime.init(timeout=60)
total = ctx.allreduce(numpy.array([float(ctx.env.rank)]))
joins = ctx._server.requests.get("join") if ctx._server else None
print(json.dumps({"rank": ctx.env.rank, "sum": float(total[0]), "joins": joins,
                  "through_agent": bool(ctx.env.node_join),
                  "leads_ring": ctx.comm.ring is not None,
                  "node": sorted(ctx.env.node_endpoints)}))
runtime.finalize()
"""


def test_ranks_with_only_their_nodes_file_meet_and_reduce_across_nodes(tmp_path):
    """Two nodes (127.0.0.1, 127.0.0.2) of two ranks, planned as a job above the bound is:
    no endpoint list in any environment. Each node's ranks are started as its agent starts
    them, with a diagnostics directory of its own; they find their node's endpoints in the
    file, elect the node's lowest rank to the ring between nodes and reduce."""
    from fluidctl.net import free_port
    script = tmp_path / "joiner.py"
    script.write_text(JOINER)
    cfg = LaunchConfig(script=str(script), token="t" * 32, python=sys.executable,
                       log_dir=str(tmp_path / "log"), backend="ssh")
    nodes = [planner.remote_node(f"n{i}", f"127.0.0.{1 + i}", None, 2, None, [], 0)
             for i in range(2)]
    spec = cfg.job(nodes, multi_node_logs=True)
    ports = {i: [free_port(f"127.0.0.{1 + i}") for _ in range(3)] for i in range(2)}
    plan = planner.make_plan(spec, ports, backend="ssh")
    for proc in plan.procs:                     # what the planner leaves out above the bound
        proc.env.pop(envs.TRAINER_ENDPOINTS)
        Path(proc.log).parent.mkdir(parents=True, exist_ok=True)
    handles = []
    try:
        for node in range(2):
            diag = tmp_path / f"diag{node}"
            diag.mkdir()
            handles += start_procs(plan.on_node(node), 0, extra_env={envs.DIAG_DIR: str(diag)})
        codes = [h.popen.wait(120) for h in handles]
    finally:
        for h in handles:
            if h.popen.poll() is None:
                h.kill()
                h.popen.wait()
            h.close()
    logs = [Path(p.log).read_text() for p in plan.procs]
    assert codes == [0] * 4, [log[-600:] for log in logs]
    seen = [json.loads(log.strip().splitlines()[-1]) for log in logs]
    assert [s["sum"] for s in seen] == [6.0] * 4
    assert [s["leads_ring"] for s in seen] == [True, False, True, False]
    assert [s["node"] for s in seen] == [[0, 1], [0, 1], [2, 3], [2, 3]]
    # the node agent is the unit of rendezvous: one join per node reached rank 0's store
    assert all(s["through_agent"] for s in seen)
    assert seen[0]["joins"] == 2


def _start_node(tmp_path, script_text, nproc, user_env=()):
    from fluidctl.net import free_port
    script = tmp_path / "script.py"
    script.write_text(script_text)
    cfg = LaunchConfig(script=str(script), token="t" * 32, python=sys.executable,
                       log_dir=str(tmp_path / "log"), backend="ssh")
    spec = cfg.job([planner.remote_node("n0", "127.0.0.1", None, nproc, None, [], 0)],
                   multi_node_logs=True)
    spec.user_env = dict(user_env)
    plan = planner.make_plan(spec, {0: [free_port() for _ in range(nproc + 1)]}, backend="ssh")
    for proc in plan.procs:
        Path(proc.log).parent.mkdir(parents=True, exist_ok=True)
    diag = tmp_path / "diag"
    diag.mkdir()
    return plan, start_procs(plan.procs, 0, extra_env={envs.DIAG_DIR: str(diag)})


def test_a_rank_that_never_joins_its_node_is_named_by_the_others(tmp_path):
    """Through the node agent's join, a rank that exits before it joins is named, with its
    endpoint, by the ranks that did, within FLUIDCTL_TIMEOUT."""
    plan, handles = _start_node(tmp_path, """
import os, sys
if os.environ["PADDLE_TRAINER_ID"] == "2":
    sys.exit(0)
from fluidctl import runtime
runtime.init()
""", 3, {envs.TIMEOUT: "3"})
    try:
        codes = [h.popen.wait(60) for h in handles]
    finally:
        for h in handles:
            h.close()
    logs = [Path(p.log).read_text() for p in plan.procs]
    assert codes == [1, 1, 0], logs
    for log in logs[:2]:
        assert f"rank 2 ({plan.trainer_endpoints[2]}) did not join within 3s" in log, log


def test_dry_run_of_8000_local_ranks_shows_no_environment_string_over_the_bound(tmp_path):
    from launchutil import fluidctl
    (tmp_path / "noop.py").write_text("pass\n")
    res = fluidctl("train", "--nproc", 8000, "--dry-run", "--json", "noop.py", cwd=tmp_path,
                   timeout=300, check=0)
    procs = json.loads(res.stdout)["procs"]
    assert len(procs) == 8000
    assert max(len(v) for p in procs for v in p["env"].values()) <= envs.ENV_BOUND
    assert not any(envs.TRAINER_ENDPOINTS in p["env"] for p in procs)
    small = json.loads(fluidctl("train", "--nproc", 4, "--dry-run", "--json", "noop.py",
                                cwd=tmp_path, check=0).stdout)["procs"]
    assert all(p["env"][envs.TRAINER_ENDPOINTS].count(",") == 3 for p in small)
