"""The click type of every numeric option: a finite number in a declared range, checked by
``errors.check_range`` (the same check the click-free paths and the features use), so
nan, inf and out-of-range values are one line and exit 2 wherever they are given, an
environment variable included. A leaf below the click commands and ``fastargs`` (which makes
these types on demand from its declarations): it imports click, so only code that is
already building click commands imports it."""
from __future__ import annotations

import os

import click

from fluidctl.errors import check_range


class Number(click.ParamType):
    def __init__(self, kind, low, high, hint: str, *, above: bool = False, unit: str = ""):
        self.kind, self.low, self.high, self.hint = kind, low, high, hint
        self.above, self.unit = above, unit
        self.name = "integer" if kind is int else "float"

    def convert(self, value, param, ctx):
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            number = self.kind(value)
        else:
            try:
                number = self.kind(value)
            except ValueError:
                self.fail(f"{value!r} is not a valid {self.name}", param, ctx)
        flag = max(param.opts, key=len) if param is not None else "value"
        if param is not None and param.envvar and os.environ.get(param.envvar) == value:
            flag = f"{flag} (${param.envvar})"
        return check_range(flag, number, self.low, self.high, self.hint, above=self.above,
                           unit=self.unit)


def seconds(low, high, example: str, *, above: bool = False) -> Number:
    return Number(float, low, high, f"e.g. {example}", above=above, unit=" of seconds")
