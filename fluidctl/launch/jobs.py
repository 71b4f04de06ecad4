"""The job verbs of a job whose launcher runs on this machine (the Backends of local, ssh,
fabric and mpi name this module as theirs): the job is named by its log dir, where its
running launcher keeps its pid (``job.json``) and the checkpoint request file
(launch/requests.py).

``checkpoint`` writes a ``save`` request there: the ranks that read that file see it, the
launcher passes it on to the nodes that have their own (``Launcher.relay_checkpoint``), and
every rank saves at the same step and goes on. With ``stop`` it sends the launcher SIGUSR1,
its checkpoint request: the checkpoint signal to every rank, the grace period to save, then
exit 75 (run the job again to resume).
"""
from __future__ import annotations

import signal
from pathlib import Path

from fluidctl.paths import LogLayout


def owns(job_id: str) -> bool:
    """A log dir of a job fluidctl ran or runs here."""
    layout = LogLayout(Path(job_id))
    return layout.root.is_dir() and (layout.job_state.exists() or layout.launch.exists())


def log_dir(job_id: str, **_) -> Path:
    """The job's log dir (``fluidctl top``): the job is named by it."""
    return LogLayout(Path(job_id)).root


def checkpoint(job_id: str, stop: bool = False, **_) -> None:
    from fluidctl.diagnostics.dump import signal_launcher
    from fluidctl.launch import requests
    layout = LogLayout(Path(job_id))
    pid = signal_launcher(layout, job_id, signal.SIGUSR1 if stop else 0,
                          "fluidctl job checkpoint")
    if stop:
        print(f"asked the job in {job_id} for a checkpoint (SIGUSR1 to its launcher, pid "
              f"{pid}): every rank saves at the same step, then the job stops with exit 75 "
              "(run it again to resume)", flush=True)
        return
    path = requests.ask(layout, requests.SAVE, "fluidctl job checkpoint")
    print(f"asked the job in {job_id} for a checkpoint ({path}): every rank saves at the same "
          f"step and goes on; {layout.checkpoint_state} records the last committed step",
          flush=True)
