"""The quick commands' options, declared once, and their plain forms parsed without click.

Importing click (and what it pulls in: inspect, pathlib, typing, ...) costs as much start-up as
some of these commands' work: ``cluster sync`` with one file changed is mostly the nodes' ssh
handshakes, and everything before the first ``ssh`` starts is added to it; ``shard-data`` of a
small file is mostly start-up. For the commands in ``COMMANDS``, an argv made only of the command's
options (``--name VALUE``, ``--name=VALUE``, ``-o VALUE``, flags) and its arguments is parsed here
and the command's click-free ``run`` is called. Anything else (``--help``, short options run
together, an unknown name, a value that would not pass click's own check, a missing value) gives
None and click parses it as always, so every message a user sees about the command line is still
click's.

The tables here are the one declaration of these options, help text included:
``fluidctl.commands.fastoptions`` builds the click commands' parameters from them, and
tests/unit/test_fastargs.py checks that both parsers give the same values over a corpus of argvs and
Hypothesis-made ones.
"""
from __future__ import annotations

import os
import sys

from fluidctl.digest import DEFAULT as DEFAULT_DIGEST

FLAG, VALUE, MULTI = "flag", "value", "multi"


class Refused(Exception):
    """A value click would refuse, or might: let click parse (and word the error)."""


class Type:
    """A value's converter here (raising Refused where click might refuse it) and the click
    type that stands for it, made on demand by ``click_type(click)`` (and, where click checks
    the value in a callback, ``click_callback(click)``): click is not imported here."""

    def __init__(self, convert, click_type=None, click_callback=None):
        self.convert, self._click_type = convert, click_type
        self._click_callback = click_callback

    def __call__(self, value: str):
        return self.convert(value)

    def click_type(self, click):
        """The click type (None: click's default, a string)."""
        return self._click_type(click) if self._click_type else None

    def click_callback(self, click):
        """The click callback that checks the value (None: none)."""
        return self._click_callback(click) if self._click_callback else None


def _text(value: str) -> str:
    if value.startswith("-"):       # click would take it; a forgotten value is likelier
        raise Refused(value)
    return value


def _file_path(value: str) -> str:
    if os.path.isdir(_text(value)):
        raise Refused(value)
    return value


def _existing_path(value: str) -> str:
    if not os.path.exists(_text(value)):
        raise Refused(value)
    return value


def _integer(value: str) -> int:
    """click's INT (leading '-' left to click)."""
    try:
        return int(_text(value))
    except ValueError:
        raise Refused(value) from None


TEXT = Type(_text)
FILE = Type(_file_path, lambda click: click.Path(dir_okay=False))
EXISTING_PATH = Type(_existing_path, lambda click: click.Path(exists=True))
INT = Type(_integer, lambda click: int)


def choice(choices) -> Type:
    """click.Choice: ``choices`` a tuple, or a function giving it (read when a value is
    checked, so the module that holds them is imported only then)."""
    def convert(value: str) -> str:
        if value not in (choices() if callable(choices) else choices):
            raise Refused(value)
        return value
    return Type(convert, lambda click: click.Choice(choices() if callable(choices)
                                                    else choices))


def sharding_choice(name: str) -> Type:
    """click.Choice(fluidctl.sharding.<name>)."""
    def choices():
        from fluidctl import sharding
        return getattr(sharding, name)
    return choice(choices)


def int_at_least(low: int, high: int = None) -> Type:
    """click's INT where click refuses values below ``low`` (an IntRange, or a callback) or
    above ``high``."""
    def convert(value: str) -> int:
        number = _integer(value)
        if number < low or (high is not None and number > high):
            raise Refused(value)
        return number
    return Type(convert, lambda click: click.IntRange(min=low, max=high))


def count_at_least(low: int, flag: str) -> Type:
    """click's INT checked by a callback: below ``low`` is "Invalid value for 'FLAG': must be
    >= LOW, got N"."""
    def convert(value: str) -> int:
        number = _integer(value)
        if number < low:
            raise Refused(value)
        return number

    def click_callback(click):
        def check(ctx, param, value):
            if value is not None and value < low:
                raise click.BadParameter(f"must be >= {low}, got {value}", param_hint=flag)
            return value
        return check
    return Type(convert, lambda click: int, click_callback)


def int_between(low: int, high: int, hint: str) -> Type:
    """clicktypes.Number(int, low, high, hint): out of range is click's one line."""
    def convert(value: str) -> int:
        number = _integer(value)
        if not low <= number <= high:
            raise Refused(value)
        return number

    def click_type(click):
        from fluidctl.clicktypes import Number
        return Number(int, low, high, hint)
    return Type(convert, click_type)


def _number(value: str) -> float:
    """click's FLOAT (leading '-' left to click)."""
    try:
        return float(_text(value))
    except ValueError:
        raise Refused(value) from None


def _directory_path(value: str) -> str:
    """click.Path(file_okay=False)."""
    if os.path.isfile(_text(value)):
        raise Refused(value)
    return value


NUMBER = Type(_number, lambda click: float)
DIRECTORY = Type(_directory_path, lambda click: click.Path(file_okay=False))


def float_between(low: float, high: float, example: str, above: bool = False,
                  hint: str = None) -> Type:
    """clicktypes.seconds(low, high): a finite number from low (or above it) to high;
    nan, inf and what is out of range go to click, which words the one-line error (``hint``:
    its fix; default "e.g. EXAMPLE")."""
    def convert(value: str) -> float:
        try:
            number = float(value)
        except ValueError:
            raise Refused(value) from None
        if not low <= number <= high or (above and number == low):   # refuses nan, inf too
            raise Refused(value)
        return number

    def click_type(click):
        from fluidctl.clicktypes import Number
        return Number(float, low, high, hint or f"e.g. {example}", above=above,
                      unit=" of seconds")
    return Type(convert, click_type)


class Option:
    """One option: its names, destination, kind (FLAG, VALUE or MULTI: repeatable, a tuple),
    value type, default, help, and how click shows it (metavar, show_default). A FLAG sets
    ``flag_value`` (``--sync/--async``: two options, one destination); ``envvar`` is read, as
    click reads it, when the option is absent (``show_envvar``: --help names it); a
    ``hidden`` one is parsed and not shown."""
    __slots__ = ("names", "dest", "kind", "type", "default", "help", "metavar", "show_default",
                 "flag_value", "envvar", "show_envvar", "hidden")

    def __init__(self, names, dest, kind=VALUE, type=TEXT, default=None, help="",
                 metavar=None, show_default=False, flag_value=True, envvar=None,
                 show_envvar=False, hidden=False):
        self.names, self.dest, self.kind, self.type = tuple(names), dest, kind, type
        self.default = (default or False if kind == FLAG else () if kind == MULTI else default)
        self.help, self.metavar, self.show_default = help, metavar, show_default
        self.flag_value, self.envvar, self.show_envvar = flag_value, envvar, show_envvar
        self.hidden = hidden


class Argument:
    """A command's positional: destination, type, default, whether it takes any number
    (click's nargs=-1, a tuple) or must be given, and its metavar."""
    __slots__ = ("dest", "type", "default", "many", "metavar", "required")

    def __init__(self, dest, type=TEXT, default=None, many=False, metavar=None,
                 required=False):
        self.dest, self.type, self.many, self.metavar = dest, type, many, metavar
        self.default, self.required = () if many else default, required


class Command:
    """One command's table: ``declared`` its options in help order, ``argument`` its
    positional, ``run`` the "module:function" called with every destination's value. With
    ``rest``, the first positional ends the options and every word after it goes, as it is,
    to ``rest`` (click's allow_interspersed_args=False and an UNPROCESSED nargs=-1)."""

    def __init__(self, run: str, declared, argument: Argument, rest=None):
        self.run, self.declared, self.argument = run, tuple(declared), argument
        self.rest = rest
        self.options = {name: o for o in self.declared for name in o.names}
        self.defaults = {}
        for o in self.declared:
            self.defaults.setdefault(o.dest, o.default)
        if rest:
            self.defaults[rest] = ()

    def parse(self, args) -> dict | None:
        params = dict(self.defaults)
        positional, given = [], set()
        i = 0
        while i < len(args):
            arg = args[i]
            i += 1
            if not arg.startswith("-") or arg == "-":
                positional.append(arg)
                if self.rest:
                    params[self.rest] = tuple(args[i:])
                    break
                continue
            name, eq, value = arg.partition("=") if arg.startswith("--") else (arg, "", "")
            option = self.options.get(name)
            if option is None:          # --help, -x, --, an unknown or misspelt option
                return None
            given.add(option.dest)
            if option.kind == FLAG:
                if eq:
                    return None
                params[option.dest] = option.flag_value
                continue
            if not eq:
                if i == len(args):
                    return None
                value = args[i]
                i += 1
            try:
                value = option.type(value)
            except Refused:
                return None
            params[option.dest] = (params[option.dest] + (value,) if option.kind == MULTI
                                   else value)
        try:
            self._from_environment(params, given)
            self._positional(params, positional)
        except Refused:
            return None
        return params

    def _from_environment(self, params: dict, given: set) -> None:
        """An absent option's environment variable, where set and not empty (as click)."""
        for option in self.declared:
            if option.envvar and option.dest not in given:
                value = os.environ.get(option.envvar)
                if value:
                    params[option.dest] = option.type(value)

    def _positional(self, params: dict, positional: list) -> None:
        argument = self.argument
        if argument.many:
            params[argument.dest] = tuple(argument.type(p) for p in positional)
        elif len(positional) > 1 or (argument.required and not positional):
            raise Refused(positional)
        else:
            params[argument.dest] = (argument.type(positional[0]) if positional
                                     else argument.default)


SSH_TIMEOUT = 10.0      # fluidctl.remote.ssh.DEFAULT_TIMEOUT (tests check they agree)

# every ``cluster`` command's (setup, check, exec, sync)
HOST_OPTIONS = (
    Option(["--hostfile"], "hostfile", type=FILE,
           help="Nodes, one per line: 'node1 slots=4', 'node1:4', 'user@node1' "
                "(e.g. --hostfile hosts.txt)."),
    Option(["--hosts"], "hosts_arg", metavar="LIST",
           help="Nodes on the command line instead (e.g. --hosts node1:2,node2:2)."),
    Option(["--ssh-config"], "ssh_config", type=FILE,
           help="ssh config for Host aliases, ports, users and keys "
                "(default ~/.ssh/config; e.g. --ssh-config cluster.conf)."),
    Option(["--timeout"], "timeout", type=float_between(0.1, 86400, "--timeout 30"),
           default=SSH_TIMEOUT,
           show_default=True, help="Seconds to wait for each node (e.g. --timeout 30)."),
    Option(["--accept-new-host-keys"], "accept_new_host_keys", FLAG,
           help="Trust and record host keys not yet in known_hosts (like ssh "
                "-o StrictHostKeyChecking=accept-new); changed keys are still refused."),
)

CLUSTER_SYNC = Command("fluidctl.cluster.sync:run", HOST_OPTIONS + (
    Option(["--remote-dir"], "remote_dir", metavar="DIR",
           help="Where the files go on each node; '{host}' is replaced by the node's name "
                "(default: the same absolute path as here; e.g. --remote-dir /data/job)."),
    Option(["--exclude"], "excludes", MULTI, metavar="PATTERN",
           help="Skip files or directories matching a glob, repeatable (e.g. --exclude "
                "'*.ckpt' --exclude data/raw); .git, __pycache__ and *.pyc are always skipped."),
    Option(["--checksum"], "checksum", FLAG,
           help="Compare content (sha256) instead of size and mtime (e.g. after a checkout "
                "that reset mtimes)."),
), Argument("src", EXISTING_PATH, default="."))

SHARD_DATA = Command("fluidctl.sharding.run:run", (
    Option(["-n", "--trainers"], "trainers", type=INT,
           help="Number of shards, one per trainer (this or --shards is required). "
                "Example: --trainers 4"),
    Option(["--shards"], "shards", type=INT,
           help="Number of canonical shards instead, independent of the trainer count: "
                "ShardReader gives each rank its part of every epoch's global order, and a "
                "job resumes at another world size exactly. Example: --shards 64"),
    Option(["-o", "--output"], "out_dir", metavar="OUT_DIR",
           help="Directory to create for the shards (required). Example: -o shards/"),
    Option(["--verify"], "verify_dir", metavar="DIR",
           help="Instead of sharding: check every shard in DIR (an OUT_DIR of an earlier "
                "run) against its manifest's sizes and digests; exit 1 naming each shard "
                "that differs. Example: --verify shards/"),
    Option(["--by"], "by", type=sharding_choice("BY_CHOICES"), default="lines",
           show_default=True,
           help="lines: contiguous ranges of records, order kept; files: whole input files "
                "per shard, balanced by size. Example: --by files"),
    Option(["--format"], "fmt", type=sharding_choice("FORMATS"), default="text",
           show_default=True,
           help="text: one record per line; csv: the header line is repeated in every shard; "
                "jsonl: every record must parse. Example: --format csv"),
    Option(["--shuffle"], "shuffle", FLAG,
           help="Shuffle records before sharding (shards then get equal record counts, +-1). "
                "Example: --shuffle --seed 7"),
    Option(["--seed"], "seed", type=INT, default=0, show_default=True,
           help="Seed for --shuffle and --equalize pad. Example: --seed 7"),
    Option(["--name"], "name",
           help="Shard file name before the numeric suffix [default: the first input's file "
                "name, .gz removed]. Example: --name train.txt"),
    Option(["--suffix-length"], "suffix_length", type=INT, default=5, show_default=True,
           help="Digits of the numeric suffix. Example: --suffix-length 3 gives train.txt-000"),
    Option(["--equalize"], "equalize", type=sharding_choice("EQUALIZE_CHOICES"),
           default="none", show_default=True,
           help="Give every shard the same record count, as NCCL2 jobs need: pad re-samples "
                "records (seeded) up to the largest shard, truncate cuts to the smallest. "
                "Example: --equalize pad"),
    Option(["--checksum"], "checksum", type=sharding_choice("CHECKSUM_CHOICES"),
           default=DEFAULT_DIGEST, show_default=True,
           help="Digest of each shard in the manifest, computed during the copy: xxh3-128 "
                "finds corrupted copies at 0.02 CPU-s/GiB; blake3 and sha256 are "
                "cryptographic (0.18 and 0.6 CPU-s/GiB; sha256 is what sha256sum checks). "
                "Example: --checksum sha256"),
    Option(["--force"], "force", FLAG, help="Replace OUT_DIR if it exists. Example: --force"),
    Option(["--to-hosts"], "to_hosts", metavar="HOSTFILE",
           help="Then send shard i only to the node of trainer i (slots= of the hostfile "
                "must add up to --trainers), plus the manifest to every node, where each "
                "shard is verified against its digest. Example: --to-hosts hosts"),
    Option(["--remote-dir"], "remote_dir",
           help="With --to-hosts: a relative OUT_DIR goes under this directory on the nodes "
                "[default: this directory's path]; '{host}' is the node's name. "
                "Example: --remote-dir /data/job"),
    Option(["--ssh-config"], "ssh_config",
           help="With --to-hosts: ssh config to read instead of ~/.ssh/config. "
                "Example: --ssh-config ./ssh.cfg"),
    Option(["--accept-new-host-keys"], "accept_new_host_keys", FLAG,
           help="With --to-hosts: trust host keys seen for the first time."),
    Option(["-q", "--quiet"], "quiet", FLAG,
           help="No progress bar and no summary table. Example: -q"),
), Argument("inputs", many=True, metavar="INPUT..."))



class Later:
    """A table built on first use by ``build()`` (train's, in fluidctl/trainargs.py, reads the
    backends' declarations, which import this module)."""

    def __init__(self, build):
        self.build, self.table = build, None

    def __getattr__(self, name):
        if self.table is None:
            self.table = self.build()
        return getattr(self.table, name)


COMMANDS = {("cluster", "sync"): CLUSTER_SYNC, ("shard-data",): SHARD_DATA}


def parse(args, commands=None):
    """(the command's ``run``, its keyword arguments), or None: click's turn. ``commands``:
    the tables (default ``COMMANDS``; cli.py adds train's, fluidctl/trainargs.py)."""
    commands = COMMANDS if commands is None else commands
    for words in (tuple(args[:2]), tuple(args[:1])):
        command = commands.get(words)
        if command is not None:
            break
    else:
        return None
    params = command.parse(args[len(words):])
    if params is None:
        return None
    module, function = command.run.split(":")
    __import__(module)          # not importlib: it imports warnings, more start-up
    return getattr(sys.modules[module], function), params
