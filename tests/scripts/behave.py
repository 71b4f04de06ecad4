"""A worker whose behaviour tests choose via arguments, to exercise supervision.

    behave.py [--fail-rank R --code C] [--die-signal R:SIG] [--hang] [--grandchild]
              [--ignore-term] [--pidfile DIR] [--lines N] [--fail-until-restart K]
              [--env-dump DIR]
Every rank writes its pid (and its grandchild's) to DIR/<rank>.pids, then a 'ready' line.
"""
import argparse
import json
import os
import signal
import subprocess
import sys
import time

p = argparse.ArgumentParser()
p.add_argument("--fail-rank", type=int, default=-1)
p.add_argument("--code", type=int, default=3)
p.add_argument("--die-signal", default="")
p.add_argument("--hang", action="store_true")
p.add_argument("--grandchild", action="store_true")
p.add_argument("--ignore-term", action="store_true")
p.add_argument("--pidfile", default="")
p.add_argument("--lines", type=int, default=0)
p.add_argument("--fail-until-restart", type=int, default=-1)
p.add_argument("--env-dump", default="")
p.add_argument("--wait-file", default="")
args, rest = p.parse_known_args()

rank = int(os.environ.get("PADDLE_TRAINER_ID", "0"))
restart = int(os.environ.get("PADDLE_RESTART_COUNT", "0"))
if args.ignore_term:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
pids = [os.getpid()]
if args.grandchild:
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    pids.append(child.pid)
if args.env_dump:
    with open(os.path.join(args.env_dump, f"env.{rank}.json"), "w") as f:
        json.dump({"env": dict(os.environ), "argv": sys.argv[1:], "rest": rest}, f)
if args.pidfile:
    tmp = os.path.join(args.pidfile, f".{rank}.tmp")
    with open(tmp, "w") as f:
        f.write(" ".join(map(str, pids)))
    os.replace(tmp, os.path.join(args.pidfile, f"{rank}.pids"))
for i in range(args.lines):
    print(f"rank {rank} line {i} " + "x" * 60)
print(f"rank {rank} ready restart {restart}", flush=True)
print(f"rank {rank} to stderr", file=sys.stderr, flush=True)
if args.wait_file:
    while not os.path.exists(args.wait_file):
        time.sleep(0.01)
if args.fail_until_restart >= 0 and restart < args.fail_until_restart and rank == 1:
    sys.exit(7)
if rank == args.fail_rank:
    print(f"rank {rank} failing with {args.code}", flush=True)
    sys.exit(args.code)
if args.die_signal:
    r, sig = args.die_signal.split(":")
    if int(r) == rank:
        os.kill(os.getpid(), getattr(signal, sig))
if args.hang:
    while True:
        time.sleep(1)
