"""``fluidctl train``'s options, declared once: names, type and range, default, environment
variable and help. ``commands/train.py`` builds the click command from this table
(``commands.fastoptions``) and ``fluidctl.fastargs`` parses the plain forms with it, without
click. A backend's own options come from its package (``fluidctl/backends/<name>/options.py``),
in registry order, after --backend; --nodes and --job-name are shared, each backend giving them
its meaning. Built on first use: the backends' declarations import fastargs.
"""
from __future__ import annotations

from fluidctl.fastargs import (DIRECTORY, FLAG, MULTI, SSH_TIMEOUT, Argument, Command, Later,
                               Option, Refused, Type, choice, count_at_least, float_between,
                               int_between)

HANG_TIMEOUT_MAX = 30 * 86400       # --hang-timeout: above 0, up to 30 days


def _backend_name(value: str) -> str:
    """--backend: a built-in name here; any other (a site's, from an entry point) goes to
    click, whose Choice reads the installed ones (importlib.metadata stays off this path)."""
    from fluidctl import backends
    if value not in backends.BUILTIN:
        raise Refused(value)
    return value


def _backend_choices():
    from fluidctl import backends
    return backends.names()


BACKEND = Type(_backend_name, lambda click: click.Choice(_backend_choices()))

# the options several backends share, each giving them its own meaning (its ``configure``)
NODES = Option(["--nodes", "--nnodes"], "nodes", metavar="N|MIN:MAX",
               help="slurm: nodes to run on (default inside an allocation: all of its nodes; "
                    "required to submit from a login node), e.g. --nodes 2. Without "
                    "slurm, the nodes are --hostfile's; --nodes N then runs on the "
                    "first N of them that are not in the bad-node ledger (the rest are "
                    "spares), and a range makes an elastic job (ssh, fabric): it runs on at "
                    "most MAX of them, the others are spares, and it goes on while MIN are "
                    "left, e.g. --nodes 2:4 --max-restarts 3.")
JOB_NAME = Option(["--job-name"], "job_name",
                  help="slurm: the job's name (default: the script's name), e.g. --job-name "
                       "bert.")
SHARED = (NODES, JOB_NAME)


def backend_options(which=None) -> tuple:
    """The backends' own options in registry order (``which``: the Backends to ask; default
    the built-in ones, so a plain ``fluidctl train`` reads no entry points)."""
    from fluidctl import backends
    if which is None:
        which = [backends.backend(name) for name in backends.BUILTIN]
    seen, declared = set(), []
    for one in which:
        for option in one.declared():
            if option.dest not in seen:         # ssh and fabric share a module
                seen.add(option.dest)
                declared.append(option)
    return tuple(declared)


def _before_backends():
    return (
        Option(["--nproc", "--nproc-per-node", "--nproc_per_node"], "nproc",
               type=count_at_least(1, "--nproc"),
               help="CPU processes (trainers) per node, e.g. --nproc 4. Default: one per GPU, "
                    "else 1."),
        Option(["--gpus"], "gpus", metavar="N|IDS|all",
               help="One process per GPU: a count (--gpus 4), ids (--gpus 0,2,3; one id: 3,) "
                    "or every GPU (--gpus all)."),
        Option(["--mode"], "mode", type=choice(("collective", "pserver")), default="collective",
               show_default=True, help="collective (NCCL2/gloo allreduce) or pserver "
                                       "(parameter servers), e.g. --mode pserver."),
        Option(["--pservers"], "pservers", type=count_at_least(1, "--pservers"),
               help="Parameter servers to start in pserver mode, e.g. --pservers 2 (default "
                    "1)."),
        Option(["--pserver-endpoints"], "pserver_endpoints", metavar="IP:PORT,...",
               help="Use parameter servers already running instead of starting them, e.g. "
                    "--pserver-endpoints 10.0.0.1:7164,10.0.0.2:7164."),
        Option(["--token-file"], "token_file",
               help="The job token (HMAC key of every fluidctl connection) from a file, e.g. "
                    "the one given to standalone pservers: --token-file job.token. Default: "
                    "$FLUIDCTL_JOB_TOKEN, else a new random token."),
        Option(["--sync"], "sync", FLAG, default=True, show_default=True,
               help="pserver mode: a barrier per step (--sync) or apply gradients as they "
                    "come."),
        Option(["--async"], "sync", FLAG, default=True, flag_value=False),
        Option(["--checkpoint-dir"], "checkpoint_dir", type=DIRECTORY,
               help="pserver mode: pservers checkpoint here, e.g. --checkpoint-dir ckpt/."),
        Option(["--checkpoint-every"], "checkpoint_every",
               type=count_at_least(1, "--checkpoint-every"),
               help="pserver mode: checkpoint every K steps, e.g. --checkpoint-every 100."),
        Option(["--hostfile"], "hostfile",
               help="Nodes to run on ('host slots=4', 'host:4' or 'host' lines), e.g. "
                    "--hostfile hosts. Slots are trainers per node (else --nproc)."),
        Option(["--hosts"], "hosts_arg", metavar="H:N,...",
               help="Nodes on the command line, e.g. --hosts node1:2,node2:2."),
        Option(["--backend"], "backend", type=BACKEND,
               help="How processes start: local (default without hosts), ssh (paramiko; "
                    "default with hosts), fabric, mpi (mpirun + fluidctl worker), slurm (one "
                    "srun step in an allocation, else sbatch: docs/slurm.md), or k8s (a "
                    "Kubernetes job: docs/kubernetes.md), e.g. --backend mpi."),
    )


def _after_backends():
    from fluidctl import envs
    from fluidctl.paths import DEFAULT_LOG_DIR
    from fluidctl.sigs import GRACE_PERIOD
    from fluidctl.planning.options import TEE_CHOICES
    return (
        Option(["--ssh-config"], "ssh_config",
               help="ssh config file to read instead of ~/.ssh/config, e.g. --ssh-config "
                    "./ssh.cfg."),
        Option(["--accept-new-host-keys"], "accept_new_host_keys", FLAG,
               help="Trust host keys seen for the first time (default: refuse, as OpenSSH "
                    "does)."),
        Option(["--remote-dir"], "remote_dir",
               help="Working directory on the nodes (default: this directory's path; '{host}' "
                    "is the node's name), e.g. --remote-dir /work/job or /scratch/{host}/job."),
        Option(["--python"], "python",
               help="Python interpreter on the nodes (default: the one running fluidctl), e.g. "
                    "--python /opt/conda/bin/python."),
        Option(["--venv"], "venv", metavar="DIR", envvar=envs.VENV,
               help="Without --python: the environment 'fluidctl cluster setup' made on the "
                    "nodes, used where it exists ('{host}' is the node's name; default: "
                    "$FLUIDCTL_VENV, else ~/.fluidctl/venv), e.g. --venv /opt/job-env."),
        Option(["--export"], "exports", MULTI, metavar="PATTERN",
               help="Pass variables of this environment whose names match to every rank "
                    "(repeatable), e.g. --export 'NCCL_*'."),
        Option(["--pserver-hosts"], "pserver_hosts", metavar="H,...",
               help="pserver mode with hosts: the nodes that run pservers (default: round "
                    "robin over all nodes), e.g. --pserver-hosts node1."),
        Option(["--include-bad"], "include_bad", FLAG,
               help="Use the nodes of --hostfile/--hosts (or of the Slurm allocation) that "
                    "are in the bad-node ledger too (fluidctl cluster ledger list); without it "
                    "they are left out, one line says which. E.g. --hostfile hosts "
                    "--include-bad."),
        Option(["--health-gate"], "health_gate", FLAG,
               help="Before starting, measure the nodes as fluidctl cluster check --deep does "
                    "and leave out (recording them in the bad-node ledger) those far below "
                    "their peers, while --nodes N (default 1) nodes remain, e.g. "
                    "--hostfile hosts --health-gate --nodes 6."),
        Option(["--ssh-timeout"], "ssh_timeout",
               type=float_between(0.1, 86400, "--ssh-timeout 30"), default=SSH_TIMEOUT,
               show_default=True,
               help="Seconds to wait for each node to connect and answer, e.g. --ssh-timeout "
                    "30."),
        Option(["--started-port"], "started_port",
               type=int_between(1, 65535, "e.g. --started-port 6170"),
               help="Use ports P, P+1, ... instead of free ones, e.g. --started-port 6170."),
        Option(["--log-dir"], "log_dir", default=DEFAULT_LOG_DIR, show_default=True,
               help="Where workerlog.N, serverlog.N, endpoints.log, launch.log, failure.json "
                    "and hang-<time>/ go, e.g. --log-dir runs/exp3."),
        Option(["--env"], "env_pairs", MULTI, metavar="KEY=VALUE",
               help="Add to every process's environment (repeatable), e.g. --env "
                    "NCCL_DEBUG=INFO."),
        Option(["--env-file"], "env_file",
               help="KEY=VALUE lines added to every process's environment, e.g. --env-file "
                    "job.env."),
        Option(["--grace-period"], "grace_period",
               type=float_between(0, 86400, "--grace-period 10"), default=GRACE_PERIOD,
               show_default=True,
               help="Seconds between SIGTERM and SIGKILL when stopping, e.g. --grace-period "
                    "10."),
        Option(["--checkpoint-signal"], "checkpoint_signal", default="TERM", show_default=True,
               metavar="NAME",
               help="On a checkpoint request (SIGTERM or SIGUSR1 to fluidctl, Slurm's warning "
                    "signal, a near time limit) this signal goes to every rank, e.g. "
                    "--checkpoint-signal USR1; the grace period is not shortened."),
        Option(["--max-restarts"], "max_restarts", type=count_at_least(0, "--max-restarts"),
               default=0, show_default=True,
               help="Restart the whole group up to N times on failure, e.g. --max-restarts 3."),
        Option(["--tee"], "tee", type=choice(TEE_CHOICES), default="rank0", show_default=True,
               help="Echo rank 0's output (rank0), every rank's with a [trainer N] prefix "
                    "(all; [node:rank] on many nodes), or none."),
        Option(["--tee-ranks"], "tee_ranks", metavar="RANKS",
               help="Echo only these global trainer ranks, prefixed, e.g. --tee-ranks 0,3 "
                    "(instead of --tee)."),
        Option(["--hang-timeout"], "hang_timeout", envvar=envs.HANG_TIMEOUT, show_envvar=True,
               type=float_between(0, HANG_TIMEOUT_MAX, "--hang-timeout 600", above=True,
                                  hint="give seconds, e.g. --hang-timeout 600, or leave it out"),
               help="Seconds without any log output and any completed collective after which "
                    "the job counts as hung: every rank's Python stack is dumped to "
                    "LOG_DIR/hang-<time>/, ranks grouped by stack are printed, and the job "
                    "stops with exit code 124, e.g. --hang-timeout 600. Default: off."),
        Option(["--metrics-port"], "metrics_port", metavar="PORT",
               type=int_between(0, 65535, "--metrics-port 9400"),
               help="Serve the job's metrics for Prometheus (step time per rank, steps, "
                    "stragglers, restarts, lost nodes, checkpoints, the hang watchdog) at "
                    "http://HOST:PORT/metrics while it runs, read from what the launcher "
                    "already sees (the ranks do nothing new); 0 picks a free port, named in "
                    "launch.log, e.g. --metrics-port 9400. See docs/observe.md."),
        Option(["--metrics-host"], "metrics_host", metavar="ADDRESS", default="127.0.0.1",
               show_default=True,
               help="The address --metrics-port listens on: loopback unless told otherwise; "
                    "no token is asked for reads, so open it only to networks you trust, "
                    "e.g. --metrics-host 0.0.0.0."),
        Option(["--log-tail"], "log_tail", type=count_at_least(0, "--log-tail"), default=20,
               show_default=True,
               help="Lines of the failing rank's log shown in the failure report."),
        Option(["--node-rank", "--node_rank"], "node_rank", hidden=True,
               help="torchrun's option; refused: fluidctl plans node ranks itself."),
        Option(["--dry-run"], "dry_run", FLAG, help="Print the plan (a table) and start nothing."),
        Option(["--json"], "as_json", FLAG,
               help="With --dry-run: print the plan, environments included, as JSON."),
        Option(["--show-secrets"], "show_secrets", FLAG,
               help="With --dry-run --json: print FLUIDCTL_JOB_TOKEN instead of masking it."),
    )


def options(which=None) -> tuple:
    """Every option of ``fluidctl train`` in --help's order (``which``: the backends whose own
    options are in it; default the built-in ones)."""
    return _before_backends() + SHARED + backend_options(which) + _after_backends()


def table(which=None) -> Command:
    """The parse table of ``fluidctl train``: its options, SCRIPT, and SCRIPT_ARGS after it."""
    return Command("fluidctl.launch.train:run", options(which),
                   Argument("script", required=True), rest="script_args")


TRAIN = Later(table)
