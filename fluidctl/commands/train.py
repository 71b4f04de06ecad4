"""``fluidctl train``: options and help only; ``fluidctl.launch.train.run`` does the rest.

Checking and freezing the options is ``LaunchConfig.from_options``; the backend (``--backend``,
a name in ``fluidctl.backends.LAUNCHERS``) plans and starts; ``launch.execute`` supervises and
reports. The options every backend shares (--nodes, --job-name: each backend gives them its
meaning), each backend's own (declared in its package, ``fluidctl/backends/<name>/options.py``)
and --hang-timeout are declared once, as fastargs Options. The plain forms are parsed without
click by ``fluidctl.fastargs.TRAIN`` (a fifth of the launcher's start-up is click);
tests/test_fastargs.py fails until an option added here is added there too.
"""
from __future__ import annotations

import click

from fluidctl import backends, fastargs
from fluidctl.commands import fastoptions
from fluidctl.commands.numbers import Number, seconds
from fluidctl.paths import DEFAULT_LOG_DIR
from fluidctl.planning.config import TEE_CHOICES

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
@click.option("--nproc", "--nproc-per-node", "--nproc_per_node", "nproc", type=int,
              callback=_positive("--nproc"),
              help="CPU processes (trainers) per node, e.g. --nproc 4. Default: one per GPU, "
                   "else 1.")
@click.option("--gpus", metavar="N|IDS|all",
              help="One process per GPU: a count (--gpus 4), ids (--gpus 0,2,3; one id: 3,) "
                   "or every GPU (--gpus all).")
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
@click.option("--backend", type=click.Choice(backends.names()), default=None,
              help="How processes start: local (default without hosts), ssh (paramiko; default "
                   "with hosts), fabric, mpi (mpirun + fluidctl worker), slurm (one srun step "
                   "in an allocation, else sbatch: docs/slurm.md), or k8s (a Kubernetes job: "
                   "docs/kubernetes.md), e.g. --backend mpi.")
@fastoptions.options(fastargs.SHARED + fastargs.backend_options(backends.every()))
@click.option("--ssh-config", type=str, default=None,
              help="ssh config file to read instead of ~/.ssh/config, e.g. --ssh-config ./ssh.cfg.")
@click.option("--accept-new-host-keys", is_flag=True,
              help="Trust host keys seen for the first time (default: refuse, as OpenSSH does).")
@click.option("--remote-dir", type=str, default=None,
              help="Working directory on the nodes (default: this directory's path; '{host}' "
                   "is the node's name), e.g. --remote-dir /work/job or /scratch/{host}/job.")
@click.option("--python", "python", type=str, default=None,
              help="Python interpreter on the nodes (default: the one running fluidctl), e.g. "
                   "--python /opt/conda/bin/python.")
@click.option("--venv", metavar="DIR", envvar="FLUIDCTL_VENV", default=None,
              help="Without --python: the environment 'fluidctl cluster setup' made on the "
                   "nodes, used where it exists ('{host}' is the node's name; default: "
                   "$FLUIDCTL_VENV, else ~/.fluidctl/venv), e.g. --venv /opt/job-env.")
@click.option("--export", "exports", multiple=True, metavar="PATTERN",
              help="Pass variables of this environment whose names match to every rank "
                   "(repeatable), e.g. --export 'NCCL_*'.")
@click.option("--pserver-hosts", metavar="H,...", default=None,
              help="pserver mode with hosts: the nodes that run pservers (default: round robin "
                   "over all nodes), e.g. --pserver-hosts node1.")
@click.option("--include-bad", is_flag=True,
              help="Use the nodes of --hostfile/--hosts (or of the Slurm allocation) that "
                   "are in the bad-node ledger too (fluidctl cluster ledger list); without it "
                   "they are left out, one line says which. E.g. --hostfile hosts "
                   "--include-bad.")
@click.option("--health-gate", is_flag=True,
              help="Before starting, measure the nodes as fluidctl cluster check --deep does "
                   "and leave out (recording them in the bad-node ledger) those far below "
                   "their peers, while --nodes N (default 1) nodes remain, e.g. "
                   "--hostfile hosts --health-gate --nodes 6.")
@click.option("--ssh-timeout", type=seconds(0.1, 86400, "--ssh-timeout 30"), default=10.0,
              show_default=True,
              help="Seconds to wait for each node to connect and answer, e.g. --ssh-timeout 30.")
@click.option("--started-port", type=Number(int, 1, 65535, "e.g. --started-port 6170"),
              default=None,
              help="Use ports P, P+1, ... instead of free ones, e.g. --started-port 6170.")
@click.option("--log-dir", default=DEFAULT_LOG_DIR, show_default=True,
              help="Where workerlog.N, serverlog.N, endpoints.log, launch.log, failure.json and "
                   "hang-<time>/ go, e.g. --log-dir runs/exp3.")
@click.option("--env", "env_pairs", multiple=True, metavar="KEY=VALUE",
              help="Add to every process's environment (repeatable), e.g. --env NCCL_DEBUG=INFO.")
@click.option("--env-file", type=str, default=None,
              help="KEY=VALUE lines added to every process's environment, e.g. --env-file job.env.")
@click.option("--grace-period", type=seconds(0, 86400, "--grace-period 10"), default=5.0,
              show_default=True,
              help="Seconds between SIGTERM and SIGKILL when stopping, e.g. --grace-period 10.")
@click.option("--checkpoint-signal", default="TERM", show_default=True, metavar="NAME",
              help="On a checkpoint request (SIGTERM or SIGUSR1 to fluidctl, Slurm's warning "
                   "signal, a near time limit) this signal goes to every rank, e.g. "
                   "--checkpoint-signal USR1; the grace period is not shortened.")
@click.option("--max-restarts", type=int, default=0, show_default=True,
              callback=_non_negative("--max-restarts"),
              help="Restart the whole group up to N times on failure, e.g. --max-restarts 3.")
@click.option("--tee", type=click.Choice(TEE_CHOICES), default="rank0", show_default=True,
              help="Echo rank 0's output (rank0), every rank's with a [trainer N] prefix (all; "
                   "[node:rank] on many nodes), or none.")
@click.option("--tee-ranks", metavar="RANKS", default=None,
              help="Echo only these global trainer ranks, prefixed, e.g. --tee-ranks 0,3 "
                   "(instead of --tee).")
@fastoptions.option(fastargs.hang_timeout_option())
@click.option("--log-tail", type=int, default=20, show_default=True,
              callback=_non_negative("--log-tail"),
              help="Lines of the failing rank's log shown in the failure report.")
@click.option("--node-rank", "--node_rank", "node_rank", default=None, hidden=True,
              help="torchrun's option; refused: fluidctl plans node ranks itself.")
@click.option("--dry-run", is_flag=True, help="Print the plan (a table) and start nothing.")
@click.option("--json", "as_json", is_flag=True,
              help="With --dry-run: print the plan, environments included, as JSON.")
@click.option("--show-secrets", is_flag=True,
              help="With --dry-run --json: print FLUIDCTL_JOB_TOKEN instead of masking it.")
@click.argument("script")
@click.argument("script_args", nargs=-1, type=click.UNPROCESSED)
def train(**params):
    """Run SCRIPT as a distributed training job.

    SCRIPT ending in .py runs with fluidctl's own Python (-u); anything else is executed.
    SCRIPT_ARGS are passed to it untouched, options included.
    """
    from fluidctl.launch.train import run
    run(**params)
