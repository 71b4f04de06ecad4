"""The data behind ``fluidctl report``: the launcher's bounded step history
(fluidctl/telemetry/steptimes.py) and the readers of a log dir (fluidctl/report/facts.py,
locate.py), on real files in a temporary directory; and the page escapes what the job wrote."""
import json
import time

import pytest

from fluidctl.diagnostics.stragglers import FLIGHT_RECORDER, Sample
from fluidctl.errors import UsageError
from fluidctl.paths import LogLayout
from fluidctl.report import facts, page
from fluidctl.report.locate import locate
from fluidctl.telemetry import Restart, Straggler
from fluidctl.telemetry.steptimes import (MIN_RECORDS, StepHistory, capacity, interval_of,
                                          read_history)

MS = 1_000_000


def sums(count, compute_ms, wait_ms, data_ms=0):
    return Sample(count, compute_ms * MS, wait_ms * MS, data_ms * MS, 0, -1)


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


def test_an_interval_is_per_collective_and_a_restart_gives_none():
    got = interval_of(sums(10, 100, 400, 50), sums(20, 200, 900, 80))
    assert got == [10, 60.0, 10.0, 3.0]          # (100 + 500) / 10, 100 / 10, 30 / 10
    assert interval_of(sums(20, 200, 900), sums(3, 5, 9)) is None       # a new attempt
    assert interval_of(sums(20, 200, 900), sums(20, 200, 900)) is None   # nothing done


def test_marks_give_the_step_and_the_rank_s_own_time():
    def marked(times_ms):
        marks = tuple((seq, int(t * MS)) for seq, t in enumerate(times_ms, start=1))
        return Sample(len(times_ms), 0, 0, 0, 0, -1, FLIGHT_RECORDER, marks)
    fast = marked([0, 100, 200, 300, 400])
    slow = marked([40, 140, 240, 340, 440])     # reaches each collective 40 ms after
    zero = Sample(0, 0, 0, 0, 0, -1, FLIGHT_RECORDER, ())
    peers = {0: fast, 1: slow}
    assert interval_of(zero, slow, peers) == [5, 100.0, 100.0, 0.0]
    assert interval_of(zero, fast, peers) == [5, 100.0, 60.0, 0.0]


def test_history_writes_a_record_per_interval_and_reads_back(tmp_path):
    clock, path = Clock(), tmp_path / "steptimes.jsonl"
    history = StepHistory(path, every=1.0, clock=clock)
    history({0: sums(0, 0, 0), 1: sums(0, 0, 0)})
    for i in range(1, 4):
        clock.now += 1.0
        history({0: sums(10 * i, 10 * i, 40 * i), 1: sums(10 * i, 45 * i, 5 * i, 40 * i)})
    records = read_history(path)
    assert len(records) == 3
    assert records[-1]["ranks"] == {"0": [10, 5.0, 1.0, 0.0], "1": [10, 5.0, 4.5, 4.0]}
    assert json.loads(path.read_text().splitlines()[0]) == {"every": 1.0, "capacity": 1024}
    with open(path, "a") as f:
        f.write('{"t": 12, "ranks": {"0": [1,')          # a line still being written
    assert len(read_history(path)) == 3


def test_a_long_job_s_history_stays_bounded_and_keeps_its_whole_span(tmp_path):
    clock, path = Clock(), tmp_path / "steptimes.jsonl"
    history = StepHistory(path, every=1.0, clock=clock)
    ranks = 4
    history({r: sums(0, 0, 0) for r in range(ranks)})
    start = clock.now
    for i in range(1, 5001):
        clock.now += 1.0
        history({r: sums(10 * i, 10 * i * (r + 1), 10 * i) for r in range(ranks)})
    records = read_history(path)
    assert len(records) <= capacity(ranks) and len(records) >= capacity(ranks) // 2
    assert clock.now - history.every < records[-1]["t"] <= clock.now    # up to the last
    assert records[0]["t"] - records[0]["dt"] == pytest.approx(start, abs=history.every)
    assert sum(r["ranks"]["0"][0] for r in records) == pytest.approx(10 * 5000, rel=0.01)
    assert {r["ranks"]["3"][2] for r in records} == {4.0}       # merging keeps the averages
    assert path.stat().st_size < 200_000


def test_capacity_shrinks_with_the_job_but_not_below_a_floor():
    assert capacity(4) == 1024 and capacity(100_000) == MIN_RECORDS
    assert capacity(1024) * 1024 <= 262_144 and capacity(4096) == 64


LAUNCH = """\
2026-01-02 10:00:00 fluidctl job over local: 2 trainer(s) on 1 node(s), mode collective, \
master 127.0.0.1:1234, argv ['python', 'train.py']
2026-01-02 10:00:00 attempt 0: started trainer 0 pid 5 on 127.0.0.1, trainer 1 pid 6 on 127.0.0.1
2026-01-02 10:00:07 attempt 0: trainer 1 on 127.0.0.1 failed: exit code 3 (log mylog/workerlog.1)
2026-01-02 10:00:07 restart 1 of 1: trainer 1 on 127.0.0.1 failed (exit code 3)
2026-01-02 10:00:07 attempt 1: started trainer 0 pid 7 on 127.0.0.1, trainer 1 pid 8 on 127.0.0.1
2026-01-02 10:00:09 received SIGTERM: stopping the job
not a stamped line
2026-01-02 10:00:10 exit code 143
"""


def _log_dir(tmp_path, launch=LAUNCH, events=()):
    layout = LogLayout(tmp_path / "mylog")
    layout.root.mkdir()
    layout.launch.write_text(launch)
    layout.events.write_text("".join(json.dumps(e.record()) + "\n" for e in events)
                             + '{"event": "from_a_newer_fluidctl", "time": 1}\n')
    layout.endpoints.write_text("master 127.0.0.1:1234\nTRAINER 0 127.0.0.1 127.0.0.1:5000\n"
                                "TRAINER 1 node2 node2:5001\n")
    return layout


def test_a_log_dir_reads_into_plan_timeline_and_exit(tmp_path):
    restart_at = time.mktime(time.strptime("2026-01-02 10:00:07", "%Y-%m-%d %H:%M:%S")) + 0.6
    restart = Restart(attempt=1, of=1, label="trainer 1", host="127.0.0.1",
                      reason="exit code 3", time=restart_at)
    got = facts.read(_log_dir(tmp_path, events=[restart]))
    assert (got.plan.backend, got.plan.trainers, got.plan.mode) == ("local", 2, "collective")
    assert got.plan.procs[1] == ("TRAINER", 1, "node2", "node2:5001")
    assert got.hosts == {0: "127.0.0.1", 1: "node2"} and got.ranks == [0, 1]
    kinds = [m.kind for m in got.marks]
    assert kinds == ["attempt", "end", "restart", "attempt", "preempt", "exit"]
    times = [m.time for m in got.marks]
    assert times == sorted(times)          # attempt 1 (10:00:07) after the restart (.6)
    assert got.marks[3].time >= restart_at and got.marks[3].attempt == 1
    assert got.exit_code == 143 and not got.running and got.failure is None


def test_events_launch_log_does_not_hold_go_in_by_time(tmp_path):
    straggler = Straggler(kind="data", ranks=(1,), hosts={}, links=(), slow_s=0.05,
                          normal_s=0.0, collective_s=0.05, collectives=8, at_collective=20,
                          evidence="", line="fluidctl: straggler: rank 1 ...",
                          time=time.mktime((2026, 1, 2, 10, 0, 3, 0, 0, -1)))
    got = facts.read(_log_dir(tmp_path, events=[straggler]))
    assert [m.kind for m in got.marks][:3] == ["attempt", "straggler", "end"]
    assert got.marks[1].ranks == (1,)


def test_failure_json_that_is_not_an_object_is_no_failure(tmp_path):
    layout = _log_dir(tmp_path)
    layout.failure_json.write_text("[1, 2")
    assert facts.read_failure(layout) is None
    layout.failure_json.write_text('{"exit_code": 3, "first_failure": null}')
    assert facts.read_failure(layout)["exit_code"] == 3


def test_a_running_job_has_no_exit_yet(tmp_path):
    layout = _log_dir(tmp_path, launch=LAUNCH.split("2026-01-02 10:00:07")[0])
    layout.job_state.write_text('{"pid": 1}')
    got = facts.read(layout)
    assert got.running and got.exit_code is None and [m.kind for m in got.marks] == ["attempt"]


def test_locate_takes_a_log_dir_and_refuses_what_is_not_a_job(tmp_path):
    layout = _log_dir(tmp_path)
    assert locate(str(layout.root)).root == layout.root
    (tmp_path / "empty").mkdir()
    (tmp_path / "file").write_text("x")
    for bad, said in ((tmp_path / "empty", "holds no job's logs"), (tmp_path / "file",
                                                                    "is a file"),
                      (tmp_path / "gone", "no job")):
        with pytest.raises(UsageError, match=said):
            locate(str(bad))


def test_the_page_escapes_what_the_job_wrote(tmp_path):
    layout = _log_dir(tmp_path)
    layout.failure_json.write_text(json.dumps({
        "exit_code": 1, "processes": [],
        "first_failure": {"label": "trainer 0", "host": "h", "reason": "exit code 1",
                          "when": 1.0, "log_tail": ['<script src="https://x/y.js"></script>']}}))
    html = page.render(facts.read(layout), {})
    assert "<script" not in html and "&lt;script src=&quot;https://x/y.js&quot;" in html


def test_a_slurm_job_id_is_found_through_its_record(tmp_path, monkeypatch):
    """As ``fluidctl job`` finds a submitted job: its record (in FLUIDCTL_STATE_DIR, never
    the user's ~/.fluidctl) names its own log dir; before the job wrote there, one line."""
    from fluidctl.backends.slurm.slurmctl import JobRecord
    monkeypatch.setenv("FLUIDCTL_STATE_DIR", str(tmp_path / "state"))
    run = LogLayout(tmp_path / "mylog").slurm_job("4321")
    JobRecord("4321", "train", "train.py", str(tmp_path / "mylog"), str(tmp_path), 2, 1,
              run_dir=str(run.root)).save()
    with pytest.raises(UsageError, match="has left no logs yet"):
        locate("4321")
    run.root.mkdir(parents=True)
    run.launch.write_text(LAUNCH)
    assert locate("4321").root == run.root
    with pytest.raises(UsageError, match="no job 999 was submitted"):
        locate("999")
    with pytest.raises(UsageError, match="cannot read Kubernetes jobs"):
        locate("pytorchjob/bert")


def test_without_matplotlib_the_report_says_what_to_install(tmp_path, monkeypatch):
    import sys
    from fluidctl.report.make import make
    layout = _log_dir(tmp_path)
    monkeypatch.setitem(sys.modules, "matplotlib", None)       # as if not installed
    with pytest.raises(UsageError, match="needs matplotlib") as raised:
        make(str(layout.root))
    assert "fluidctl[report]" in raised.value.one_line()
    assert not (layout.root / "report.html").exists()


def test_a_job_run_again_in_the_log_dir_goes_on_with_its_history(tmp_path):
    clock, path = Clock(), tmp_path / "steptimes.jsonl"
    for run in range(2):                 # a requeued job: a new launcher, the same LOG_DIR
        history = StepHistory(path, every=1.0, clock=clock)
        history({0: sums(0, 0, 0)})
        for i in range(1, 4):
            clock.now += 1.0
            history({0: sums(10 * i, 10 * i, 10 * i)})
    records = read_history(path)
    assert len(records) == 6 and [r["t"] for r in records] == sorted(r["t"] for r in records)


def test_a_history_that_cannot_be_written_stops_quietly(tmp_path):
    """The straggler watcher calls it: nothing it meets may raise into the watcher."""
    clock = Clock()
    history = StepHistory(tmp_path / "gone" / "steptimes.jsonl", clock=clock)
    history({0: sums(0, 0, 0)})
    clock.now += 2
    history({0: sums(10, 10, 10)})
    assert history.failed
    odd = StepHistory(tmp_path / "steptimes.jsonl", clock=clock)
    odd({0: sums(0, 0, 0)})
    clock.now += 2
    odd({0: "not a sample"})
    assert odd.failed


def test_a_hang_shows_its_verdict_and_its_stack_summary(tmp_path):
    layout = _log_dir(tmp_path)
    layout.failure_json.write_text(json.dumps({
        "exit_code": 1, "first_failure": None, "processes": [],
        "hang": {"why": "no progress for 30s", "sentence": "rank 1 is dead; the others wait",
                 "summary": ["rank 0: in allreduce"]}}))
    where = layout.root / "hang-20260102-100009"
    where.mkdir()
    (where / "summary.txt").write_text("hang after 30s\n  rank 0: allreduce (wait.py:12)\n")
    html = page.render(facts.read(layout), {})
    assert 'id="hang">hang: rank 1 is dead; the others wait<' in html
    assert "hang-20260102-100009/summary.txt" in html and "allreduce (wait.py:12)" in html
