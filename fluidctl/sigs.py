"""Signal numbers and the calls that take them, without ``signal.py``'s enum wrappers.

``import signal`` builds IntEnums for every signal and handler, which imports enum, functools
and collections: start-up that the quick commands (``cluster sync``, ``shard-data`` on a
small file) are spared. ``_signal`` is the C module ``signal.py`` wraps; its numbers are
plain ints and its functions the same ones. Where it is missing (not CPython), signal's.
"""
try:
    from _signal import (SIG_BLOCK, SIG_SETMASK, SIGHUP, SIGINT, SIGKILL, SIGPIPE, SIGTERM,
                         SIGUSR1, SIGXFSZ, pthread_sigmask, signal)
except ImportError:                                         # pragma: no cover - not CPython
    from signal import (SIG_BLOCK, SIG_SETMASK, SIGHUP, SIGINT, SIGKILL, SIGPIPE, SIGTERM,
                        SIGUSR1, SIGXFSZ, pthread_sigmask, signal)

# What a supervised job's launcher (and node agent) takes from outside: a stop (Ctrl-C, a
# scheduler's TERM, a closed terminal), and, when the job has a checkpoint channel, a request
STOP_SIGNALS = (SIGINT, SIGTERM, SIGHUP)
REQUEST_SIGNALS = (SIGUSR1,)


def supervised_signals(checkpoint: bool) -> tuple:
    """The signals a supervisor handles: the stop signals, and the request with a checkpoint
    channel (without one, SIGUSR1 keeps its own meaning)."""
    return STOP_SIGNALS + (REQUEST_SIGNALS if checkpoint else ())


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


def set_on_signals(event, signums) -> None:
    """``event.set()`` when one of ``signums`` arrives (main thread only, as any handler).

    A handler runs in the main thread between two bytecodes, wherever that thread was: calling
    ``event.set()`` there deadlocks when the main thread was itself inside ``event.wait()``
    holding the event's internal lock (not re-entrant), and the process then ignores every
    later signal but SIGKILL. So the handler only writes a byte to a pipe, and a thread that
    reads it sets the event."""
    import os
    import threading
    read_end, write_end = os.pipe()
    os.set_blocking(write_end, False)

    def on_signal(signum, frame):
        try:
            os.write(write_end, b"x")
        except OSError:                 # the pipe is full: a byte is there already
            pass

    def relay():
        os.read(read_end, 1)
        event.set()
    threading.Thread(target=relay, name="fluidctl-signal-relay", daemon=True).start()
    for signum in signums:
        signal(signum, on_signal)


__all__ = ["by_name", "set_on_signals", "supervised_signals", "REQUEST_SIGNALS", "STOP_SIGNALS",
           "SIG_BLOCK", "SIG_SETMASK", "SIGHUP", "SIGINT", "SIGKILL", "SIGPIPE", "SIGTERM",
           "SIGUSR1", "SIGXFSZ", "pthread_sigmask", "signal"]
