"""Signal numbers and the calls that take them, without ``signal.py``'s enum wrappers.

``import signal`` builds IntEnums for every signal and handler, which imports enum, functools
and collections: start-up that the quick commands (``cluster sync``, ``shard-data`` on a
small file) are spared. ``_signal`` is the C module ``signal.py`` wraps; its numbers are
plain ints and its functions the same ones. Where it is missing (not CPython), signal's.
"""
try:
    from _signal import (SIG_BLOCK, SIG_SETMASK, SIGINT, SIGKILL, SIGPIPE, SIGTERM, SIGXFSZ,
                         pthread_sigmask, signal)
except ImportError:                                         # pragma: no cover - not CPython
    from signal import (SIG_BLOCK, SIG_SETMASK, SIGINT, SIGKILL, SIGPIPE, SIGTERM, SIGXFSZ,
                        pthread_sigmask, signal)


# Seconds between SIGTERM (or the checkpoint signal) and SIGKILL when fluidctl stops ranks and
# pservers: torchrun's and Kubernetes' terminationGracePeriodSeconds, time for a rank to write
# a checkpoint of a few GB.
GRACE_PERIOD = 30.0


def by_name(name: str) -> int:
    """A signal's number from its name (TERM, SIGTERM, usr1) or number; ValueError if unknown."""
    word = name.strip().upper()
    if word.isdigit():
        return int(word)
    import signal as _signals          # only here: the enums are this caller's cost
    number = getattr(_signals, word if word.startswith("SIG") else "SIG" + word, None)
    if not isinstance(number, int) or word.startswith("SIG_"):
        raise ValueError(f"unknown signal {name!r}")
    return int(number)


__all__ = ["by_name", "SIG_BLOCK", "SIG_SETMASK", "SIGINT", "SIGKILL", "SIGPIPE", "SIGTERM", "SIGXFSZ",
           "pthread_sigmask", "signal"]
