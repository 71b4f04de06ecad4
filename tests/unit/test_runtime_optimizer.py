"""DistributedOptimizer in one process: it works without any environment, fuses gradients into
few buckets and validates its strategy. Across real ranks and parameter servers:
tests/e2e/test_runtime_optimizer_ranks.py."""
import numpy as np
import pytest

import fluidctl.runtime as rt
from fluidctl.runtime.distributed_optimizer import DistributeStrategy, DistributedOptimizer


@pytest.fixture
def single_ctx():
    ctx = rt.init(environ={})
    yield ctx
    rt.finalize()


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


