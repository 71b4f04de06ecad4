"""``fluidctl train``: plan a job, start it, supervise it, leave a log per process."""
from __future__ import annotations

import json
import os
import secrets
import sys
from pathlib import Path
from typing import List, Optional

import click

from fluidctl.errors import UsageError
from fluidctl.launch.run import failure_reporter
from fluidctl.planning import devices, options as opts
from fluidctl.planning.plan import JobSpec, Node, Plan, plan as make_plan
from fluidctl.paths import DEFAULT_LOG_DIR, LogLayout

TEE_CHOICES = ("rank0", "all", "none")
CONTEXT = {"allow_interspersed_args": False, "help_option_names": ["-h", "--help"],
           "max_content_width": 100}

EPILOG = """\b
Examples:
  fluidctl train --nproc 2 templates/train_nccl2.py --epochs 3
  fluidctl train --gpus 0,2,3 train.py
  fluidctl train --mode pserver --pservers 2 --nproc 2 templates/train_pserver.py
  fluidctl train --nproc 4 --dry-run --json train.py
"""


def _positive(name: str):
    def check(ctx, param, value):
        if value is not None and value <= 0:
            raise click.BadParameter(f"must be >= 1, got {value}", param_hint=name)
        return value
    return check


def _non_negative(name: str):
    def check(ctx, param, value):
        if value is not None and value < 0:
            raise click.BadParameter(f"must be >= 0, got {value}", param_hint=name)
        return value
    return check


@click.command(context_settings=CONTEXT, epilog=EPILOG)
@click.option("--nproc", "--nproc-per-node", "nproc", type=int, callback=_positive("--nproc"),
              help="CPU processes (trainers) per node, e.g. --nproc 4. Default: one per GPU, "
                   "else 1.")
@click.option("--gpus", metavar="N|IDS",
              help="One process per GPU: a count (--gpus 4) or ids (--gpus 0,2,3; one id: 3,).")
@click.option("--mode", type=click.Choice(["collective", "pserver"]), default="collective",
              show_default=True, help="collective (NCCL2/gloo allreduce) or pserver "
                                      "(parameter servers), e.g. --mode pserver.")
@click.option("--pservers", type=int, default=None, callback=_positive("--pservers"),
              help="Parameter servers to start in pserver mode, e.g. --pservers 2 (default 1).")
@click.option("--pserver-endpoints", metavar="IP:PORT,...",
              help="Use parameter servers already running instead of starting them, e.g. "
                   "--pserver-endpoints 10.0.0.1:7164,10.0.0.2:7164.")
@click.option("--token-file", type=str, default=None,
              help="The job token (HMAC key of every fluidctl connection) from a file, e.g. "
                   "the one given to standalone pservers: --token-file job.token. Default: "
                   "$FLUIDCTL_JOB_TOKEN, else a new random token.")
@click.option("--sync/--async", "sync", default=True, show_default=True,
              help="pserver mode: a barrier per step (--sync) or apply gradients as they come.")
@click.option("--checkpoint-dir", type=click.Path(file_okay=False),
              help="pserver mode: pservers checkpoint here, e.g. --checkpoint-dir ckpt/.")
@click.option("--checkpoint-every", type=int, default=None, callback=_positive("--checkpoint-every"),
              help="pserver mode: checkpoint every K steps, e.g. --checkpoint-every 100.")
@click.option("--hostfile", type=str, default=None,
              help="Nodes to run on ('host slots=4', 'host:4' or 'host' lines), e.g. "
                   "--hostfile hosts. Slots are trainers per node (else --nproc).")
@click.option("--hosts", "hosts_arg", metavar="H:N,...", default=None,
              help="Nodes on the command line, e.g. --hosts node1:2,node2:2.")
@click.option("--backend", type=click.Choice(["local", "ssh", "fabric", "mpi"]), default=None,
              help="How processes start: local (default without hosts), ssh (paramiko; default "
                   "with hosts), fabric, or mpi (mpirun + fluidctl worker), e.g. --backend mpi.")
@click.option("--ssh-config", type=str, default=None,
              help="ssh config file to read instead of ~/.ssh/config, e.g. --ssh-config ./ssh.cfg.")
@click.option("--accept-new-host-keys", is_flag=True,
              help="Trust host keys seen for the first time (default: refuse, as OpenSSH does).")
@click.option("--remote-dir", type=str, default=None,
              help="Working directory on the nodes (default: this directory's path), e.g. "
                   "--remote-dir /work/job.")
@click.option("--python", "python", type=str, default=None,
              help="Python interpreter on the nodes (default: the one running fluidctl), e.g. "
                   "--python /opt/conda/bin/python.")
@click.option("--export", "exports", multiple=True, metavar="PATTERN",
              help="Pass variables of this environment whose names match to every rank "
                   "(repeatable), e.g. --export 'NCCL_*'.")
@click.option("--pserver-hosts", metavar="H,...", default=None,
              help="pserver mode with hosts: the nodes that run pservers (default: round robin "
                   "over all nodes), e.g. --pserver-hosts node1.")
@click.option("--ssh-timeout", type=float, default=10.0, show_default=True,
              help="Seconds to wait for each node to connect and answer, e.g. --ssh-timeout 30.")
@click.option("--started-port", type=int, default=None,
              help="Use ports P, P+1, ... instead of free ones, e.g. --started-port 6170.")
@click.option("--log-dir", default=DEFAULT_LOG_DIR, show_default=True,
              help="Where workerlog.N, serverlog.N, endpoints.log and launch.log go.")
@click.option("--env", "env_pairs", multiple=True, metavar="KEY=VALUE",
              help="Add to every process's environment (repeatable), e.g. --env NCCL_DEBUG=INFO.")
@click.option("--env-file", type=str, default=None,
              help="KEY=VALUE lines added to every process's environment, e.g. --env-file job.env.")
@click.option("--grace-period", type=float, default=5.0, show_default=True,
              help="Seconds between SIGTERM and SIGKILL when stopping, e.g. --grace-period 10.")
@click.option("--max-restarts", type=int, default=0, show_default=True,
              callback=_non_negative("--max-restarts"),
              help="Restart the whole group up to N times on failure, e.g. --max-restarts 3.")
@click.option("--tee", type=click.Choice(TEE_CHOICES), default="rank0", show_default=True,
              help="Echo rank 0's output (rank0), every rank's with a [trainer N] prefix (all), "
                   "or none.")
@click.option("--log-tail", type=int, default=20, show_default=True,
              help="Lines of the failing rank's log shown in the failure report.")
@click.option("--dry-run", is_flag=True, help="Print the plan (a table) and start nothing.")
@click.option("--json", "as_json", is_flag=True,
              help="With --dry-run: print the plan, environments included, as JSON.")
@click.argument("script")
@click.argument("script_args", nargs=-1, type=click.UNPROCESSED)
def train(nproc, gpus, mode, pservers, pserver_endpoints, token_file, sync, checkpoint_dir,
          checkpoint_every,
          hostfile, hosts_arg, backend, ssh_config, accept_new_host_keys, remote_dir, python,
          exports, pserver_hosts, ssh_timeout, started_port, log_dir, env_pairs, env_file,
          grace_period, max_restarts, tee, log_tail, dry_run, as_json, script, script_args):
    """Run SCRIPT as a distributed training job.

    SCRIPT ending in .py runs with fluidctl's own Python (-u); anything else is executed.
    SCRIPT_ARGS are passed to it untouched, options included.
    """
    if as_json and not dry_run:
        raise UsageError("--json only works with --dry-run", "add --dry-run")
    if grace_period < 0:
        raise UsageError(f"--grace-period {grace_period} is negative", "use 0 or more seconds")
    script_path = opts.check_script(script)
    user_env = opts.read_env_file(env_file)
    user_env.update(opts.parse_env_pairs(env_pairs))
    user_env = {**opts.exported(exports), **user_env}
    layout = LogLayout(Path(log_dir))
    if layout.root.exists() and not layout.root.is_dir():
        raise UsageError(f"log dir {log_dir} is a file", "pass --log-dir with a directory path")
    if mode != "pserver" and (pservers or pserver_endpoints or pserver_hosts):
        raise UsageError("--pservers/--pserver-endpoints/--pserver-hosts need --mode pserver",
                         "add --mode pserver")
    if pservers and pserver_endpoints:
        raise UsageError("--pservers and --pserver-endpoints both given",
                         "start pservers here (--pservers N) or use running ones, not both")
    backend = backend or ("ssh" if hostfile or hosts_arg else "local")
    common = dict(mode=mode, pserver_endpoints=_split_endpoints(pserver_endpoints), sync=sync,
                  pserver_args=_pserver_args(checkpoint_dir, checkpoint_every), log_dir=log_dir,
                  user_env=user_env, token=job_token(token_file))
    run_opts = dict(grace_period=grace_period, max_restarts=max_restarts, tee=tee,
                    log_tail=log_tail, dry_run=dry_run, as_json=as_json)
    if backend == "mpi":
        from fluidctl.launch import mpijob
        hosts = load_hosts_opt(hostfile, hosts_arg)
        sys.exit(mpijob.run(script_path, list(script_args), hosts=hosts, nproc=nproc,
                            python=python, layout=layout, common=common, ssh_config=ssh_config,
                            **run_opts))
    if backend in ("ssh", "fabric"):
        if not (hostfile or hosts_arg):
            raise UsageError(f"--backend {backend} needs nodes", "pass --hostfile or --hosts")
        sys.exit(_run_multinode(
            script, list(script_args), backend=backend, hosts=load_hosts_opt(hostfile, hosts_arg),
            nproc=nproc, gpus=gpus, pservers=pservers, pserver_hosts=pserver_hosts,
            ssh_config=ssh_config, accept_new=accept_new_host_keys, remote_dir=remote_dir,
            python=python, ssh_timeout=ssh_timeout, started_port=started_port, layout=layout,
            common=common, **run_opts))
    if hostfile or hosts_arg:
        raise UsageError("--backend local runs on this machine only",
                         "drop --hostfile/--hosts, or use --backend ssh|fabric|mpi")
    node = _local_node(nproc, gpus, mode, pservers, pserver_endpoints)
    job = JobSpec(script=script_path, script_args=list(script_args), nodes=[node],
                  python=python or sys.executable, **common)

    from fluidctl.net import PortReservation
    reservation = PortReservation(node.address, job.ports_needed(0), started_port)
    try:
        the_plan = make_plan(job, {0: reservation.ports})
        if dry_run:
            _print_plan(the_plan, as_json)
            return
        code = _run_local(the_plan, layout, reservation, grace_period, max_restarts, tee,
                          log_tail)
    finally:
        reservation.release()
    sys.exit(code)


def _run_multinode(script, script_args, *, backend, hosts, nproc, gpus, pservers, pserver_hosts,
                   ssh_config, accept_new, remote_dir, python, ssh_timeout, started_port, layout,
                   common, grace_period, max_restarts, tee, log_tail, dry_run, as_json) -> int:
    from fluidctl.launch import multinode
    from fluidctl.backends.sshconfig import resolve_hosts
    from fluidctl.launch.supervisor import LaunchLog
    opts.check_script(script)
    python = python or sys.executable
    remote_dir = remote_dir or os.getcwd()
    resolved, targets = resolve_hosts(hosts, ssh_config, accept_new)
    names = [h.name for h in resolved]
    on_pservers = _pserver_placement(common, pservers, pserver_hosts, names)
    wanted = {}
    for host, k in zip(resolved, on_pservers):
        count = host.slots if host.slots_given else nproc
        wanted[host.name] = (count or multinode.MAX_UNKNOWN_PORTS) + k + 1
    launch_log = LaunchLog()
    connected, agents = multinode.bring_up(
        resolved, targets, backend=backend, python=python, remote_dir=remote_dir,
        timeout=ssh_timeout, ports_wanted=wanted, launch_log=launch_log)
    try:
        nodes = []
        for host, agent, k in zip(resolved, agents, on_pservers):
            found = node_gpus(nproc, gpus, [str(i) for i in range(agent.probe["gpus"])])
            count = host.slots if host.slots_given else (len(found) if found else (nproc or 1))
            if found and len(found) != count:
                raise UsageError(f"node {host.name} has {count} slots but {len(found)} GPUs "
                                 "selected", "make slots match the GPUs, or drop slots= and "
                                 "use --gpus")
            address = connected[host.name].peer_address or host.address
            nodes.append(Node(address, count, tuple(found), host.name, k))
        job = JobSpec(script=multinode.relative_script(script, os.getcwd()),
                      script_args=script_args, nodes=nodes, python=python, multi_node_logs=True,
                      **common)
        the_plan = make_plan(job, multinode.ports_for(resolved, job.ports_needed, started_port,
                                                      agents))
        if dry_run:
            _print_plan(the_plan, as_json)
            return 0
        return multinode.supervise(the_plan, resolved, connected, agents, backend=backend,
                                   python=python, remote_dir=remote_dir,
                                   ssh_timeout=ssh_timeout, layout=layout,
                                   grace_period=grace_period, max_restarts=max_restarts, tee=tee,
                                   log_tail=log_tail, launch_log=launch_log)
    finally:
        for agent in agents:
            agent.abandon()
        launch_log.close()
        for node in connected.values():
            node.close()


def _pserver_placement(common, pservers, pserver_hosts, names) -> List[int]:
    """How many pservers each node runs: round robin over the nodes (or --pserver-hosts)."""
    counts = [0] * len(names)
    if common["mode"] != "pserver" or common["pserver_endpoints"]:
        return counts
    chosen = names
    if pserver_hosts:
        chosen = [h.strip() for h in pserver_hosts.split(",") if h.strip()]
        unknown = [h for h in chosen if h not in names]
        if unknown:
            raise UsageError(f"--pserver-hosts names {','.join(unknown)}, not in the hosts",
                             f"choose from {','.join(names)}")
    for i in range(pservers or 1):
        counts[names.index(chosen[i % len(chosen)])] += 1
    return counts


def load_hosts_opt(hostfile, hosts_arg):
    if not (hostfile or hosts_arg):
        return []
    from fluidctl.planning.hosts import load_hosts
    return load_hosts(hostfile, hosts_arg)


def node_gpus(nproc, gpus, available) -> List[str]:
    """The GPUs a node's processes use: --gpus resolved against what the node has; with neither
    --gpus nor --nproc, all of them; with --nproc alone, none (CPU processes)."""
    if gpus is not None or nproc is None:
        found = devices.select_gpus(gpus, available) if gpus is not None else list(available)
    else:
        found = []
    if gpus is not None and nproc is not None and nproc != len(found):
        raise UsageError(f"--nproc {nproc} and --gpus {gpus} ({len(found)} GPUs) disagree",
                         "give only one of them: --gpus starts one process per GPU")
    return found


def _local_node(nproc, gpus, mode, pservers, pserver_endpoints) -> Node:
    found = node_gpus(nproc, gpus, devices.discover_gpus(os.environ)
                      if gpus is not None or nproc is None else [])
    count = len(found) if found else (nproc or 1)
    if mode != "pserver":
        return Node("127.0.0.1", count, tuple(found))
    return Node("127.0.0.1", count, tuple(found),
                pservers=0 if pserver_endpoints else (pservers or 1))


def job_token(token_file: Optional[str]) -> str:
    """--token-file, else $FLUIDCTL_JOB_TOKEN, else a fresh random token."""
    from fluidctl import envs
    if token_file:
        return envs.read_token_file(token_file)
    return os.environ.get(envs.JOB_TOKEN) or secrets.token_hex(16)


def _split_endpoints(text: Optional[str]) -> List[str]:
    if not text:
        return []
    eps = [e.strip() for e in text.split(",") if e.strip()]
    for ep in eps:
        host, _, port = ep.rpartition(":")
        if not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise UsageError(f"malformed pserver endpoint {ep!r}",
                             "write IP:PORT,IP:PORT, e.g. 127.0.0.1:7164")
    return eps


def _pserver_args(checkpoint_dir, checkpoint_every) -> List[str]:
    args = []
    if checkpoint_dir:
        args += ["--checkpoint-dir", os.path.abspath(checkpoint_dir)]
    if checkpoint_every:
        args += ["--checkpoint-every", str(checkpoint_every)]
    return args


def _print_plan(the_plan: Plan, as_json: bool) -> None:
    if as_json:
        click.echo(json.dumps(the_plan.to_json(), indent=2))
        return
    from fluidctl.console import console, plan_table
    console().print(plan_table(the_plan))


def _run_local(the_plan: Plan, layout: LogLayout, reservation, grace_period: float,
               max_restarts: int, tee: str, log_tail: int) -> int:
    from fluidctl.launch import run
    from fluidctl.launch.supervisor import LaunchLog, RunOptions

    layout.create()
    run.write_endpoints(layout, the_plan)
    launch_log = LaunchLog(str(layout.launch))
    launch_log(f"fluidctl job: {len(the_plan.trainers)} trainer(s), mode {the_plan.job.mode}, "
               f"master {the_plan.master}, argv {the_plan.trainers[0].argv}")

    def start(attempt: int):
        handles = run.start_local(the_plan.procs, attempt)
        reservation.release()                     # the processes hold their ports now
        return handles

    try:
        result = run.run_supervised(
            start, logs=[p.log for p in the_plan.procs], launch_log=launch_log,
            options=RunOptions(grace_period, max_restarts),
            sources=run.echo_sources(the_plan.procs, tee),
            report=failure_reporter(log_tail))
    finally:
        launch_log.close()
    return result.exit_code
