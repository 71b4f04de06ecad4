"""Elastic membership's pure half (planning/elastic.py), its option (--nodes MIN:MAX, one line
and exit 2 for every mistake), the agent records it adds and the restart counts of the
contract."""
import pytest

from fluidctl import cli, envs
from fluidctl.agentproto import NodeShare
from fluidctl.errors import UsageError
from fluidctl.planning.elastic import NodeRange, next_world, parse_nodes
from fluidctl.planning.plan import with_restart


def test_nodes_is_a_count_or_a_range():
    assert parse_nodes("4") == 4
    assert parse_nodes("2:4") == NodeRange(2, 4) and str(NodeRange(2, 4)) == "2:4"
    for bad in ("0", "x", "3:2", "0:2", "a:b", "2:"):
        with pytest.raises(UsageError):
            parse_nodes(bad)


def test_the_next_world_keeps_survivors_then_takes_spares_up_to_max():
    pool = ["n1", "n2", "n3", "n4", "n5"]
    rng = NodeRange(2, 3)
    assert next_world([], pool, (), (), rng) == ["n1", "n2", "n3"]
    assert next_world(["n1", "n2", "n3"], pool, {"n1"}, (), rng) == ["n2", "n3", "n4"]
    # a ledgered spare is skipped; two lost at once
    assert next_world(["n1", "n2", "n3"], pool, {"n1", "n2"}, {"n4"}, rng) == ["n3", "n5"]
    # below MIN is the caller's to report
    assert next_world(["n1", "n2"], ["n1", "n2"], {"n1"}, (), rng) == ["n2"]


def test_a_node_share_carries_the_heartbeat_period():
    share = NodeShare([], "/logs", "n1", attempt=2, beat=0.5)
    back = NodeShare.from_wire(share.to_wire())
    assert back.beat == 0.5 and back.attempt == 2
    assert NodeShare.from_wire(NodeShare([], "/l", "n1").to_wire()).beat == 0.0


def test_a_restart_counts_in_paddle_s_and_torch_s_names():
    env = envs.collective_env(rank=0, world_size=1, local_rank=0, local_size=1, nnodes=1,
                              endpoints=["127.0.0.1:6170"], master="127.0.0.1:6170")
    assert env[envs.RESTART_COUNT] == env[envs.TORCH_RESTART_COUNT] == "0"
    again = with_restart(env, 3)
    assert again["PADDLE_RESTART_COUNT"] == again["TORCHELASTIC_RESTART_COUNT"] == "3"


@pytest.mark.parametrize("argv, words", [
    (["--nodes", "2:4", "--nproc", "1"], "needs --backend ssh or fabric"),
    (["--nodes", "3:2", "--hosts", "a,b", "--backend", "ssh"], "MIN must be at least 1"),
    (["--nodes", "3:4", "--hosts", "a,b", "--backend", "ssh"], "name 2 node(s)"),
    (["--nodes", "1:2", "--hosts", "a,b", "--backend", "ssh", "--mode", "pserver"],
     "needs --mode collective"),
    (["--nodes", "1:2", "--backend", "slurm"], "is for --backend ssh or fabric"),
])
def test_bad_ranges_are_one_line(tmp_path, capsys, argv, words):
    script = tmp_path / "t.py"
    script.write_text("pass\n")
    with pytest.raises(SystemExit) as done:
        cli.main(["train", *argv, str(script)])
    assert done.value.code == 2
    err = capsys.readouterr().err
    assert words in err and "Traceback" not in err and len(err.strip().splitlines()) == 1, err
