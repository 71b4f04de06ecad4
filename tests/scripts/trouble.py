"""A job that goes wrong in the way a test asks: trouble.py SCENARIO [ARG].

stuck     rank 0 waits in an allreduce rank 1 never joins (rank 1 is in load_batch)
raise     rank 1 raises ValueError; the others wait
segv      rank 1 dies of SIGSEGV; the others wait
oom DIR   rank 1 moves itself into the memory cgroup DIR and allocates until killed
progress  every rank draws a progress bar with carriage returns, then prints "done"
wait      every rank prints "ready" and waits (for fluidctl dump)
busy S    allreduce for S seconds without printing anything
spin      rank 1 computes forever (a busy loop in its own code); the others wait
stop      rank 1 stops itself (SIGSTOP); the others wait
skip      rank 1 skips the allreduce the others wait in and idles
desync    rank 1 calls broadcast where the others call allreduce
mismatch  rank 1 passes 5 elements where the others pass 4
compute   no fault: every rank computes for 10 s without a word or a collective, then ends
"""
import os
import signal
import sys
import time

import numpy as np

import fluidctl.runtime as rt


def load_batch():
    time.sleep(3600)                  # a data loader that never returns


def idle():
    while True:
        time.sleep(0.5)


def spin():
    n = 0
    while True:                       # a step that never ends
        n += 1


scenario = sys.argv[1]
ctx = rt.init()
x = np.ones(4, np.float32)
ctx.allreduce(x)
print(f"rank {ctx.rank} ready", flush=True)
if scenario == "stuck":
    if ctx.rank == 1:
        load_batch()
    ctx.allreduce(x)  # stuck
elif scenario == "raise":
    if ctx.rank == 1:
        raise ValueError("shard 1 has 0 records")
    idle()
elif scenario == "segv":
    if ctx.rank == 1:
        os.kill(os.getpid(), signal.SIGSEGV)
    idle()
elif scenario == "oom":
    if ctx.rank == 1:
        with open(os.path.join(sys.argv[2], "cgroup.procs"), "w") as f:
            f.write(str(os.getpid()))
        hog = []
        while True:
            hog.append(np.ones(1 << 20))      # 8 MiB at a time, touched
    idle()
elif scenario == "progress":
    for i in range(1, 6):
        print(f"\rstep {i}/5", end="", flush=True)
    print("\ndone", flush=True)
elif scenario == "busy":
    end = time.monotonic() + float(sys.argv[2])
    go = np.ones(1)
    while go[0]:                          # rank 0 decides for all, so all stop together
        go[0] = time.monotonic() < end
        ctx.broadcast(go, root=0)
        time.sleep(0.05)
elif scenario == "wait":
    idle()
elif scenario in ("spin", "stop", "skip"):
    if ctx.rank == 1:
        {"spin": spin, "skip": idle,
         "stop": lambda: os.kill(os.getpid(), signal.SIGSTOP)}[scenario]()
    ctx.allreduce(x)  # waits
elif scenario == "desync":
    if ctx.rank == 1:
        ctx.broadcast(x)  # the odd one
    ctx.allreduce(x)
elif scenario == "mismatch":
    ctx.allreduce(np.ones(5 if ctx.rank == 1 else 4, np.float32))  # mismatched
elif scenario == "compute":
    end = time.monotonic() + 10
    while time.monotonic() < end:         # a long silent step on every rank
        pass
