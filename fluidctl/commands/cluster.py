"""``fluidctl cluster setup | check | sync | exec``: options and help only. Each command calls
the click-free ``run`` of its feature: ``fluidctl.cluster.setup``, ``.check``, ``.sync``, ``.exec``
(hosts from ``--hostfile``/``--hosts``, SSH settings from ``~/.ssh/config`` or ``--ssh-config``,
every node in parallel, each failing node named with its reason).
"""
from __future__ import annotations

import click

from fluidctl import fastargs
from fluidctl.commands import fastoptions


host_options = fastoptions.options(fastargs.HOST_OPTIONS)     # every subcommand's


@click.group(help="""Provision, check, fill and drive the nodes of a hostfile over SSH.

\b
Examples:
  fluidctl cluster setup --hostfile hosts.txt --requirements requirements.txt
  fluidctl cluster check --hostfile hosts.txt
  fluidctl cluster sync --hostfile hosts.txt --exclude '*.ckpt' .
  fluidctl cluster exec --hosts node1,node2 -- nvidia-smi -L""")
def cluster():
    pass


@cluster.command(help="""Check every node in parallel: reachable, authenticated, Python and
fluidctl there (same version as here), free disk, GPUs, and the CuPy / NCCL versions a GPU
rank would get there ("CuPy 14.2.0, NCCL 2.32.3, no usable GPU"). Exit 1 naming each failing
node.

\b
Example:
  fluidctl cluster check --hostfile hosts.txt --timeout 5""")
@host_options
@click.option("--python", "python", metavar="PATH",
              help="Interpreter to check on the nodes (default: this one's path, "
                   "e.g. --python /usr/bin/python3).")
@click.option("--remote-dir", metavar="DIR",
              help="Directory whose free space to report, which must exist "
                   "(default: the remote home; e.g. --remote-dir /data/job).")
@click.option("--venv", metavar="DIR", envvar="FLUIDCTL_VENV", default=None,
              help="The environment 'fluidctl cluster setup' made on the nodes ('{host}' is "
                   "the node's name; default: $FLUIDCTL_VENV, else ~/.fluidctl/venv). Where it "
                   "exists, its python is checked and its versions compared with this machine's.")
@click.option("--json", "as_json", is_flag=True,
              help="Print one JSON record per node instead of the table, e.g. "
                   "fluidctl cluster check --hostfile hosts.txt --json | jq '.[] | select(.ok "
                   "| not) | .host'.")
@click.option("--deep", is_flag=True,
              help="Measure each node (CPU, memory, disk, network, GPU) and name the ones "
                   "far below their peers' median, e.g. fluidctl cluster check --hostfile "
                   "hosts.txt --deep --json.")
def check(deep=False, **params):
    if deep:
        from fluidctl.cluster.health import run
    else:
        from fluidctl.cluster.check import run
    run(**params)


@cluster.command(name="exec", help="""Run a command on every node at once; each output line is
prefixed with its host. Exit 1 if the command failed (or could not run) on any node.
One word after -- is a shell line, run as typed; several words reach the program one by one,
each whole.

\b
Examples:
  fluidctl cluster exec --hostfile hosts.txt -- nvidia-smi -L
  fluidctl cluster exec --hosts node1,node2 -- 'df -h $HOME'""")
@host_options
@click.option("--remote-dir", metavar="DIR",
              help="Run the command in this directory (e.g. --remote-dir /data/job).")
@click.option("--venv", metavar="DIR", envvar="FLUIDCTL_VENV", default=None,
              help="The environment 'fluidctl cluster setup' made on the nodes, put first on "
                   "the command's PATH where it exists ('{host}' is the node's name; default: "
                   "$FLUIDCTL_VENV, else ~/.fluidctl/venv; e.g. --venv /opt/job-env).")
@click.argument("command", nargs=-1, required=True, type=click.UNPROCESSED)
def exec_(command, **params):
    from fluidctl.cluster.exec import run
    try:
        run(command, **params)
    except KeyboardInterrupt:       # every node's command was stopped: exit 130
        raise click.Abort() from None


@cluster.command(help="""Push a directory (or one file) to every node at once, sending only
files whose size or modification time differ (--checksum: whose content differs). Each node gets
one OpenSSH connection (the same ssh config as your ssh) and needs only python3: the file list
goes in one round trip and the files in one stream; each is written under a temporary name
and renamed into place, keeping its mode and mtime. Without an ssh client here or python3
there, the node is synced over SFTP instead.

\b
Examples:
  fluidctl cluster sync --hostfile hosts.txt .
  fluidctl cluster sync --hostfile hosts.txt --remote-dir /data/job --exclude '*.ckpt' src/""")
@fastoptions.parameters(fastargs.CLUSTER_SYNC)
def sync(**params):
    from fluidctl.cluster.sync import run
    run(**params)


@cluster.command(help="""Make a ready Python environment on every node: build a wheelhouse here
once (fluidctl from this checkout or its installed version, the requirements and what they
depend on), push to each node only the wheels it lacks (by sha256, all nodes at once), create or
update a venv there with pip install --no-index --find-links, and verify it (fluidctl --version,
python -c "import ..." per requirement). A second run on a ready cluster changes nothing.
train --hostfile and cluster check then use that venv on the nodes. Exit code: how many nodes
failed (each named with pip's own error line); the others are still set up.

\b
Examples:
  fluidctl cluster setup --hostfile hosts.txt --requirements requirements.txt
  fluidctl cluster setup --hostfile hosts.txt --python python3.11 --venv /opt/job-env
  fluidctl cluster setup --hostfile hosts.txt -r requirements.txt --dry-run""")
@host_options
@click.option("-r", "--requirements", type=click.Path(dir_okay=False),
              help="pip requirements file to install on every node besides fluidctl "
                   "(e.g. --requirements requirements.txt).")
@click.option("--python", "python", metavar="PYTHON", default=None,
              help="Interpreter on the nodes that creates the venv (default: this one's "
                   "version, e.g. python3.11; e.g. --python /usr/bin/python3).")
@click.option("--venv", metavar="DIR", envvar="FLUIDCTL_VENV", default=None,
              help="The venv on the nodes; '{host}' is replaced by the node's name, relative "
                   "paths are from the remote home (default: $FLUIDCTL_VENV, else "
                   "~/.fluidctl/venv; e.g. --venv /opt/job-env).")
@click.option("--system-site-packages", is_flag=True,
              help="Let the venv see the node Python's own packages (e.g. a CUDA build of "
                   "torch installed there), as python -m venv --system-site-packages.")
@click.option("--no-deps", is_flag=True,
              help="Put only fluidctl and the listed requirements in the wheelhouse, not their "
                   "dependencies (for nodes that have them; pair with --system-site-packages).")
@click.option("--wheelhouse", type=click.Path(file_okay=False), default=None,
              help="Where the wheelhouse is built here (default: ~/.cache/fluidctl/wheelhouse; "
                   "e.g. --wheelhouse ./wheels).")
@click.option("--dry-run", is_flag=True,
              help="Build the wheelhouse here, then print per node what would be pushed and "
                   "installed; change nothing on the nodes.")
def setup(**params):
    from fluidctl.cluster.setup import run
    run(**params)


@cluster.group(help="""The bad-node ledger: nodes that were lost, failed the health gate or
whose ranks crashed, left out of later jobs until their time is up (fluidctl train
--include-bad uses them anyway).

\b
Examples:
  fluidctl cluster ledger list
  fluidctl cluster ledger clear node3""")
def ledger():
    pass


@ledger.command(name="list", help="""Show the nodes in the ledger: why, since when, until
when, and the evidence.

\b
Example:
  fluidctl cluster ledger list --json""")
@click.option("--json", "as_json", is_flag=True,
              help="One JSON record per node, e.g. fluidctl cluster ledger list --json | "
                   "jq -r '.[].host'.")
def ledger_list(as_json):
    from fluidctl.cluster.ledgerctl import list_
    list_(as_json)


@ledger.command(name="clear", help="""Forget HOST (every node without HOST): later jobs use
it again.

\b
Examples:
  fluidctl cluster ledger clear node3
  fluidctl cluster ledger clear""")
@click.argument("host", required=False)
def ledger_clear(host):
    from fluidctl.cluster.ledgerctl import clear
    clear(host)
