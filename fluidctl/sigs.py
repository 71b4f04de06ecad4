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

__all__ = ["SIG_BLOCK", "SIG_SETMASK", "SIGINT", "SIGKILL", "SIGPIPE", "SIGTERM", "SIGXFSZ",
           "pthread_sigmask", "signal"]
