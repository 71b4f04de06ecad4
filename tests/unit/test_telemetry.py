"""The job's one event sink (fluidctl/telemetry): each event reaches every handler once, the
events file reads back as the same events, launch.log and the console get their lines, a
failing handler stops nothing, and checkpoint commits are told once each."""
import json
import time

from fluidctl import telemetry
from fluidctl.launch.requests import CommitWatch
from fluidctl.launch.supervisor import LaunchLog
from fluidctl.paths import LogLayout, write_atomic
from fluidctl.telemetry import (CheckpointCommit, Hang, NodeLost, Restart, Straggler, World,
                                from_record, read_events)

EVENTS = [
    Restart(attempt=1, of=2, label="trainer 1", host="node2", reason="exit code 3"),
    World(attempt=1, trainers=2, hosts=("node1", "node3"), master="10.0.0.1"),
    NodeLost(host="node2", why="no heartbeat from its agent for 6.0s"),
    CheckpointCommit(step=40, dir="/ck/step-40", committed=1.5, seconds=0.25),
    Hang(why="no rank wrote for 5s", verdict="dead peer", sentence="dead peer: rank 1 exited",
         ranks=(1,), summary=("rank 0: waits",), evidence=({"rank": 0, "state": "S"},)),
    Straggler(kind="data", ranks=(2,), hosts={"2": "node2"}, links=(), slow_s=0.05,
              normal_s=0.001, collective_s=0.06, collectives=12, at_collective=80,
              evidence="from fluidctl.runtime's collectives",
              line="fluidctl: straggler: rank 2 (node2) is slow data: ..."),
]


def test_every_handler_gets_each_event_once_in_order_and_a_failing_one_stops_nothing():
    got, order = [], []

    def broken(event):
        order.append("broken")
        raise OSError("disk full")

    def keep(event):
        order.append("keep")
        got.append(event)
    sink = telemetry.Sink([broken, keep])
    for event in EVENTS:
        sink.emit(event)
    assert got == EVENTS and order == ["broken", "keep"] * len(EVENTS)
    assert sink.counts == {"restart": 1, "world": 1, "node_lost": 1, "checkpoint": 1,
                           "hang": 1, "straggler": 1}
    assert sink.last("hang") is EVENTS[4] and sink.last("nothing") is None


def test_a_jobs_sink_writes_the_events_file_launch_log_and_the_console(tmp_path, capsys):
    log = LaunchLog(str(tmp_path / "launch.log"))
    said = []
    sink = telemetry.for_job(tmp_path, log, said.append)
    for event in EVENTS:
        sink.emit(event)
    log.close()
    records = read_events(LogLayout(tmp_path).events)
    assert [from_record(r) for r in records] == EVENTS        # typed, and read back the same
    assert [r["event"] for r in records] == [e.KIND for e in EVENTS]
    lines = (tmp_path / "launch.log").read_text().splitlines()
    for event in EVENTS:            # launch.log: one line per event
        assert sum(line.endswith(" " + event.log_line()) for line in lines) == 1, event
    assert "restart 1 of 2: trainer 1 on node2 failed (exit code 3)" in lines[0]
    assert "hang: dead peer: rank 1 exited" in lines[4]
    # the console: stdout through say, the elastic launcher's lines on stderr, none for a
    # hang (its autopsy is printed whole) nor a commit
    assert said == ["fluidctl: trainer 1 failed (exit code 3); restarting the job "
                    "(restart 1 of 2)", EVENTS[5].line]
    err = capsys.readouterr().err.splitlines()
    assert err == ["fluidctl: restart 1: new world of 2 trainer(s) on node1, node3, "
                   "MASTER_ADDR 10.0.0.1",
                   "fluidctl: node node2 lost: no heartbeat from its agent for 6.0s "
                   "(recorded in the ledger of bad nodes)"]


def test_straggler_reports_and_the_hang_of_failure_json_come_from_the_events(tmp_path):
    sink = telemetry.for_job(tmp_path)
    sink.emit(EVENTS[5])
    layout = LogLayout(tmp_path)
    report = json.loads(layout.stragglers_json.read_text())
    assert report["kind"] == "data" and report["ranks"] == [2] and report["links"] == []
    assert report["line"] == EVENTS[5].line and report["hosts"] == {"2": "node2"}
    assert layout.stragglers_log.read_text().rstrip().endswith(EVENTS[5].line)
    assert EVENTS[4].failure_record() == {
        "why": "no rank wrote for 5s", "dir": None, "class": "dead peer",
        "sentence": "dead peer: rank 1 exited", "ranks": [1], "summary": ["rank 0: waits"],
        "notes": [], "evidence": [{"rank": 0, "state": "S"}]}


def test_a_torn_or_unknown_line_is_skipped(tmp_path):
    path = tmp_path / "events.jsonl"
    telemetry.EventsFile(path)(EVENTS[0])
    with open(path, "a") as f:
        f.write('{"event": "from_a_newer_fluidctl", "time": 1}\n{"event": "resta')
    records = read_events(path)
    assert [r["event"] for r in records] == ["restart", "from_a_newer_fluidctl"]
    assert from_record(records[1]) is None and read_events(tmp_path / "none") == []


def test_emit_goes_to_the_current_sink_else_to_otherwise():
    fallback, got = [], []
    telemetry.emit(EVENTS[2], otherwise=fallback.append)
    with telemetry.using(telemetry.Sink([got.append])):
        telemetry.emit(EVENTS[2], otherwise=fallback.append)
    telemetry.emit(EVENTS[1])               # none, no fallback: dropped, no error
    assert got == [EVENTS[2]] and fallback == [EVENTS[2].log_line()]


def test_each_checkpoint_commit_is_told_once(tmp_path):
    layout = LogLayout(tmp_path)
    write_atomic(layout.checkpoint_state, json.dumps(
        {"step": 3, "dir": "/old", "time": time.time() - 3600, "stop": False}))
    got = []
    watch = CommitWatch(layout, got.append, every=0.01)
    watch.look()
    assert got == []                        # an earlier job's record: not this job's commit
    for step in (10, 20):
        write_atomic(layout.checkpoint_state, json.dumps(
            {"step": step, "dir": f"/ck/step-{step}", "time": time.time(), "seconds": 0.5,
             "stop": step == 20}))
        watch.look()
        watch.look()                        # the same record again: not a new commit
    write_atomic(layout.checkpoint_state, '{"step": 30, "dir": "/ck/st')  # half-written
    watch.look()
    write_atomic(layout.checkpoint_state, json.dumps(
        {"step": 30, "dir": "/ck/step-30", "time": time.time()}))
    watch.stop()                            # the last look tells a commit made at the end
    assert [(e.step, e.dir, e.stop) for e in got] == [
        (10, "/ck/step-10", False), (20, "/ck/step-20", True), (30, "/ck/step-30", False)]
    assert got[0].seconds == 0.5 and isinstance(got[0], CheckpointCommit)
