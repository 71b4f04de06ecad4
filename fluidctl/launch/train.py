"""``fluidctl train``, without click: options in, one ``LaunchConfig`` (which checks them all),
``launch`` runs it and its exit code is the command's. The click command and any click-free
parser of train's plain forms call the same ``run``."""
from __future__ import annotations

import os
import sys

from fluidctl.errors import UsageError

# the Slurm-only options (``--backend slurm``), gathered into one SlurmOptions
SLURM_NAMES = ("nodes", "partition", "time_limit", "account", "qos", "constraint", "exclude",
               "slurm_args", "job_name", "detach", "checkpoint_warning")

# the Kubernetes-only options (``--backend k8s``), gathered into one K8sOptions
K8S_NAMES = ("kind", "image", "namespace", "apply")


def slurm_options(options: dict):
    """Pop the Slurm options out of ``options``: (SlurmOptions, whether any was given)."""
    from fluidctl.planning.slurm import SlurmOptions
    values = {name: options.pop(name, None) for name in SLURM_NAMES}
    given = any(values.values())
    values["time"] = values.pop("time_limit")
    values["slurm_args"] = tuple(values["slurm_args"] or ())
    values["detach"] = bool(values["detach"])
    return SlurmOptions(**values), given


def k8s_options(options: dict):
    """Pop the Kubernetes options out of ``options`` into one K8sOptions (``--nodes`` and
    ``--job-name`` are the pod count and the job's name under ``--backend k8s``)."""
    from fluidctl.planning.k8s import K8sOptions
    values = {name: options.pop(name, None) for name in K8S_NAMES}
    if options.get("backend") != "k8s":
        given = [name for name, value in values.items() if value]
        if given:
            flag = "--" + given[0].replace("_", "-")
            raise UsageError(f"{flag} is a Kubernetes option", "add --backend k8s")
        return K8sOptions()
    nodes, name = options.pop("nodes", None), options.pop("job_name", None)
    if nodes is not None:
        from fluidctl.planning.elastic import NodeRange, parse_nodes
        nodes = parse_nodes(nodes)
        if isinstance(nodes, NodeRange):
            raise UsageError(f"--nodes {nodes} (an elastic job) is for --backend ssh or fabric",
                             "give --backend k8s a count of pods, e.g. --nodes 2")
    return K8sOptions(kind=values["kind"], image=values["image"],
                      namespace=values["namespace"] or "default", nodes=nodes or 1, name=name,
                      apply=bool(values["apply"]))


def run(dry_run: bool = False, as_json: bool = False, show_secrets: bool = False,
        include_bad: bool = False, health_gate: bool = False, **options) -> None:
    """Plan and run the job (``--dry-run``: print the plan); exits with the job's code.
    ``options`` are ``LaunchConfig.from_options``'s keywords plus the Slurm options."""
    if as_json and not dry_run:
        raise UsageError("--json only works with --dry-run", "add --dry-run")
    if show_secrets and not (as_json or dry_run and options.get("backend") == "k8s"):
        raise UsageError("--show-secrets only works with --dry-run --json (it unmasks the job "
                         "token in the printed plan)", "add --dry-run --json, or drop it")
    from fluidctl import envs
    envs.check_knobs(os.environ)              # the ranks inherit them: refuse bad ones here
    if options.pop("node_rank", None) is not None:
        raise UsageError("--node-rank is torchrun's: fluidctl plans node ranks itself (the "
                         "order of --hostfile/--hosts) and starts every node from here",
                         "drop --node-rank and run fluidctl once, on one machine")
    k8s = k8s_options(options)                # under --backend k8s it takes --nodes
    from fluidctl.planning.elastic import NodeRange, check_hosts, parse_nodes
    nodes = parse_nodes(options["nodes"]) if options.get("nodes") is not None else None
    if isinstance(nodes, NodeRange) and options.get("backend") == "slurm":
        raise UsageError(f"--nodes {nodes} (an elastic job) is for --backend ssh or fabric",
                         "give --backend slurm a count, e.g. --nodes 2")
    options["nodes"] = nodes
    if options.get("backend") != "slurm":     # torchrun's --nnodes: the nodes are the hostfile's
        options["nodes"] = None
        if isinstance(nodes, NodeRange):
            options["elastic"] = nodes
    slurm, slurm_given = slurm_options(options)
    if slurm_given and options.get("backend") != "slurm":
        raise UsageError("--nodes, --partition, --time, ... are Slurm options",
                         "add --backend slurm")
    if options.get("gpus") == "all" and options.get("backend") in ("slurm", "mpi"):
        raise UsageError(f"--gpus all is not known with --backend {options['backend']}",
                         "give a count per node, e.g. --gpus 4")
    from fluidctl.planning.config import LaunchConfig
    config = LaunchConfig.from_options(slurm=slurm, k8s=k8s, **options)
    if config.elastic is not None:
        check_hosts(config.elastic, config.backend, len(config.hosts), config.mode)
    elif options.get("backend") != "slurm" and nodes is not None \
            and nodes > max(1, len(config.hosts)):
        where = (f"--hostfile/--hosts name {len(config.hosts)} nodes" if config.hosts
                 else "without --hostfile or --hosts the job runs on this machine alone")
        raise UsageError(f"--nodes {nodes}, but {where}",
                         "--nodes, --partition, --time, ... are Slurm options: add --backend "
                         "slurm; over SSH the nodes are the lines of --hostfile")
    if health_gate and config.backend == "slurm":
        raise UsageError("--health-gate measures the nodes of --hostfile/--hosts over SSH; "
                         "under Slurm the allocation chooses them",
                         "drop --health-gate (run fluidctl cluster check --deep on the "
                         "allocation's nodes), or pass --exclude")
    if include_bad:
        import dataclasses
        config = dataclasses.replace(config, include_bad=True)
    if health_gate and not config.hosts:
        raise UsageError("--health-gate measures the nodes of --hostfile/--hosts, and there "
                         "are none", "pass --hostfile, or drop --health-gate")
    if config.hosts and config.backend != "slurm":
        config = _choose_nodes(config, nodes, include_bad, health_gate and not dry_run)
    _warn_slots_over_nproc(config)
    from fluidctl.launch.execute import launch
    sys.exit(launch(config, dry_run=dry_run, as_json=as_json, show_secrets=show_secrets))


def _warn_slots_over_nproc(config) -> None:
    """--nproc next to a hostfile's slots=: the slots say how many trainers a node runs (its
    help says so), so --nproc does not count there; one warning line naming those nodes."""
    if config.nproc is None or config.backend == "slurm":
        return
    other = [h for h in config.hosts if h.slots_given and h.slots != config.nproc]
    if other:
        names = ", ".join(f"{h.name} (slots={h.slots})" for h in other[:4]) + (
            f" and {len(other) - 4} more" if len(other) > 4 else "")
        print(f"warning: --nproc {config.nproc} does not apply to {names}: a hostfile's "
              "slots= is its node's trainer count (drop --nproc, or change slots=)",
              file=sys.stderr, flush=True)


def _choose_nodes(config, nodes, include_bad: bool, health_gate: bool):
    """The hostfile's nodes less the ledgered ones (unless ``include_bad``) and, with the
    health gate, its outliers; ``--nodes N``: the first N of them, N at least (a hostfile
    may name spares)."""
    import dataclasses
    from fluidctl.cluster import gate
    if config.elastic is not None:          # the launcher picks each world of MIN..MAX
        nodes, want = config.elastic.low, None
    else:
        want = nodes
    chosen = gate.choose(
        config.hosts, min_nodes=nodes or 1, want=want, include_bad=include_bad,
        gate=health_gate, ssh_config=config.ssh_config,
        accept_new_host_keys=config.accept_new_host_keys, python=config.interpreter,
        venv=config.node_venv, timeout=config.ssh_timeout,
        workdirs={h.name: (config.remote_dir or os.getcwd()).replace("{host}", h.name)
                  for h in config.hosts})
    if len(chosen) == len(config.hosts):
        return config
    return dataclasses.replace(config, hosts=tuple(chosen))
