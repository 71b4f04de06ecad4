"""The smallest fluidctl job: every rank prints what the launcher told it.

    fluidctl train --nproc 2 --tee all templates/hello.py
"""
import os
import socket

import fluidctl.envs as envs

seen = envs.read()
print(f"rank {seen.rank}/{seen.world_size} local {seen.local_rank}/{seen.local_size} "
      f"on {socket.gethostname()} pid {os.getpid()}: endpoint {seen.current_endpoint}, "
      f"master {seen.master}, backend {seen.backend}, "
      f"OMP_NUM_THREADS={os.environ.get(envs.OMP_NUM_THREADS)}, "
      f"restart {seen.restart_count}", flush=True)
