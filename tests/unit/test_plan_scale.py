"""make_plan stays O(N): the job-wide strings every rank repeats are built once per plan and
shared, not rebuilt per rank (which made 8,000 ranks take minutes and hold N copies)."""
import sys
from pathlib import Path

from fluidctl import envs

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
from plan_scale import build  # noqa: E402

from fluidctl.planning import plan as planner  # noqa: E402


def test_a_2000_rank_plan_shares_one_endpoints_and_one_device_string():
    spec, ports = build(250, 8)
    plan = planner.make_plan(spec, ports, backend="ssh")
    assert len(plan.procs) == 2000
    first = plan.procs[0].env
    assert first[envs.TRAINER_ENDPOINTS] == ",".join(plan.trainer_endpoints)
    assert first[envs.WORLD_DEVICE_IDS] == envs.world_device_list(
        [n.gpus for n in spec.nodes])
    for proc in plan.procs:
        assert proc.env[envs.TRAINER_ENDPOINTS] is first[envs.TRAINER_ENDPOINTS]
        assert proc.env[envs.WORLD_DEVICE_IDS] is first[envs.WORLD_DEVICE_IDS]
    assert plan.procs[1234].env[envs.CURRENT_ENDPOINT] == plan.trainer_endpoints[1234]
