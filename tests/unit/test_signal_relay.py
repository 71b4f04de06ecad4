"""A pserver stopped by SIGTERM must checkpoint (tests/e2e/test_hardening27.py::test_27_3 once
found only its lock file: the pserver had stopped answering signals). A handler that calls
``Event.set()`` deadlocks when the signal lands while the main thread holds the event's lock
(inside its own ``wait``); ``sigs.set_on_signals`` relays the signal through a pipe instead.
Both run in a real child process, the signal sent at that very moment."""
import subprocess
import sys
import threading

CHILD = """
import os, signal, sys, threading
from fluidctl.sigs import set_on_signals
ev = threading.Event()
if sys.argv[1] == "handler":
    signal.signal(signal.SIGTERM, lambda *_: ev.set())
else:
    set_on_signals(ev, [signal.SIGTERM])
print("sending", flush=True)
with ev._cond:                      # as inside ev.wait(): the main thread holds the lock
    os.kill(os.getpid(), signal.SIGTERM)
    landed = True                   # the handler runs at a bytecode boundary in here
print(ev.wait(10), flush=True)
"""


def run(how):
    """(what the child printed, its exit code or None if it still runs 3 s after sending)."""
    child = subprocess.Popen([sys.executable, "-c", CHILD, how], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
    guard = threading.Timer(60, child.kill)         # a deadline for the readline below
    guard.start()
    try:
        assert child.stdout.readline() == "sending\n", child.stderr.read()
        try:
            code = child.wait(3)
        except subprocess.TimeoutExpired:
            return "", None
        return child.stdout.read(), code
    finally:
        guard.cancel()
        child.kill()
        child.wait()
        child.stdout.close()
        child.stderr.close()


def test_a_handler_that_sets_the_event_deadlocks_at_that_moment():
    assert run("handler") == ("", None)


def test_the_relayed_signal_sets_the_event():
    assert run("relay") == ("True\n", 0)
