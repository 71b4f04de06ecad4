"""The plain forms of a few quick commands, parsed without click.

Importing click (and what it pulls in: inspect, pathlib, typing, ...) is 15-30 ms of start-up,
as much as some of these commands' work: ``cluster sync`` with one file changed is a few
hundred ms, most of it the nodes' ssh handshakes, and every ms before the first ``ssh`` starts
is added to it; ``shard-data`` of a small file is mostly start-up. For the commands in
``COMMANDS``, an argv made only of the command's options (``--name VALUE``, ``--name=VALUE``,
``-o VALUE``, flags) and its arguments is parsed here and the command's click-free ``run`` is
called. Anything else (``--help``, short options run together, an unknown name, a value that
would not pass click's own check, a missing value) gives None and click parses it as always,
so every message a user sees about the command line is still click's.

tests/unit/test_fastargs.py holds each table here to its click command: the same options, kinds,
destinations and defaults, and the same values from both parsers over a corpus of argvs and
Hypothesis-made ones.
"""
from __future__ import annotations

import os
import sys

FLAG, VALUE, MULTI = "flag", "value", "multi"


class Refused(Exception):
    """A value click would refuse, or might: let click parse (and word the error)."""


def text(value: str) -> str:
    if value.startswith("-"):       # click would take it; a forgotten value is likelier
        raise Refused(value)
    return value


def file_path(value: str) -> str:
    """click.Path(dir_okay=False)."""
    if os.path.isdir(text(value)):
        raise Refused(value)
    return value


def existing_path(value: str) -> str:
    """click.Path(exists=True)."""
    if not os.path.exists(text(value)):
        raise Refused(value)
    return value


def integer(value: str) -> int:
    """click's INT (leading '-' left to click)."""
    try:
        return int(text(value))
    except ValueError:
        raise Refused(value) from None


def sharding_choice(name: str):
    """click.Choice(fluidctl.sharding.<name>), read when a value is checked."""
    def convert(value: str) -> str:
        from fluidctl import sharding
        if value not in getattr(sharding, name):
            raise Refused(value)
        return value
    return convert


def float_at_least(low: float):
    """click.FloatRange(min=low)."""
    def convert(value: str) -> float:
        try:
            number = float(value)
        except ValueError:
            raise Refused(value) from None
        if not number >= low:       # also refuses nan
            raise Refused(value)
        return number
    return convert


class Command:
    """One command's table: ``options`` maps each option name to (destination, kind,
    converter); ``argument`` is its positional (destination, converter, default, and whether
    it takes any number: click's nargs=-1, a tuple); ``defaults`` holds every option's value
    when absent; ``run`` is "module:function", called with them all."""

    def __init__(self, run: str, options: dict, argument: tuple, defaults: dict):
        self.run, self.options, self.argument, self.defaults = run, options, argument, defaults

    def parse(self, args) -> dict | None:
        params = dict(self.defaults)
        positional = []
        i = 0
        while i < len(args):
            arg = args[i]
            i += 1
            if not arg.startswith("-") or arg == "-":
                positional.append(arg)
                continue
            name, eq, value = arg.partition("=") if arg.startswith("--") else (arg, "", "")
            spec = self.options.get(name)
            if spec is None:            # --help, -x, --, an unknown or misspelt option
                return None
            dest, kind, convert = spec
            if kind == FLAG:
                if eq:
                    return None
                params[dest] = True
                continue
            if not eq:
                if i == len(args):
                    return None
                value = args[i]
                i += 1
            try:
                value = convert(value)
            except Refused:
                return None
            params[dest] = params[dest] + (value,) if kind == MULTI else value
        dest, convert, default, many = self.argument
        try:
            if many:
                params[dest] = tuple(convert(p) for p in positional)
            elif len(positional) > 1:
                return None
            else:
                params[dest] = convert(positional[0]) if positional else default
        except Refused:
            return None
        return params


_HOST_OPTIONS = {
    "--hostfile": ("hostfile", VALUE, file_path),
    "--hosts": ("hosts_arg", VALUE, text),
    "--ssh-config": ("ssh_config", VALUE, file_path),
    "--timeout": ("timeout", VALUE, float_at_least(0.1)),
    "--accept-new-host-keys": ("accept_new_host_keys", FLAG, None),
}
_HOST_DEFAULTS = {"hostfile": None, "hosts_arg": None, "ssh_config": None, "timeout": 10.0,
                  "accept_new_host_keys": False}

COMMANDS = {
    ("cluster", "sync"): Command(
        "fluidctl.cluster.sync:run",
        {**_HOST_OPTIONS,
         "--remote-dir": ("remote_dir", VALUE, text),
         "--exclude": ("excludes", MULTI, text),
         "--checksum": ("checksum", FLAG, None)},
        ("src", existing_path, ".", False),
        {**_HOST_DEFAULTS, "remote_dir": None, "excludes": (), "checksum": False}),
    ("shard-data",): Command(
        "fluidctl.sharding.run:run",
        {"-n": ("trainers", VALUE, integer), "--trainers": ("trainers", VALUE, integer),
         "-o": ("out_dir", VALUE, text), "--output": ("out_dir", VALUE, text),
         "--verify": ("verify_dir", VALUE, text),
         "--by": ("by", VALUE, sharding_choice("BY_CHOICES")),
         "--format": ("fmt", VALUE, sharding_choice("FORMATS")),
         "--shuffle": ("shuffle", FLAG, None),
         "--seed": ("seed", VALUE, integer),
         "--name": ("name", VALUE, text),
         "--suffix-length": ("suffix_length", VALUE, integer),
         "--equalize": ("equalize", VALUE, sharding_choice("EQUALIZE_CHOICES")),
         "--checksum": ("checksum", VALUE, sharding_choice("CHECKSUM_CHOICES")),
         "--force": ("force", FLAG, None),
         "--to-hosts": ("to_hosts", VALUE, text),
         "--remote-dir": ("remote_dir", VALUE, text),
         "--ssh-config": ("ssh_config", VALUE, text),
         "--accept-new-host-keys": ("accept_new_host_keys", FLAG, None),
         "-q": ("quiet", FLAG, None), "--quiet": ("quiet", FLAG, None)},
        ("inputs", text, (), True),
        {"trainers": None, "out_dir": None, "verify_dir": None, "by": "lines", "fmt": "text",
         "shuffle": False, "seed": 0, "name": None, "suffix_length": 5, "equalize": "none",
         "checksum": "xxh3-128", "force": False, "to_hosts": None, "remote_dir": None,
         "ssh_config": None, "accept_new_host_keys": False, "quiet": False}),
}


def parse(args):
    """(the command's ``run``, its keyword arguments), or None: click's turn."""
    for words in (tuple(args[:2]), tuple(args[:1])):
        command = COMMANDS.get(words)
        if command is not None:
            break
    else:
        return None
    params = command.parse(args[len(words):])
    if params is None:
        return None
    module, function = command.run.split(":")
    __import__(module)          # importlib (and the warnings it imports) would be ~0.5 ms more
    return getattr(sys.modules[module], function), params
