"""``fluidctl pserver start|status|stop``: options and help only; the work is
``fluidctl.pserverctl`` (``start``: foreground, or ``--daemon``: detached and waited for until it
listens; ``status`` reads the state records every pserver leaves; ``stop`` sends SIGTERM, the
server checkpoints and exits 0).
"""
from __future__ import annotations

import click

from fluidctl.commands.numbers import seconds
from fluidctl.runtime.pserver import MAX_FRAME_MB, MAX_TRAINERS


@click.group(name="pserver", help="""Standalone parameter servers for pserver-mode jobs.

\b
Examples:
  fluidctl pserver start --port 7164 --num-gradient-servers 2 --daemon --token-file job.token
  fluidctl pserver status
  fluidctl pserver stop --port 7164
""")
def pserver():
    pass


@pserver.command("start")
@click.option("--host", default="0.0.0.0", show_default=True,
              help="Address to listen on, e.g. --host 10.0.0.5.")
@click.option("--port", type=click.IntRange(0, 65535), default=7164, show_default=True,
              help="First port, e.g. --port 7164 (0 picks a free one; not with --daemon).")
@click.option("--ports-num", "--ports_num", "ports_num", type=click.IntRange(1, 64), default=1,
              show_default=True, help="Ports to listen on from --port up, e.g. --ports-num 2.")
@click.option("--ports-num-for-sparse", "--ports_num_for_sparse", "ports_num_for_sparse",
              type=click.IntRange(0, 64), default=0, show_default=True,
              help="Extra ports after those, e.g. --ports-num-for-sparse 1 (same protocol).")
@click.option("--num-gradient-servers", "--num_gradient_servers", "--trainers", "trainers",
              type=click.IntRange(1, MAX_TRAINERS), default=None,
              help="Number of trainers, e.g. --trainers 4 (default: PADDLE_TRAINERS_NUM or 1).")
@click.option("--sync/--async", "sync", default=None,
              help="Synchronous SGD (a barrier per step; default) or asynchronous updates.")
@click.option("--pserver-id", type=click.IntRange(0), default=None,
              help="This server's index; pservers sharing --checkpoint-dir need distinct ids, "
                   "e.g. --pserver-id 1.")
@click.option("--checkpoint-dir", type=click.Path(file_okay=False), default=None,
              help="Save the shard here on SIGTERM (and every --checkpoint-every steps); "
                   "reload it on start, e.g. --checkpoint-dir ckpt/.")
@click.option("--checkpoint-every", type=click.IntRange(0), default=0, show_default=True,
              help="Steps between checkpoints, e.g. --checkpoint-every 100 (0: only on stop).")
@click.option("--token-file", type=click.Path(dir_okay=False), default=None,
              help="File holding the job token trainers must present, e.g. --token-file "
                   "job.token (default: FLUIDCTL_JOB_TOKEN; --daemon generates one).")
@click.option("--max-frame-mb", type=click.IntRange(1, MAX_FRAME_MB), default=1024,
              show_default=True,
              help="Largest request accepted, in MiB, e.g. --max-frame-mb 256.")
@click.option("--daemon", is_flag=True,
              help="Detach; log to the state directory, e.g. fluidctl pserver start --daemon.")
def start(host, port, ports_num, ports_num_for_sparse, trainers, sync, pserver_id,
          checkpoint_dir, checkpoint_every, token_file, max_frame_mb, daemon):
    """Start a parameter server.

    \b
    Examples:
      fluidctl pserver start --port 7164 --trainers 2
      fluidctl pserver start --port 7164 --ports_num 1 --num_gradient_servers 4 --async
      fluidctl pserver start --port 7164 --checkpoint-dir ckpt --checkpoint-every 50 --daemon
    """
    import os
    from fluidctl import envs
    envs.check_knobs(os.environ)
    from fluidctl.pserverctl.start import run
    run(host, port, ports_num, ports_num_for_sparse, trainers, sync, pserver_id,
        checkpoint_dir, checkpoint_every, token_file, max_frame_mb, daemon)


@pserver.command("status")
@click.option("--json", "as_json", is_flag=True,
              help="Print the state records as JSON, e.g. fluidctl pserver status --json.")
def status(as_json):
    """List pservers started on this machine (from their state records).

    \b
    Example:
      fluidctl pserver status --json | jq '.[].step'
    """
    from fluidctl.pserverctl.status import run
    run(as_json)


@pserver.command("stop")
@click.option("--port", type=click.IntRange(1, 65535), default=None,
              help="Stop the pserver listening on this port, e.g. --port 7164.")
@click.option("--all", "stop_all", is_flag=True, help="Stop every pserver listed by status.")
@click.option("--timeout", type=seconds(0, 86400, "--timeout 120"), default=30.0,
              show_default=True,
              help="Seconds to wait for each to checkpoint and exit, e.g. --timeout 120.")
def stop(port, stop_all, timeout):
    """Stop pservers cleanly (SIGTERM: they checkpoint, then exit).

    \b
    Examples:
      fluidctl pserver stop --port 7164
      fluidctl pserver stop --all
    """
    from fluidctl.pserverctl.stop import run
    run(port, stop_all, timeout)
