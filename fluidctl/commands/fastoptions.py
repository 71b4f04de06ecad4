"""click parameters built from ``fluidctl.fastargs`` tables, so each quick-command option is
declared once (names, type, default, help) and click and the click-free parser read the same
declaration."""
from __future__ import annotations

import click

from fluidctl import fastargs


def option(declared: fastargs.Option, off: fastargs.Option = None):
    """The click.option decorator for one table option (``off``: the flag that sets its
    destination to False, shown with it: ``--sync/--async``)."""
    kwargs = {"help": declared.help}
    names = declared.names
    if declared.kind == fastargs.FLAG:
        if off is None:
            kwargs["is_flag"] = True
        else:
            names = (f"{declared.names[0]}/{off.names[0]}",)
            kwargs["default"] = declared.default
    else:
        click_type = declared.type.click_type(click)
        if click_type is not None:
            kwargs["type"] = click_type
        callback = declared.type.click_callback(click)
        if callback is not None:
            kwargs["callback"] = callback
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
        if declared.show_envvar:
            kwargs["show_envvar"] = True
    if declared.hidden:
        kwargs["hidden"] = True
    return click.option(*names, declared.dest, **kwargs)


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
    """One decorator for several table options, shown in the table's order; a flag followed
    by its opposite (same destination, flag_value False) is one click option."""
    declared = tuple(declared)
    pairs = []
    for one in declared:
        if (pairs and one.kind == fastargs.FLAG and one.flag_value is False
                and pairs[-1][0].dest == one.dest):
            pairs[-1] = (pairs[-1][0], one)
        else:
            pairs.append((one, None))

    def apply(fn):
        for one, off in reversed(pairs):
            fn = option(one, off)(fn)
        return fn
    return apply


def parameters(command: fastargs.Command):
    """One decorator for a whole table: its positional, then its options in order."""
    def apply(fn):
        return argument(command.argument)(options(command.declared)(fn))
    return apply
