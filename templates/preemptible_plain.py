"""The same pattern for a script that does not import fluidctl (torch DDP, Paddle, ...).

    fluidctl train --nproc 2 templates/preemptible_plain.py
    fluidctl train --nproc 2 --checkpoint-signal USR2 templates/preemptible_plain.py

On a checkpoint request fluidctl sends every rank --checkpoint-signal (SIGTERM by default) and
waits the whole --grace-period (never shortened) before SIGKILL; it also creates the file
named by $FLUIDCTL_CHECKPOINT_REQUEST, which a script can poll instead (``fluidctl job
checkpoint JOB`` writes only the file; its first word is ``save`` or ``stop``). Ranks see a
signal at slightly different moments: with torch, agree before saving, e.g.
``flag = torch.tensor([stop]); dist.all_reduce(flag, op=dist.ReduceOp.MAX)`` each step, so
every rank saves the same step (fluidctl.runtime's ``checkpoint_requested`` does this for you).
Save to a temporary name, fsync, rename: a checkpoint cut short must never be the one resumed.
"""
import os
import pickle
import signal
import time

stop = False


def on_request(signum, frame):
    global stop
    stop = True


signal.signal(signal.SIGTERM, on_request)          # --checkpoint-signal (default TERM)
signal.signal(signal.SIGUSR2, on_request)
REQUEST = os.environ.get("FLUIDCTL_CHECKPOINT_REQUEST", "")
RANK = int(os.environ.get("RANK", "0"))
PATH = f"ckpt-plain.{RANK}.pkl"


def save(state):
    tmp = PATH + ".tmp"
    with open(tmp, "wb") as f:
        pickle.dump(state, f)             # torch.save(model.state_dict(), f) with torch
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, PATH)


state = {"step": 0}
if os.path.exists(PATH):
    with open(PATH, "rb") as f:
        state = pickle.load(f)
    print(f"rank {RANK}: resumed at step {state['step']}", flush=True)
while state["step"] < 200:
    time.sleep(0.05)                      # a training step
    state["step"] += 1
    if stop or (REQUEST and os.path.exists(REQUEST)):
        save(state)
        print(f"rank {RANK}: saved step {state['step']} on request", flush=True)
        break
