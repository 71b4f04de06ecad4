"""A script that imports nothing of fluidctl and hangs: rank 1 in its data loader, the others idle.

    plain_hang.py
"""
import os
import time

rank = int(os.environ["RANK"])
print(f"rank {rank} ready", flush=True)


def read_batch():
    time.sleep(3600)                  # storage that never answers


def wait_for_rank_1():
    while True:
        time.sleep(0.5)


if rank == 1:
    read_batch()
wait_for_rank_1()
