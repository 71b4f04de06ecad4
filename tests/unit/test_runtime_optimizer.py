"""DistributedOptimizer: data-parallel training equals single-process full-batch training, in
both reduce strategies and both float dtypes; one process works without any environment; in
pserver mode the same API drives parameter servers."""
import numpy as np
import pytest

import fluidctl.runtime as rt
import rankspawn
from fluidctl import envs
from fluidctl.runtime.distributed_optimizer import DistributeStrategy, DistributedOptimizer

WORKER = "tests/runtime_worker.py"


@pytest.fixture
def single_ctx():
    ctx = rt.init(environ={})
    yield ctx
    rt.finalize()


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


def test_one_process_without_environment(single_ctx):
    assert (single_ctx.world_size, single_ctx.mode, single_ctx.transport) == (1, "single", "single")
    x = np.arange(3.0)
    assert single_ctx.allreduce(x, "mean") is x and x.tolist() == [0, 1, 2]
    assert single_ctx.allgather(x).shape == (1, 3)
    single_ctx.barrier()
    params = {"w": np.ones(4, np.float32), "b": np.zeros(2, np.float64)}
    opt = rt.DistributedOptimizer(params, optimizer=rt.optim.Adam(lr=0.1))
    opt.step({"w": np.ones(4, np.float32), "b": np.ones(2, np.float64)})
    assert params["w"].dtype == np.float32 and params["b"].dtype == np.float64
    assert np.allclose(params["w"], 0.9) and np.allclose(params["b"], -0.1)
    with pytest.raises(KeyError, match="no gradient for b"):
        opt.step({"w": np.ones(4, np.float32)})
    with pytest.raises(ValueError, match="shape"):
        opt.step({"w": np.ones(5, np.float32), "b": np.ones(2)})


def test_gradients_are_fused_into_few_buckets(single_ctx):
    params = {f"p{i}": np.zeros(256, np.float32) for i in range(100)}
    params["d"] = np.zeros(8, np.float64)
    fused = DistributedOptimizer(params, rt.optim.SGD(lr=1.0))
    assert len(fused._buckets) == 2                      # one per dtype
    small = DistributedOptimizer(params, rt.optim.SGD(lr=1.0),
                                 DistributeStrategy(fuse_grad_size_mb=10 * 1024 / 2**20))
    assert len(small._buckets) == 10 + 1                 # 10 KiB buckets of 1 KiB params
    unfused = DistributedOptimizer(params, rt.optim.SGD(lr=1.0),
                                   DistributeStrategy(fuse_all_reduce_ops=False))
    assert len(unfused._buckets) == 101
    grads = {k: np.full(v.shape, 2.0, v.dtype) for k, v in params.items()}
    fused.step(grads)
    assert all(np.all(v == -2.0) for v in params.values())


def test_strategy_validation():
    assert DistributeStrategy(reduce_strategy="reduce").reduce_strategy == "Reduce"
    with pytest.raises(ValueError, match="AllReduce, Reduce"):
        DistributeStrategy(reduce_strategy="AllGather")
    with pytest.raises(ValueError, match="positive"):
        DistributeStrategy(fuse_grad_size_mb=0)
    with pytest.raises(TypeError, match="floating-point"):
        DistributedOptimizer({"i": np.zeros(3, np.int32)}, ctx=rt.init(environ={}))
    rt.finalize()


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
