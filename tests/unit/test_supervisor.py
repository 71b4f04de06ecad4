"""The Supervisor in-process, with fake Handles (torch elastic's TestAgent style): fail fast,
the first observed failure, restarts, a pserver that exits, signals and the grace period.
No process is started: each fake ends when told to, or when the supervisor signals it."""
import os
import signal
import threading

import pytest

from fluidctl.diagnostics.failures import Failure, describe_end
from fluidctl.launch.supervisor import RunOptions, Supervisor


class FakeHandle:
    """A Handle whose end the test decides; ``fileno`` turns readable when it ends."""

    def __init__(self, label, code=None, service=False, obeys_term=True):
        self.label, self.host, self.log, self.pid = label, "127.0.0.1", f"/logs/{label}", 1000
        self.service, self.obeys_term = service, obeys_term
        self.code = None
        self.signals = []
        self.closed = False
        self.terminated = threading.Event()
        self._r, self._w = os.pipe()
        if code is not None:
            self.end(code)

    def end(self, code):
        if self.code is None:
            self.code = code
            os.write(self._w, b"x")

    def fileno(self):
        return self._r

    def poll(self):
        return self.code

    def terminate(self):
        self.signals.append("TERM")
        self.terminated.set()
        if self.obeys_term:
            self.end(-signal.SIGTERM)

    def kill(self):
        self.signals.append("KILL")
        self.end(-signal.SIGKILL)

    def failure(self):
        return Failure(self.label, self.host, self.code, self.log, self.pid)

    def close(self):
        self.closed = True
        for fd in (self._r, self._w):
            os.close(fd)


def supervise(attempts, max_restarts=0, grace=5.0, then=None):
    """Run a Supervisor over ``attempts`` (a list of handle lists, one per attempt); ``then``
    runs on a thread once the first attempt started (the signal handlers are in place)."""
    log, said, restarts = [], [], []
    threads = []

    def start(attempt):
        if then and attempt == 0:
            threads.append(threading.Thread(target=then))
            threads[-1].start()
        return attempts[attempt]

    sup = Supervisor(start, RunOptions(grace, max_restarts), log=log.append, say=said.append,
                     before_restart=restarts.append)
    result = sup.run()
    for thread in threads:
        thread.join()
    return result, log, said, restarts


def test_all_trainers_succeed():
    handles = [FakeHandle("trainer 0", 0), FakeHandle("trainer 1", 0)]
    result, log, _, _ = supervise([handles])
    assert (result.exit_code, result.failure, result.attempts) == (0, None, 1)
    assert "attempt 0: all trainers finished" in log
    assert all(h.closed for h in handles)


def test_one_failure_stops_the_others_at_once():
    running = [FakeHandle("trainer 0"), FakeHandle("trainer 2")]
    failing = FakeHandle("trainer 1", 3)
    result, log, _, _ = supervise([[running[0], failing, running[1]]])
    assert result.exit_code == 3 and result.failure.label == "trainer 1"
    assert all(h.signals == ["TERM"] for h in running) and failing.signals == []
    assert "sent SIGTERM to trainer 0, trainer 2" in log


def test_the_first_observed_failure_is_reported():
    first = FakeHandle("trainer 1", -signal.SIGKILL)
    late = FakeHandle("trainer 0", obeys_term=False)
    late.terminate = lambda: (late.signals.append("TERM"), late.end(7))   # dies of the stop
    result, _, _, _ = supervise([[late, first]])
    assert result.failure.label == "trainer 1" and result.exit_code == 128 + signal.SIGKILL
    assert result.failure.reason == "signal SIGKILL"


def test_restarts_until_an_attempt_succeeds():
    attempts = [[FakeHandle("trainer 0", 1), FakeHandle("trainer 1")],
                [FakeHandle("trainer 0"), FakeHandle("trainer 1", 2)],
                [FakeHandle("trainer 0", 0), FakeHandle("trainer 1", 0)]]
    result, _, said, restarts = supervise(attempts, max_restarts=2)
    assert (result.exit_code, result.attempts) == (0, 3)
    assert restarts == [1, 2]
    assert "restarting the job (restart 1 of 2)" in said[0]
    assert attempts[0][1].signals == ["TERM"] and attempts[1][0].signals == ["TERM"]


def test_restarts_exhausted_reports_the_last_failure():
    attempts = [[FakeHandle("trainer 0", 4)], [FakeHandle("trainer 0", 5)]]
    result, _, _, restarts = supervise(attempts, max_restarts=1)
    assert (result.exit_code, result.attempts, restarts) == (5, 2, [1])


def test_a_pserver_exiting_fails_the_job_even_with_code_0():
    trainer = FakeHandle("trainer 0")
    pserver = FakeHandle("pserver 0", 0, service=True)
    result, _, _, _ = supervise([[pserver, trainer]])
    assert result.failure.label == "pserver 0"
    assert result.failure.reason == "exited before the trainers finished"
    assert result.exit_code == 1 and trainer.signals == ["TERM"]


def test_pservers_are_stopped_once_every_trainer_succeeded():
    pserver = FakeHandle("pserver 0", service=True)
    result, _, _, _ = supervise([[pserver, FakeHandle("trainer 0", 0)]])
    assert result.exit_code == 0 and pserver.signals == ["TERM"]


def test_ranks_ignoring_sigterm_are_killed_after_the_grace_period():
    stubborn = FakeHandle("trainer 0", obeys_term=False)
    result, log, _, _ = supervise([[stubborn, FakeHandle("trainer 1", 9)]], grace=0.05)
    assert result.exit_code == 9 and stubborn.signals == ["TERM", "KILL"]
    assert "grace period of 0.05s over: SIGKILL to trainer 0" in log


def test_the_console_says_when_ranks_were_sigkilled_after_the_grace_period():
    """Not only launch.log: a rank that needed longer to checkpoint lost it, and the user
    must see that on the console with the flag that gives it more time."""
    stubborn = FakeHandle("trainer 0", obeys_term=False)
    _, _, said, _ = supervise([[stubborn, FakeHandle("trainer 1", 9)]], grace=0.05)
    line = [s for s in said if "SIGKILL" in s]
    assert line and "trainer 0" in line[0] and "0.05s grace period" in line[0], said
    assert "--grace-period" in line[0]


def test_the_default_grace_period_is_30s_as_torchrun_and_kubernetes():
    from fluidctl import trainargs
    from fluidctl.agentproto import NodeShare
    from fluidctl.planning.config import LaunchConfig
    assert RunOptions().grace_period == LaunchConfig.grace_period == 30.0
    assert NodeShare([], "/l", "n1").grace == 30.0
    assert trainargs.TRAIN.parse(["s.py"])["grace_period"] == 30.0


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP])
def test_a_signal_stops_the_job_with_128_plus_n(sig):
    handles = [FakeHandle("trainer 0"), FakeHandle("trainer 1")]
    before = signal.getsignal(sig)

    result, log, said, _ = supervise([handles], then=lambda: os.kill(os.getpid(), sig))
    assert (result.exit_code, result.signal, result.failure) == (128 + sig, sig, None)
    assert all(h.signals == ["TERM"] for h in handles)
    assert f"fluidctl: {signal.Signals(sig).name} received, stopping all processes" in said
    assert signal.getsignal(sig) == before            # the handlers are put back


def test_a_second_ctrl_c_kills_at_once():
    stubborn = FakeHandle("trainer 0", obeys_term=False)

    def ctrl_c_twice():
        os.kill(os.getpid(), signal.SIGINT)
        stubborn.terminated.wait(10)                   # the supervisor is in its grace period
        os.kill(os.getpid(), signal.SIGINT)
    result, log, _, _ = supervise([[stubborn]], grace=600,   # would wait 600 s otherwise
                                  then=ctrl_c_twice)
    assert result.exit_code == 130 and stubborn.signals == ["TERM", "KILL"]
    assert "second SIGINT: killing every process now" in log


def test_a_slow_stop_is_said_once_with_how_to_cut_it_short(monkeypatch):
    """A grace period that runs on in silence reads as a hung fluidctl: after STOP_NOTICE the
    console names what is still stopping, when it will be killed, and the key that kills now;
    a second Ctrl-C then kills it. A prompt stop says nothing."""
    from fluidctl.launch import supervisor
    monkeypatch.setattr(supervisor, "STOP_NOTICE", 0.05)
    stubborn = FakeHandle("trainer 0", obeys_term=False)
    noticed = threading.Event()

    def ctrl_c_then_again():
        os.kill(os.getpid(), signal.SIGINT)
        assert noticed.wait(30), "no notice while trainer 0 kept running"
        os.kill(os.getpid(), signal.SIGINT)
    said = []

    def say(line):
        said.append(line)
        if "still stopping" in line:
            noticed.set()
    thread = threading.Thread(target=ctrl_c_then_again)

    def start(attempt):                 # the signal handlers are in place by now
        thread.start()
        return [stubborn, FakeHandle("trainer 1")]
    result = Supervisor(start, RunOptions(600.0), say=say).run()
    thread.join()
    assert result.exit_code == 130 and stubborn.signals == ["TERM", "KILL"]
    assert [line for line in said if "still stopping" in line] == [
        "fluidctl: trainer 0 still stopping after 0.05s: SIGKILL at 600s (--grace-period), "
        "or now on a second Ctrl-C"]
    _, _, said, _ = supervise([[FakeHandle("trainer 0"), FakeHandle("trainer 1", 9)]], grace=600)
    assert not [line for line in said if "still stopping" in line], said


@pytest.mark.parametrize("notice", [True, False])
def test_a_node_agent_leaves_the_slow_stop_to_its_launcher(monkeypatch, notice):
    """One line per node would be a thousand lines on a thousand nodes: a node agent's
    supervisor (stop_notice=False) says nothing; the launcher's names the nodes."""
    from fluidctl.launch import supervisor
    monkeypatch.setattr(supervisor, "STOP_NOTICE", 0.05)
    said = []
    stubborn = FakeHandle("trainer 0", obeys_term=False)
    Supervisor(lambda attempt: [stubborn, FakeHandle("trainer 1", 9)],
               RunOptions(0.5, stop_notice=notice), say=said.append).run()
    assert stubborn.signals == ["TERM", "KILL"]
    assert any("still stopping" in line for line in said) == notice, said


def test_abort_from_another_thread_stops_the_job_without_restart_and_records_every_end():
    # the hang watchdog's path: abort(124) from a thread, the job stops, no restart happens
    done = FakeHandle("trainer 0", 0)
    stuck = FakeHandle("trainer 1")
    box = {}

    def start(attempt):
        assert attempt == 0, "an aborted job is not restarted"
        threading.Thread(target=lambda: box["sup"].abort(124, "hung")).start()
        return [done, stuck]

    box["sup"] = Supervisor(start, RunOptions(5.0, max_restarts=3))
    result = box["sup"].run()
    assert (result.exit_code, result.aborted, result.failure) == (124, "hung", None)
    assert stuck.signals == ["TERM"]
    ends = {e.label: describe_end(e) for e in result.ends}
    assert ends == {"trainer 0": "finished",
                    "trainer 1": "still running; stopped by fluidctl (signal SIGTERM)"}
    box["sup"].abort(1, "too late")          # after the run: ignored, no closed fd written


def test_ends_name_the_failure_and_the_stopped():
    result, _, _, _ = supervise([[FakeHandle("trainer 0", 3), FakeHandle("trainer 1")]])
    ends = {e.label: describe_end(e) for e in result.ends}
    assert ends == {"trainer 0": "failed: exit code 3",
                    "trainer 1": "still running; stopped by fluidctl (signal SIGTERM)"}


def test_a_restart_header_past_max_restarts_says_it_is_a_new_world():
    """An elastic job's rejoins are attempts that --max-restarts does not count: the log line
    never reads "restart 2 of 1"."""
    from fluidctl.launch.logfiles import restart_header
    assert "restart 1 of 1," in restart_header(1, 1)
    line = restart_header(2, 1)
    assert "of 1," not in line
    assert "attempt 2 (a new world; --max-restarts 1 counts failures)" in line


class _Rank:
    """A rank's handle as the hang watchdog sees it: its process ended with ``code``."""

    def __init__(self, rank, pid, code):
        self.rank, self.pid, self.code = rank, pid, code
        self.host, self.label = "127.0.0.1", f"trainer {rank}"

    def poll(self):
        return self.code


def _hung_once(tmp_path, ranks):
    """Run the hang watchdog's ``_hung`` once over ``ranks``: (the watch, launch.log lines,
    hang reports, the supervisor's abort or None)."""
    from fluidctl import telemetry
    from fluidctl.diagnostics.watch import Diagnostics
    from fluidctl.launch.run import _Watch

    class Sup:
        aborted = None

        def handles(self):
            return list(ranks)

        def abort(self, code, why):
            self.aborted = (code, why)

    said, hangs = [], []
    diag = Diagnostics(hang_timeout=1, log_root=tmp_path)
    try:
        watch = _Watch(Sup(), diag, [], said.append, lambda *a: hangs.append(a),
                       telemetry.Sink())
        watch._hung()
        return watch, said, hangs, watch.supervisor.aborted
    finally:
        diag.close()


def test_a_hang_found_after_every_rank_ended_is_no_hang(tmp_path):
    """A busy machine can run the hang watchdog after the ranks finished (no log growth, no
    collective for the timeout: they were done): no hang report, no abort, the ends stand."""
    _, said, hangs, aborted = _hung_once(tmp_path, [_Rank(0, 1, 0), _Rank(1, 1, 0)])
    assert aborted is None and hangs == []
    assert any("every rank had already ended: not a hang" in s for s in said), said


def test_a_rank_that_failed_by_itself_while_the_hang_was_looked_at_is_a_failure(tmp_path):
    """A loaded machine can run the watchdog late, as the ranks fail (a desync every rank
    raises): a rank that exited with an error before its stack was taken makes the job a
    failure, reported by the supervisor with its cause, not "the job hung: dead peer". (A
    rank that exited 0 while the others wait is still a hang's dead peer: test_classify.)"""
    watch, said, hangs, aborted = _hung_once(tmp_path, [_Rank(0, 4242, 1), _Rank(1, 0, None)])
    assert aborted is None and hangs == [], said
    assert any("rank 0 (exit code 1) failed by itself" in s for s in said), said
    assert not watch._hung_at.is_set() and watch._hang_taken.is_set()
    assert not list(tmp_path.glob("hang-*"))
