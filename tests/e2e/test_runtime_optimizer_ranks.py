"""DistributedOptimizer across real rank processes: data parallel equals the full batch, different
models are refused on every rank, and pserver mode delegates to real parameter servers."""
import numpy as np
import pytest

import fluidctl.runtime as rt
from fluidctl import envs

import rankspawn

WORKER = "tests/runtime_worker.py"


@pytest.mark.parametrize("hosts", [["127.0.0.1"] * 2, ["127.0.0.1", "127.0.0.1", "127.0.0.2"]],
                         ids=["2-ranks-shm", "3-ranks-hierarchical"])
def test_data_parallel_equals_full_batch(hosts, tmp_path):
    result = rankspawn.run([WORKER, "sgd"], len(hosts), tmp_path, hosts=hosts)
    assert result.ok(), result
    for per_rank in rankspawn.results(result):
        assert set(per_rank) == {f"{s}_{d}" for s in ("AllReduce", "Reduce")
                                 for d in ("float32", "float64")}
        for case, got in per_rank.items():
            assert got["rel"] < 1e-6, (case, got)
            assert got["dtype"] == case.split("_")[1]


def test_different_models_are_refused_on_every_rank(tmp_path):
    result = rankspawn.run([WORKER, "mismatch_params"], 2, tmp_path)
    assert result.ok(), result
    for per_rank in rankspawn.results(result):
        assert "rank(s) 1 hold different parameters" in per_rank["error"]


def test_pserver_mode_delegates_to_the_parameter_servers(tmp_path):
    import pserverutil as local
    port, = local.free_ports(1)
    endpoint = f"127.0.0.1:{port}"
    proc = local.start_pserver(0, [endpoint], trainers=1, token="tok",
                               log_path=str(tmp_path / "pserver.log"), args=["--no-state"])
    try:
        environ = envs.pserver_env(role=envs.ROLE_TRAINER, index=0, trainers=1,
                                   pserver_endpoints=[endpoint], token="tok")
        ctx = rt.init(environ=environ)
        assert ctx.mode == "pserver" and ctx.transport == "none"
        with pytest.raises(rt.CollectiveError, match="not available in pserver mode"):
            ctx.allreduce(np.zeros(2))
        params = {"w": np.ones(3, np.float32)}
        opt = rt.DistributedOptimizer(params, optimizer=rt.optim.SGD(lr=0.5),
                                      strategy=rt.DistributeStrategy(min_block_size=1))
        assert type(opt._pserver).__name__ == "PServerOptimizer"
        assert opt.step({"w": np.ones(3, np.float32)}) == 1
        assert np.allclose(params["w"], 0.5)
        assert opt.step_count == 1                 # the pservers' step, not a stale 0
        opt.close()
    finally:
        rt.finalize()
        assert local.stop([proc]) == [0]
