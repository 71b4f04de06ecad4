"""click parameters built from ``fluidctl.fastargs`` tables, so each quick-command option is
declared once (names, type, default, help) and click and the click-free parser read the same
declaration."""
from __future__ import annotations

import click

from fluidctl import fastargs


def option(declared: fastargs.Option):
    """The click.option decorator for one table option."""
    kwargs = {"help": declared.help}
    if declared.kind == fastargs.FLAG:
        kwargs["is_flag"] = True
    else:
        click_type = declared.type.click_type(click)
        if click_type is not None:
            kwargs["type"] = click_type
        if declared.kind == fastargs.MULTI:
            kwargs["multiple"] = True
        elif declared.default is not None:
            kwargs["default"] = declared.default
    if declared.metavar:
        kwargs["metavar"] = declared.metavar
    if declared.show_default:
        kwargs["show_default"] = True
    if declared.envvar:
        kwargs["envvar"] = declared.envvar
        kwargs["show_envvar"] = declared.show_envvar
    return click.option(*declared.names, declared.dest, **kwargs)


def argument(declared: fastargs.Argument):
    """The click.argument decorator for a table's positional."""
    kwargs = {}
    click_type = declared.type.click_type(click)
    if click_type is not None:
        kwargs["type"] = click_type
    if declared.many:
        kwargs["nargs"] = -1
    elif declared.default is not None:
        kwargs["default"] = declared.default
    if declared.metavar:
        kwargs["metavar"] = declared.metavar
    return click.argument(declared.dest, **kwargs)


def options(declared):
    """One decorator for several table options, shown in the table's order."""
    def apply(fn):
        for one in reversed(tuple(declared)):
            fn = option(one)(fn)
        return fn
    return apply


def parameters(command: fastargs.Command):
    """One decorator for a whole table: its positional, then its options in order."""
    def apply(fn):
        return argument(command.argument)(options(command.declared)(fn))
    return apply
