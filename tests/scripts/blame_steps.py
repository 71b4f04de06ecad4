"""A rank for tests/cluster/test_blame.py: marks each start in OUT (started.RANK.RESTART),
then works for SECONDS in small sleeps, touching OUT/beat.RANK; with ``kill``, rank 1 of the
first attempt SIGKILLs itself (as a user's kill -9 or the OOM killer would)."""
import os
import signal
import sys
import time

out, mode, seconds = sys.argv[1], sys.argv[2], float(sys.argv[3])
rank = int(os.environ["PADDLE_TRAINER_ID"])
restart = os.environ.get("PADDLE_RESTART_COUNT", "0")
open(os.path.join(out, f"started.{rank}.{restart}"), "w").close()
if mode == "kill" and restart == "0" and rank == 1:
    os.kill(os.getpid(), signal.SIGKILL)
end = time.monotonic() + seconds
while time.monotonic() < end:
    with open(os.path.join(out, f"beat.{rank}"), "w") as f:
        f.write(f"{restart} {time.monotonic()}")
    time.sleep(0.1)
print(f"rank {rank} done after restart {restart}", flush=True)
