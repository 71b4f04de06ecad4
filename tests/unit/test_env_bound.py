"""Guards: nothing a rank's environment or its node's share of the plan holds grows with the
world beyond envs.ENV_BOUND (64 KiB). Above it the world's lists are left out and each node's
ranks read their node's endpoints from FLUIDCTL_ENDPOINTS_FILE; below it they are there, as
unmodified Paddle scripts read them."""
import sys
from pathlib import Path

from hypothesis import given, settings, strategies as st

from fluidctl import envs
from fluidctl.agentproto import NodeShare
from fluidctl.planning import plan as planner

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
from plan_scale import build  # noqa: E402


def node_share(plan, node: int) -> NodeShare:
    return NodeShare([p.to_json() for p in plan.on_node(node)], "log", f"n{node}")


@settings(max_examples=8, deadline=None)
@given(n_nodes=st.integers(1, 1400), gpus=st.sampled_from([1, 8]))
def test_env_strings_and_node_shares_stay_bounded_as_the_world_grows(n_nodes, gpus):
    spec, ports = build(n_nodes, gpus)
    plan = planner.make_plan(spec, ports, backend="ssh")
    listed = len(",".join(plan.trainer_endpoints)) <= envs.ENV_BOUND
    last = len(spec.nodes) - 1
    for proc in plan.on_node(0) + plan.on_node(last):
        assert max(len(v) for v in proc.env.values()) <= envs.ENV_BOUND
        assert (envs.TRAINER_ENDPOINTS in proc.env) == listed
        if listed:                               # Paddle scripts read these unchanged
            assert proc.env[envs.TRAINER_ENDPOINTS] == ",".join(plan.trainer_endpoints)
            assert proc.env[envs.WORLD_DEVICE_IDS] == envs.world_device_list(
                [n.gpus for n in spec.nodes])
    for node in (0, last):
        share = node_share(plan, node)
        wire = share.to_wire()
        record = share.to_record()
        own = len(wire) - sum(len(v) for v in record["shared_env"].values())
        assert own <= envs.ENV_BOUND                      # what grows with the node alone
        assert all(len(v) <= envs.ENV_BOUND for v in record["shared_env"].values())
        if not listed:
            assert len(wire) <= envs.ENV_BOUND
        assert NodeShare.from_wire(wire).procs == share.procs    # the agent gets it all back


def test_above_the_bound_the_lists_are_left_out_and_below_they_are_whole():
    eps = [f"10.1.{i // 250}.{i % 250}:7000" for i in range(8000)]
    world = envs.world_strings(eps, [["0"] * 8] * 1000)
    assert world.trainer_endpoints is None and not world.listed
    assert world.world_devices == ",".join(["0"] * 8000)          # 16 KB: still listed
    small = envs.world_strings(eps[:100], [["0"]] * 100)
    assert small.trainer_endpoints == ",".join(eps[:100])


def test_a_worker_under_srun_in_a_9000_task_step_gets_a_bounded_environment():
    environ = {"SLURM_JOB_ID": "7", "SLURM_STEP_ID": "0", "SLURM_PROCID": "8",
               "SLURM_LOCALID": "0", "SLURM_NODEID": "1", "SLURM_NTASKS": "9000",
               "SLURM_STEP_NODELIST": "node[0000-1124]",
               "SLURM_STEP_TASKS_PER_NODE": "8(x1125)", "FLUIDCTL_JOB_TOKEN": "t"}
    env = envs.from_slurm(environ)
    assert envs.TRAINER_ENDPOINTS not in env
    assert max(len(v) for v in env.values()) <= envs.ENV_BOUND
    node = envs.slurm_node_endpoints(environ)
    assert sorted(node) == list(range(8, 16))
    assert node[8] == env[envs.CURRENT_ENDPOINT]


def test_the_runtime_reads_its_nodes_endpoints_file(tmp_path):
    path = tmp_path / "endpoints.3"
    path.write_text(envs.endpoints_file_text({25: "10.0.0.4:7001", 24: "10.0.0.4:7000"}))
    env = envs.read({envs.TRAINER_ID: "25", envs.TRAINERS_NUM: "9000", envs.NNODES: "1125",
                     envs.ENDPOINTS_FILE: str(path)})
    assert env.trainer_endpoints == [] and env.planned_endpoints
    assert dict(env.node_endpoints) == {24: "10.0.0.4:7000", 25: "10.0.0.4:7001"}
    assert env.endpoint_of(24) == "10.0.0.4:7000" and env.endpoint_of(3) == ""
    from fluidctl.runtime.collective.bootstrap import _may_lead_a_ring
    assert not _may_lead_a_ring(env, "auto")
    assert _may_lead_a_ring(env._replace(rank=24), "auto")
