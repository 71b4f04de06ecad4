"""``fluidctl train``, without click: options in, one ``LaunchConfig`` (which checks them all),
``launch`` runs it and its exit code is the command's. The click command and any click-free
parser of train's plain forms call the same ``run``."""
from __future__ import annotations

import os
import sys

from fluidctl.errors import UsageError


def backend_values(options: dict, chosen) -> dict:
    """Pop the shared options (--nodes, --job-name) and every backend's own out of
    ``options``; one given for another backend than ``chosen`` is one line naming its
    owner. The installed entry points are read only when ``options`` holds a name that
    LaunchConfig does not take and no built-in backend declares (a site backend's option)."""
    from fluidctl import backends
    from fluidctl.planning.config import LaunchConfig
    values = {dest: options.pop(dest, None) for dest in backends.SHARED}
    asked = [backends.backend(name) for name in backends.BUILTIN] + [chosen]
    code = LaunchConfig.from_options.__func__.__code__
    known = (set(code.co_varnames[:code.co_argcount + code.co_kwonlyargcount])
             | set(LaunchConfig.__dataclass_fields__))
    own = {o.dest for o in chosen.declared()}
    builtin = {o.dest for one in asked for o in one.declared()}
    if set(options) - known - builtin:
        asked = backends.every()
    for one in asked:
        for option in one.declared():
            if option.dest in values:           # ssh and fabric share their declarations
                continue
            values[option.dest] = value = options.pop(option.dest, None)
            if value and option.dest not in own:
                raise UsageError(f"{option.names[0]} is {_a(one.title)} option",
                                 f"add --backend {one.name}")
    return values


def _a(word: str) -> str:
    """'a Slurm', 'an MPI': an initialism is read letter by letter."""
    vowel = word[:1] in "aeiouAEIOU" or word.isupper() and word[:1] in "AEFHILMNORSX"
    return f"an {word}" if vowel else f"a {word}"


def run(dry_run: bool = False, as_json: bool = False, show_secrets: bool = False,
        include_bad: bool = False, health_gate: bool = False, **options) -> None:
    """Plan and run the job (``--dry-run``: print the plan); exits with the job's code.
    ``options`` are ``LaunchConfig.from_options``'s keywords plus the backends' own, which
    the chosen backend parses (``Backend.configure``)."""
    if as_json and not dry_run:
        raise UsageError("--json only works with --dry-run", "add --dry-run")
    from fluidctl import backends
    from fluidctl.remote import preconnect
    # over SSH, the nodes are connected to while the rest of the options are checked
    options["backend"] = options.get("backend") or backends.default(
        bool(options.get("hostfile") or options.get("hosts_arg")))
    preconnect.start({**options, "health_gate": health_gate})
    try:
        _run(dry_run, as_json, show_secrets, include_bad, health_gate, options)
    finally:
        preconnect.close()


def _run(dry_run: bool, as_json: bool, show_secrets: bool, include_bad: bool,
         health_gate: bool, options: dict) -> None:
    from fluidctl import backends, envs
    envs.check_knobs(os.environ)              # the ranks inherit them: refuse bad ones here
    if options.pop("node_rank", None) is not None:
        raise UsageError("--node-rank is torchrun's: fluidctl plans node ranks itself (the "
                         "order of --hostfile/--hosts) and starts every node from here",
                         "drop --node-rank and run fluidctl once, on one machine")
    from fluidctl.planning.config import LaunchConfig
    backend = backends.backend(options["backend"])      # chosen by run()
    if show_secrets and not (as_json or dry_run and not backend.launcher_class().dry_run_table):
        raise UsageError("--show-secrets only works with --dry-run --json (it unmasks the job "
                         "token in the printed plan)", "add --dry-run --json, or drop it")
    values = backend_values(options, backend)
    config = LaunchConfig.from_options(**options)
    given = {**values, "health_gate": health_gate, "include_bad": include_bad}
    config = backend.configure(config, given)       # pops what it gives a meaning to
    for dest, flag in backends.SHARED.items():
        if given.get(dest):
            raise UsageError(f"{flag} is not an option of --backend {backend.name}", "drop it")
    if include_bad:
        import dataclasses
        config = dataclasses.replace(config, include_bad=True)
    if health_gate and not config.hosts:
        raise UsageError("--health-gate measures the nodes of --hostfile/--hosts, and there "
                         "are none", "pass --hostfile, or drop --health-gate")
    if config.hosts and backend.hostfile:
        config = _choose_nodes(config, include_bad, health_gate and not dry_run)
    if backend.hostfile:
        _warn_slots_over_nproc(config)
    from fluidctl.launch.execute import launch
    sys.exit(launch(config, dry_run=dry_run, as_json=as_json, show_secrets=show_secrets))


def _warn_slots_over_nproc(config) -> None:
    """--nproc next to a hostfile's slots=: the slots say how many trainers a node runs (its
    help says so), so --nproc does not count there; one warning line naming those nodes."""
    if config.nproc is None:
        return
    other = [h for h in config.hosts if h.slots_given and h.slots != config.nproc]
    if other:
        from fluidctl.errors import first_few
        names = first_few(f"{h.name} (slots={h.slots})" for h in other)
        print(f"warning: --nproc {config.nproc} does not apply to {names}: a hostfile's "
              "slots= is its node's trainer count (drop --nproc, or change slots=)",
              file=sys.stderr, flush=True)


def _choose_nodes(config, include_bad: bool, health_gate: bool):
    """The hostfile's nodes less the ledgered ones (unless ``include_bad``) and, with the
    health gate, its outliers; ``--nodes N``: the first N of them, N at least (a hostfile
    may name spares)."""
    import dataclasses
    from fluidctl.cluster import gate
    from fluidctl.planning.elastic import HostNodes
    asked = HostNodes.of(config)
    if asked.elastic is not None:           # the launcher picks each world of MIN..MAX
        nodes, want = asked.elastic.low, None
    else:
        nodes = want = asked.count
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
