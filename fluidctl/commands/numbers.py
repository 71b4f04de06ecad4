"""The click type of every numeric option lives in ``fluidctl.clicktypes``, below both the
click commands here and ``fastargs`` (whose declarations make it on demand)."""
from fluidctl.clicktypes import Number, seconds

__all__ = ["Number", "seconds"]
