"""The requests a trainer sends a pserver, over ``fluidctl.runtime.wire`` frames.

Every request is one frame and gets one reply frame (``{"op": "ok", ...}`` or
``{"op": "error", "msg": ...}``). Headers are msgpack maps; array data travels as the raw
payload, in the order the header lists it.

=========  ==========================================================  ======================
op         header                                                      payload
=========  ==========================================================  ======================
register   trainer, init, fp, sync, opt, dense [[key, dtype, shape]],  dense values if init
           sparse [table meta]
step       trainer, step, keys                                         gradients of keys
           -> reply: step                                              -> values of keys
pull       keys                                                        -> values of keys
spull      table, n                                                    int64 ids -> rows
spush      trainer, table, n                                           int64 ids, then rows
leave      trainer                                                     (none)
stats      (none)                                                      -> reply: counters
=========  ==========================================================  ======================

While a request legitimately waits (a sync round waiting for slower trainers, a registration
waiting for trainer 0), the pserver sends ``{"op": "wait"}`` frames (no payload) every
``KEEPALIVE`` seconds at most before the reply; the trainer skips them. A trainer's deadline
(FLUIDCTL_TIMEOUT) is for a silent pserver, not for a slow round.
"""
from __future__ import annotations

import numpy as np

REGISTER, STEP, PULL, SPULL, SPUSH, LEAVE, STATS = (
    "register", "step", "pull", "spull", "spush", "leave", "stats")
OK, ERROR, WAIT = "ok", "error", "wait"
KEEPALIVE = 1.0                # seconds between "wait" frames (at most)

_NUMERIC_KINDS = "biufc"


class BadRequest(ValueError):
    """A request that is well framed but makes no sense (wrong sizes, unknown keys, ...)."""


class PServerError(RuntimeError):
    """The pserver refused a request; retrying the same request will not help."""


def safe_dtype(text) -> np.dtype:
    """A numeric numpy dtype from a peer's string; never object or structured dtypes."""
    try:
        dtype = np.dtype(str(text))
    except (TypeError, ValueError):
        raise BadRequest(f"bad dtype {text!r}") from None
    if dtype.kind not in _NUMERIC_KINDS or dtype.fields is not None or dtype.subdtype:
        raise BadRequest(f"dtype {text!r} is not a plain numeric type")
    return dtype


def safe_shape(shape) -> tuple:
    if not isinstance(shape, (list, tuple)) or len(shape) > 32 or not all(
            isinstance(d, int) and 0 <= d < 1 << 48 for d in shape):
        raise BadRequest(f"bad shape {shape!r}")
    return tuple(shape)
