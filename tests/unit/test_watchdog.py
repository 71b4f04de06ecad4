"""The hang watchdog (fluidctl.diagnostics.watch.Watchdog) with a 0.2 s timeout: it calls
on_hang once when activity() stayed the same for the timeout, counted from the last change, and
never while activity() changes or after stop(). tests/e2e/test_diagnose.py runs the real
--hang-timeout end to end."""
import threading
import time

from fluidctl.diagnostics.watch import Watchdog

TIMEOUT = 0.2


class Activity:
    """activity() for the watchdog: a value the test sets (or a new one at every poll, while
    ``changing``), and a count of the polls."""

    def __init__(self, changing=False):
        self.value, self.polls, self.changing = 0, 0, changing
        self.polled = threading.Condition()

    def __call__(self):
        with self.polled:
            self.polls += 1
            if self.changing:
                self.value += 1
            self.polled.notify_all()
            return self.value

    def wait_polls(self, n, timeout=30.0):
        with self.polled:
            assert self.polled.wait_for(lambda: self.polls >= n, timeout), f"{n} polls"


def start(activity, on_hang=None):
    hung = threading.Event()
    dog = Watchdog(TIMEOUT, activity, on_hang or hung.set)
    dog.start()
    return dog, hung


def test_unchanged_activity_is_a_hang_after_the_timeout():
    calls = []
    hung = threading.Event()
    begin = time.monotonic()
    dog = Watchdog(TIMEOUT, lambda: "same", lambda: (calls.append(time.monotonic()),
                                                      hung.set()))
    dog.start()
    assert hung.wait(30)
    dog.join(30)
    assert not dog.is_alive() and len(calls) == 1           # once, then the thread ends
    assert calls[0] - begin >= TIMEOUT


def test_changing_activity_is_never_a_hang():
    activity = Activity(changing=True)
    dog, hung = start(activity)
    polls = int(3 * TIMEOUT / dog.poll) + 1             # three timeouts' worth of polls
    activity.wait_polls(polls)
    assert not hung.is_set()
    dog.stop()
    dog.join(30)
    assert not dog.is_alive() and not hung.is_set()


def test_the_timeout_counts_from_the_last_change():
    activity = Activity()
    dog, hung = start(activity)
    activity.wait_polls(3)
    activity.value = 1
    changed = time.monotonic()
    activity.wait_polls(activity.polls + 1)             # the watchdog saw the change
    assert hung.wait(30)
    assert time.monotonic() - changed >= TIMEOUT
    dog.join(30)


def test_stop_ends_the_watchdog_without_a_hang():
    activity = Activity()
    dog, hung = start(activity)
    activity.wait_polls(2)
    dog.stop()
    dog.join(30)
    assert not dog.is_alive() and not hung.is_set()


def test_the_poll_is_a_tenth_of_the_timeout_within_bounds():
    assert Watchdog(0.2, int, int).poll == 0.05          # never below 50 ms
    assert Watchdog(2, int, int).poll == 0.2
    assert Watchdog(600, int, int).poll == 1.0           # never above a second
