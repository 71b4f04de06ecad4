"""The ``fluidctl`` command group.

Commands are imported lazily (only the one being run), so ``fluidctl worker`` and
``fluidctl train`` start fast, and every error a user can cause is printed as one line with
exit code 2 instead of click's multi-line usage block. ``fluidctl worker SCRIPT ...``, which
every rank of an srun or mpirun job runs, does not even import click (half of a rank's
start-up): that one form has nothing to parse. Nor do the plain forms of the commands in
``fluidctl.fastargs`` (``cluster sync``, ``shard-data``, ``train``): parsed there, else by
click; ``--version`` is answered at once.
"""
import sys

from fluidctl import __version__
from fluidctl.errors import FluidctlError

# name -> "module:attribute"; one place lists every command.
COMMANDS = {
    "train": "fluidctl.commands.train:train",
    "pserver": "fluidctl.commands.pserver:pserver",
    "shard-data": "fluidctl.commands.shard_data:shard_data",
    "worker": "fluidctl.commands.worker:worker",
    "cluster": "fluidctl.commands.cluster:cluster",
    "job": "fluidctl.commands.job:job",
    "dump": "fluidctl.commands.dump:dump",
    "report": "fluidctl.commands.report:report",
    "top": "fluidctl.commands.top:top",
}

HELP = """Launch distributed training jobs: collective (NCCL2 / gloo) or parameter-server, on this
machine, over SSH, Fabric or OpenMPI.

\b
Examples:
  fluidctl train --nproc 2 templates/train_nccl2.py
  fluidctl train --gpus 4 train.py --epochs 3
  fluidctl pserver start --port 7164 --num-gradient-servers 2
  fluidctl shard-data train.txt --trainers 4 -o shards/
  mpirun -np 8 -hostfile hosts fluidctl worker train.py
  fluidctl dump                  # where is every rank of the running job?
  fluidctl report mylog          # one HTML page: timeline, step times, stragglers, failure
  fluidctl top                   # how fast is it, and which rank is slow?

\b
Shell completion (bash; use zsh_source / fish_source for those shells):
  eval "$(_FLUIDCTL_COMPLETE=bash_source fluidctl)"
"""


_GROUP = []


def _cli():
    """The click group (built on first use: ``fluidctl worker SCRIPT`` never needs it)."""
    if _GROUP:
        return _GROUP[0]
    import click

    class LazyGroup(click.Group):
        def list_commands(self, ctx):
            return sorted(COMMANDS)

        def get_command(self, ctx, name):
            target = COMMANDS.get(name)
            if target is None:
                return None
            module_name, attr = target.split(":")
            import importlib        # here: with its warnings import, not on every start
            try:
                module = importlib.import_module(module_name)
            except ModuleNotFoundError as exc:
                if exc.name == module_name:  # command not built yet
                    return None
                raise
            return getattr(module, attr)

    @click.group(cls=LazyGroup, help=HELP,
                 context_settings={"help_option_names": ["-h", "--help"],
                                   "max_content_width": 100})
    @click.version_option(__version__, "--version", "-V", prog_name="fluidctl")
    def cli():
        pass

    _GROUP.append(cli)
    return cli


def _command_suggestion(exc) -> str:
    """" Did you mean 'train'?" for `fluidctl trian` (where click does not say it itself)."""
    import re
    found = re.fullmatch(r"No such command '(.*)'\.", exc.format_message())
    ctx = exc.ctx
    if found is None or ctx is None or not hasattr(ctx.command, "list_commands"):
        return ""
    import difflib
    close = difflib.get_close_matches(found[1], ctx.command.list_commands(ctx), n=3,
                                      cutoff=0.6)
    return f" Did you mean {' or '.join(repr(c) for c in close)}?" if close else ""


def _usage_hint(exc) -> str:
    ctx = exc.ctx
    path = ctx.command_path if ctx is not None else "fluidctl"
    return f"see '{path} --help'"


# Commands that run no user code in this process: they exit without the interpreter's last
# garbage collection over every object imported (gc.freeze moves them out of its reach;
# atexit handlers, flushes and thread joins still run): a noticeable part of a small
# shard-data run and of the end of every `train` launch (the job runs in other processes;
# figures in docs/architecture.md, "Start-up").
# Not `worker`: the user's script runs in its process and keeps the normal collection.
FREEZE_AT_EXIT = ("shard-data", "cluster", "--version", "-V", "--help", "-h", "train")


def main(argv=None) -> None:
    """Run the CLI; turn every user-caused error into one line and an exit code."""
    args = sys.argv[1:] if argv is None else list(argv)
    if args in (["--version"], ["-V"]):     # as click's version_option prints it
        print(f"fluidctl, version {__version__}", flush=True)
        sys.exit(0)
    if len(args) >= 2 and args[0] == "worker" and not args[1].startswith("-"):
        from fluidctl.node.worker import run
        _without_click(run, args[1], args[2:])
    try:
        from fluidctl import fastargs, trainargs
        fast = fastargs.parse(args, {**fastargs.COMMANDS, ("train",): trainargs.TRAIN})
        if fast is not None:
            _without_click(fast[0], **fast[1])
        _main(args)
    finally:
        if args[:1] and args[0] in FREEZE_AT_EXIT:
            import gc
            gc.freeze()


def _without_click(run, *args, **kwargs) -> None:
    """A command's ``run`` called directly, with the same error contract as under click."""
    try:
        run(*args, **kwargs)
    except FluidctlError as exc:
        print(exc.one_line(), file=sys.stderr, flush=True)
        sys.exit(exc.exit_code)
    except KeyboardInterrupt:
        sys.exit(130)
    except BrokenPipeError:
        sys.exit(0)
    sys.exit(0)


def _usage_exit(exc) -> None:
    import click
    msg = exc.format_message().replace("\n", " ") + _command_suggestion(exc)
    click.echo(f"error: {msg} ({_usage_hint(exc)})", err=True)
    sys.exit(2)


def _main(argv) -> None:
    import click
    try:
        code = _cli().main(args=argv, prog_name="fluidctl", standalone_mode=False)
    except click.exceptions.NoArgsIsHelpError as exc:
        # bare `fluidctl`: its help, as --help prints it; a bare group (`fluidctl job`): its
        # help, intact, on stderr; exit 2, as click itself does in standalone mode
        root = exc.ctx.parent is None
        click.echo(exc.ctx.get_help(), err=not root)
        sys.exit(0 if root else 2)
    except click.exceptions.NoSuchOption as exc:
        from fluidctl.commands.peer_options import hint
        name = "-np" if exc.option_name == "-n" and "-np" in argv else exc.option_name
        said = hint(name)
        if said is None:
            _usage_exit(exc)
        click.echo(f"error: {said}", err=True)
        sys.exit(2)
    except click.UsageError as exc:
        _usage_exit(exc)
    except click.ClickException as exc:  # e.g. click.BadParameter outside a context, FileError
        click.echo(f"error: {exc.format_message()}", err=True)
        sys.exit(exc.exit_code or 2)
    except FluidctlError as exc:
        click.echo(exc.one_line(), err=True)
        sys.exit(exc.exit_code)
    except click.Abort:
        sys.exit(130)
    except BrokenPipeError:  # `fluidctl ... | head`
        sys.exit(0)
    sys.exit(code if isinstance(code, int) else 0)
