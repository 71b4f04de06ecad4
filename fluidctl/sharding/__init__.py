"""The ``fluidctl shard-data`` engine, now a package; for this commit all of it is still in
:mod:`fluidctl.sharding.engine` (moved as is, so its history follows), reached from here."""
from __future__ import annotations

import sys
import types

from fluidctl.sharding import engine


class _Package(types.ModuleType):
    """Names of the engine read and written through the package (tests monkeypatch them)."""

    def __getattr__(self, name: str):
        return getattr(engine, name)

    def __setattr__(self, name: str, value) -> None:
        if hasattr(engine, name) and not isinstance(value, types.ModuleType):
            setattr(engine, name, value)
        else:
            super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package
