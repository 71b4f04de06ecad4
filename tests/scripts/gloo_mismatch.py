"""An unmodified script whose rank 1 all_reduces 1024 floats while the others all_reduce 512,
over gloo on CPU: gloo_mismatch.py torch|paddle. gloo does not hang on it: the rank that
receives the odd message aborts ("op.preamble.length <= op.nbytes. 1024 vs 512")."""
import sys

if sys.argv[1] == "torch":
    import torch
    import torch.distributed as dist
    dist.init_process_group("gloo")
    dist.all_reduce(torch.ones(1024 if dist.get_rank() == 1 else 512))     # mismatched
    dist.destroy_process_group()
else:
    import paddle
    import paddle.distributed as dist
    paddle.set_device("cpu")
    dist.init_parallel_env()
    dist.all_reduce(paddle.ones([1024 if dist.get_rank() == 1 else 512]))  # mismatched
