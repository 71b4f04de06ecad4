"""The typed records both ends of the node agent share (fluidctl/agentproto.py), the failure
record (Failure.to_record / from_record), process ends and their words, the one atomic write
and the one "node lost" tuple: fast, in-process, no subprocess."""
import io
import json
import os
import stat

import pytest

from fluidctl.agentproto import (EndState, Ends, NodeShare, Probe, ProcessEnd, RecordError)
from fluidctl.diagnostics.failures import (Failure, FailureKind, describe_end, end_record)
from fluidctl.paths import write_atomic


def probe() -> Probe:
    return Probe("3.11.4", "0.1.0", "/usr/bin/python3", 10 << 30, "/work", ["2", "3"],
                 [7000, 7001], {"lo": [["127.0.0.1", "255.0.0.0"]]})


# --- Probe -----------------------------------------------------------------------------------

def test_probe_survives_the_wire_and_counts_its_gpus():
    wire = probe().to_wire()
    assert Probe.from_wire(wire) == probe()
    record = json.loads(wire)
    assert record["gpus"] == 2 and record["gpu_ids"] == ["2", "3"]


@pytest.mark.parametrize("change, words", [
    (lambda r: r.pop("ports"), "the probe record has no 'ports'"),
    (lambda r: r.update(disk_free="lots"), "the probe record's 'disk_free' is str, not int"),
    (lambda r: r.update(disk_free=True), "the probe record's 'disk_free' is bool, not int"),
    (lambda r: r.update(ports=["7000"]), "'ports' holds something other than integers"),
    (lambda r: r.update(ifaces={"lo": "127.0.0.1"}), "'ifaces' are not [[address, netmask]]"),
])
def test_a_bad_probe_is_one_record_error_naming_the_key(change, words):
    record = probe().to_record()
    change(record)
    with pytest.raises(RecordError) as bad:
        Probe.from_wire(json.dumps(record))
    assert words in str(bad.value)


def test_a_probe_that_is_not_json_or_not_an_object_is_a_record_error():
    with pytest.raises(RecordError, match="the probe record is not JSON"):
        Probe.from_wire("{not json")
    with pytest.raises(RecordError, match="the probe record is list, not an object"):
        Probe.from_wire("[]")


# --- NodeShare -------------------------------------------------------------------------------

def test_node_share_survives_the_wire():
    share = NodeShare([{"role": "trainer", "rank": 0}], "/logs", "n1", attempt=2,
                      max_restarts=3, grace=1.5, marker="abc")
    assert NodeShare.from_wire(share.to_wire()) == share
    assert share != NodeShare([], "/logs", "n1")


def test_node_share_defaults_are_the_agents_old_ones():
    share = NodeShare.from_wire(json.dumps({"procs": [], "log_dir": "/l", "host": "n1",
                                            "attempt": 2}))
    assert (share.attempt, share.max_restarts, share.grace, share.marker) == (2, 2, 30.0, "")


@pytest.mark.parametrize("record, words", [
    ({"log_dir": "/l", "host": "n"}, "the node plan record has no 'procs'"),
    ({"procs": [1], "log_dir": "/l", "host": "n"}, "'procs' holds something other than"),
    ({"procs": [], "log_dir": 3, "host": "n"}, "'log_dir' is int, not str"),
    ({"procs": [], "log_dir": "/l", "host": "n", "grace": "5"}, "'grace' is str, not int or"),
])
def test_a_bad_node_share_is_one_record_error(record, words):
    with pytest.raises(RecordError) as bad:
        NodeShare.from_record(record)
    assert words in str(bad.value)


def test_the_agent_refuses_a_bad_node_plan_in_one_line(monkeypatch):
    from fluidctl.errors import UsageError
    from fluidctl.node import agent
    monkeypatch.setattr("sys.stdin", io.StringIO('{"procs": [], "host": "n1"}\n'))
    with pytest.raises(UsageError) as bad:
        agent._read_share()
    assert bad.value.one_line() == (
        "error: the node plan record has no 'log_dir' (the node agent is started by fluidctl "
        "train; do not run it by hand)")


# --- process ends ----------------------------------------------------------------------------

ENDS = [ProcessEnd("trainer 0", "n1", 10, EndState.FINISHED, 0),
        ProcessEnd("trainer 1", "n1", 11, EndState.FAILED, 3),
        ProcessEnd("trainer 2", "n2", 12, EndState.FAILED, -9),
        ProcessEnd("pserver 0", "n2", 13, EndState.STOPPED, -15),
        ProcessEnd("node n3", "n3", None, EndState.STOPPED, None)]


def test_ends_survive_the_wire():
    assert Ends.from_wire(Ends(ENDS).to_wire()).ends == ENDS


def test_ends_are_rendered_in_the_reports_words():
    assert [describe_end(e) for e in ENDS] == [
        "finished", "failed: exit code 3", "failed: signal SIGKILL",
        "still running; stopped by fluidctl (signal SIGTERM)",
        "still running; stopped by fluidctl"]
    assert end_record(ENDS[1]) == {"label": "trainer 1", "host": "n1", "pid": 11,
                                   "state": "failed: exit code 3"}


@pytest.mark.parametrize("wire, words", [
    ('{"label": "x"}', "the ends record is dict, not a list"),
    ('[{"label": "t", "host": "h", "state": "gone"}]', "state 'gone' is none of finished"),
    ('[{"host": "h", "state": "finished"}]', "the process end record has no 'label'"),
    ('[{"label": "t", "host": "h", "pid": "1", "state": "finished"}]', "'pid' is str"),
])
def test_bad_ends_are_one_record_error(wire, words):
    with pytest.raises(RecordError) as bad:
        Ends.from_wire(wire)
    assert words in str(bad.value)


# --- the failure record ----------------------------------------------------------------------

def test_failure_record_holds_what_failure_json_always_held(tmp_path):
    log = tmp_path / "workerlog.1"
    log.write_text("one\ntwo\nthree\n")
    failure = Failure("trainer 1", "n1", -9, str(log), pid=42, when=1000.0,
                      explanation="killed for memory", kind=FailureKind.OOM, started=990.0)
    record = failure.to_record(tail_lines=2)
    assert record == {"label": "trainer 1", "host": "n1", "pid": 42, "returncode": -9,
                      "exit_code": 137, "signal": "SIGKILL", "reason": "signal SIGKILL",
                      "kind": "oom", "explanation": "killed for memory", "when": 1000.0,
                      "seconds_since_start": 10.0, "log": str(log),
                      "log_tail": ["two", "three"]}
    assert json.loads(json.dumps(record))["kind"] == "oom"


def test_failure_record_round_trip_keeps_detail_kind_and_start():
    failure = Failure("node n2", "n2", 255, "", pid=7, when=50.5, detail="SSH connection lost",
                      kind=FailureKind.EXCEPTION, started=40.25, tail=["a", "b"])
    back = Failure.from_record(json.loads(json.dumps(failure.to_record())))
    assert (back.label, back.host, back.returncode, back.pid, back.when) == \
        ("node n2", "n2", 255, 7, 50.5)
    assert back.detail == "SSH connection lost" and back.reason == failure.reason
    assert back.kind is FailureKind.EXCEPTION and back.tail == ["a", "b"]
    assert back.started == pytest.approx(40.25)
    plain = Failure.from_record(Failure("trainer 0", "h", 3, "", when=1.0).to_record())
    assert (plain.detail, plain.kind, plain.started) == ("", FailureKind.NONE, None)


@pytest.mark.parametrize("change, words", [
    (lambda r: r.pop("returncode"), "the failure record has no 'returncode'"),
    (lambda r: r.update(kind="meteor"), "the failure record is malformed"),
    (lambda r: r.update(pid="12"), "the failure record is malformed"),
    (lambda r: r.update(when=None), "the failure record is malformed"),
])
def test_a_bad_failure_record_is_one_record_error(change, words):
    record = Failure("trainer 0", "h", 1, "", when=1.0).to_record()
    change(record)
    with pytest.raises(RecordError, match=words):
        Failure.from_record(record)


def test_failure_kind_reads_as_its_word():
    assert FailureKind.OOM == "oom" and str(FailureKind.HANG) == "hang"
    assert FailureKind("") is FailureKind.NONE


# --- an agent's malformed line ---------------------------------------------------------------

def test_a_malformed_agent_record_is_logged_not_raised_in_the_reader():
    from collections import deque
    from fluidctl.agentproto import MARK
    from fluidctl.backends.ssh.agent import RemoteAgent
    agent = RemoteAgent.__new__(RemoteAgent)          # no connection: only its line parser
    said = []
    agent.host, agent.launch_log, agent.copies = "n1", said.append, {}
    agent._tail, agent.probe, agent.ends = deque(maxlen=20), None, None
    agent._line("stdout", f"{MARK}probe|" + '{"python": "3"}')
    agent._line("stdout", f"{MARK}ends|" + '[{"label": "t"}]')
    assert agent.probe is None and agent.ends is None
    assert said == ["[n1] unreadable probe record: the probe record has no 'fluidctl'",
                    "[n1] unreadable ends record: the process end record has no 'state'"]
    assert "unreadable probe record" in agent._tail[0]      # why_no_probe says it


# --- write_atomic ----------------------------------------------------------------------------

def test_write_atomic_replaces_whole_files_text_or_bytes(tmp_path):
    path = tmp_path / "record.json"
    write_atomic(path, "first\n")
    write_atomic(str(path), b"second\n")
    assert path.read_bytes() == b"second\n"
    assert sorted(os.listdir(tmp_path)) == ["record.json"]       # no temporary left


def test_write_atomic_mode_is_exact_whatever_the_umask(tmp_path):
    old = os.umask(0o077)
    try:
        write_atomic(tmp_path / "script", "#!/bin/sh\n", 0o755)
    finally:
        os.umask(old)
    write_atomic(tmp_path / "token", "secret\n", 0o600)
    assert stat.S_IMODE((tmp_path / "script").stat().st_mode) == 0o755
    assert stat.S_IMODE((tmp_path / "token").stat().st_mode) == 0o600


def test_a_failed_write_atomic_keeps_the_old_file_and_no_temporary(tmp_path):
    path = tmp_path / "endpoints.log"
    write_atomic(path, "old\n")
    with pytest.raises(TypeError):
        write_atomic(path, 12345)
    assert path.read_text() == "old\n" and os.listdir(tmp_path) == ["endpoints.log"]


# --- the node-lost tuple and the Launcher protocol -------------------------------------------

def test_node_lost_covers_every_way_a_node_goes_away():
    from fluidctl.remote.ssh import NODE_LOST, ConnectionLost
    from fluidctl.remote.sshlib import paramiko
    for exc in (ConnectionLost("gone"), EOFError(), BrokenPipeError(), TimeoutError(),
                paramiko.SSHException("closed")):
        assert isinstance(exc, NODE_LOST), exc
    assert not isinstance(ValueError(), NODE_LOST)


def test_every_launcher_answers_describe_and_owns_log_dir():
    from fluidctl import backends
    for name in backends.names():
        launcher = backends.launcher(name)
        assert isinstance(launcher.owns_log_dir, bool), name
        assert callable(launcher.describe), name
    assert backends.launcher("local").owns_log_dir is True
    assert backends.launcher("local").describe(None) == ""
