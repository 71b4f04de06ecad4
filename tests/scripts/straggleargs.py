"""The options of straggle.py, straggle_torch.py and straggle_paddle.py (the same loop on three
runtimes)."""
import argparse


def parse():
    """(args, (slow rank, its loader's sleep in ms, from which step)); args.slow_compute is
    (rank, extra ms of CPU work per step, from which step)."""
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=1000)
    p.add_argument("--work", type=float, default=20.0, help="milliseconds of CPU work per step")
    p.add_argument("--floats", type=int, default=1024, help="gradient size")
    p.add_argument("--slow-data", default="", help="RANK:MS:FROM_STEP: that rank's loader sleeps")
    p.add_argument("--slow-compute", default="",
                   help="RANK:MS:FROM_STEP: that rank computes MS more per step")
    p.add_argument("--stop-file", default="STOP")
    args = p.parse_args()
    slow = tuple(map(float, args.slow_data.split(":"))) if args.slow_data else (-1, 0, 0)
    args.slow_compute = (tuple(map(float, args.slow_compute.split(":")))
                         if args.slow_compute else (-1, 0, 0))
    return args, slow
