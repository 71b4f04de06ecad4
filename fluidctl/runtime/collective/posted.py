"""The job's first collective error, kept in the rendezvous store.

When one rank finds a fault that the others cannot see (its NCCL call failed, or its ring
neighbour made a different call than it did), the others learn of it only as a lost connection
or an aborted communicator. So the rank that finds it posts its sentence first, and every rank
that then sees its communicator break reads the store before it raises: every rank raises the
same sentence, the one posted first.
"""
from __future__ import annotations

from typing import Optional

ERROR_KEY = "collective/error"


def post(store, message: str, wait: float = 5.0) -> str:
    """Make ``message`` the job's error unless another rank posted one first; returns the
    one that stands. Without a store, or when the store is gone, ``message`` itself."""
    if store is None:
        return message
    try:
        if store.add(ERROR_KEY + "/count", 1) == 1:
            store.set(ERROR_KEY, message.encode())
        return store.get(ERROR_KEY, wait).decode()
    except Exception:            # noqa: BLE001 - the store is gone: this rank's own words
        return message


def read(store, lost: Optional[str] = None) -> Optional[str]:
    """The posted error, without waiting; None when there is none or no store to ask. When
    the store is gone: ``lost`` with the reason in its ``{}``, or None."""
    if store is None:
        return None
    from fluidctl.runtime.store import StoreTimeout
    try:
        return store.get(ERROR_KEY, 0).decode()
    except StoreTimeout:
        return None
    except OSError as exc:
        return lost.format(exc) if lost else None
