"""fluidctl/observe: step times from page readings, the snapshot of a log dir, the top view's
rows and the metrics text, in-process on files written here."""
import json
import os
import subprocess
import time

import pytest

from fluidctl.diagnostics.stragglers import FLIGHT_RECORDER, Sample
from fluidctl.observe import live, snapshot, top
from fluidctl.paths import LogLayout, write_atomic


def sample(count, compute_ms, wait_ms, data_ms=0, marks=()):
    ms = 1_000_000
    return Sample(count, compute_ms * ms, wait_ms * ms, data_ms * ms, 0, -1,
                  FLIGHT_RECORDER if marks else 0, tuple(marks))


def test_runtime_sums_become_per_collective_times_histogram_and_shares():
    times = live.RankTimes()
    times.add(0.0, sample(10, 100, 100, 20))
    times.add(1.0, sample(20, 200, 300, 70))      # 10 collectives, 300 ms: 30 ms each
    rec = times.record()
    assert rec["p50"] == pytest.approx(0.030) and rec["p99"] == pytest.approx(0.030)
    assert rec["observed"] == 10 and rec["sum"] == pytest.approx(0.3)
    assert sum(rec["buckets"]) == 10
    assert rec["buckets"][live.BUCKETS.index(0.05)] == 10      # 30 ms: in the le=0.05 bucket
    assert rec["rate"] == pytest.approx(10.0)
    shares = rec["shares"]              # 100 ms compute (50 data) + 200 ms wait
    assert shares["data"] == pytest.approx(50 / 300)
    assert shares["compute"] == pytest.approx(50 / 300)
    assert shares["comm"] == pytest.approx(200 / 300)


def test_marks_become_step_times_once_each():
    s = 1_000_000_000
    times = live.RankTimes()
    times.add(0.0, sample(3, 0, 0, marks=[(1, 10 * s), (2, 11 * s), (3, 13 * s)]))
    times.add(1.0, sample(4, 0, 0, data_ms=500,
                          marks=[(1, 10 * s), (2, 11 * s), (3, 13 * s), (4, 17 * s)]))
    assert sorted(times.recent) == [1.0, 2.0, 4.0]      # each pair counted once
    rec = times.record()
    assert rec["p99"] == 4.0 and rec["shares"]["comm"] is None
    assert rec["shares"]["data"] == pytest.approx(0.5 / 4)


def test_percentile_by_nearest_rank():
    assert live.percentile([], 0.5) is None
    assert live.percentile(range(1, 101), 0.99) == 99
    assert live.percentile([5, 1, 3], 0.5) == 3


class _Proc:
    def __init__(self, rank, code, host="h", pid=10):
        self.rank, self.code, self.host, self.pid = rank, code, host, pid

    def poll(self):
        return self.code


class _Agent:
    rank_free = True

    def __init__(self, host, ranks, code=None, lost=""):
        self.host, self.code, self.lost, self.pid = host, code, lost, 5
        self.copies = {f"trainer {r}": f"log.{r}" for r in ranks}

    def poll(self):
        return self.code

    def lost_reason(self):
        return self.lost


def test_rank_states_from_processes_and_agents():
    states = live.rank_states([_Proc(0, None), _Proc(1, 3)], {0: "h", 1: "h"})
    assert states[0]["state"] == "running" and states[0]["pid"] == 10
    assert states[1]["state"] == "exit 3"
    agents = [_Agent("n1", [0, 1]), _Agent("n2", [2, 3], code=255, lost="no heartbeat")]
    states = live.rank_states(agents, {0: "n1", 1: "n1", 2: "n2", 3: "n2"})
    assert [states[r]["state"] for r in range(4)] == ["running", "running", "lost", "lost"]
    assert states[3]["why"] == "no heartbeat"
    mpirun = _Proc(None, None, host="here")          # one handle runs every rank
    pserver = _Proc(None, 1)
    pserver.service = True                          # its end is not the trainers'
    states = live.rank_states([mpirun, pserver], {0: "a", 1: "b"})
    assert [states[r]["state"] for r in (0, 1)] == ["running", "running"]


def test_declared_progress_and_last_line(tmp_path):
    assert snapshot.declared_progress("epoch 1 step 120/1000 loss 0.3") == (120, 1000)
    assert snapshot.declared_progress("[7/10] 3.1 it/s") == (7, 10)
    assert snapshot.declared_progress("===== fluidctl: restart 1 of 1, 2026/11/28 =====") is None
    assert snapshot.declared_progress("step 12") is None
    log = tmp_path / "workerlog.0"
    log.write_bytes(b"a\nprogress 10%\rprogress 50%\r\n\n")
    assert snapshot.last_line(log) == "progress 50%"
    assert snapshot.last_line(tmp_path / "missing") == ""


def test_events_are_read_incrementally_and_a_half_line_waits(tmp_path):
    path = tmp_path / "events.jsonl"
    events = snapshot.Events(path)
    now = time.time()
    path.write_text(json.dumps({"event": "straggler", "kind": "data", "ranks": [2],
                                "time": now}) + "\n" + '{"event": "restart", "att')
    events.update()
    assert events.counts["straggler"] == 1 and events.counts["restart"] == 0
    with open(path, "a") as f:
        f.write('empt": 1, "time": 0}\n')
        f.write(json.dumps({"event": "checkpoint", "seconds": 2.5, "step": 10}) + "\n")
        f.write(json.dumps({"event": "node_lost", "host": "n2", "why": "x"}) + "\n")
    events.update()
    assert events.counts["restart"] == 1 and events.attempt == 1
    assert events.checkpoint_seconds == [2.5]
    assert snapshot.verdict_of(2, "n1", events, now) == "slow data"
    assert snapshot.verdict_of(2, "n1", events, now + snapshot.STALE + 1) == ""
    assert snapshot.verdict_of(5, "n2", events, now) == "node lost"


def _live_job(root, ranks=4, host=None):
    layout = LogLayout(root)
    root.mkdir(exist_ok=True)
    state = {"version": 1, "pid": os.getpid(), "host": host or os.uname().nodename,
             "started": time.time() - 65, "time": time.time(), "backend": "local",
             "job": "bert", "buckets": list(live.BUCKETS), "hang_timeout": 60,
             "ranks": {str(r): {"host": "n1" if r < 2 else "n2", "pid": None,
                                "state": "running", "count": 100 + r, "p50": 0.01 * (r + 1),
                                "p99": 0.02 * (r + 1), "rate": 5.0 + r,
                                "buckets": [0] * 3 + [10] + [0] * (len(live.BUCKETS) - 3), "sum": 0.3,
                                "observed": 10,
                                "shares": {"data": 0.1, "compute": 0.6, "comm": 0.3}}
                       for r in range(ranks)}}
    for r in (0, 1):
        state["ranks"][str(r)]["usage"] = {"cpu": 50.0, "rss": 1 << 20}
    write_atomic(layout.live, json.dumps(state))
    layout.worker(0).write_text("step 100/400\n")
    return layout


def test_reader_joins_live_events_and_logs(tmp_path):
    layout = _live_job(tmp_path / "log")
    with open(layout.events, "w") as f:
        f.write(json.dumps({"event": "straggler", "kind": "compute", "ranks": [3],
                            "time": time.time()}) + "\n")
    snap = snapshot.Reader(layout.root, procs=False).read()
    assert snap["running"] and snap["job"] == "bert" and snap["world"] == 4
    assert snap["steps_per_s"] == 5.0               # the slowest rank sets the pace
    assert snap["progress"] == (100, 400)
    assert snap["eta"] == pytest.approx(300 * 65 / 100, rel=0.05)
    assert [r["verdict"] for r in snap["ranks"]] == ["", "", "", "slow compute"]
    assert snap["ranks"][0]["last_line"] == "step 100/400"
    json.dumps(snap)                                # --json prints it as it is


def test_a_job_whose_launcher_is_gone_has_ended(tmp_path):
    layout = _live_job(tmp_path / "log")
    state = json.loads(layout.live.read_text())
    dead = subprocess.Popen(["true"])
    dead.wait()
    write_atomic(layout.live, json.dumps({**state, "pid": dead.pid}))     # SIGKILLed launcher
    snap = snapshot.Reader(layout.root, procs=False).read()
    assert not snap["running"] and snap["world"] == 4 and snap["backend"] == "local"
    write_atomic(layout.live, json.dumps({**state, "ended": True}))
    assert not snapshot.Reader(layout.root, procs=False).read()["running"]


def test_an_ended_job_is_read_from_its_logs_and_failure_json(tmp_path):
    layout = LogLayout(tmp_path / "log")
    layout.create()
    for r in range(2):
        layout.worker(r).write_text(f"rank {r} done\n")
    layout.failure_json.write_text(json.dumps({"processes": [
        {"label": "trainer 1", "state": "FAILED"}]}))
    snap = snapshot.Reader(layout.root, procs=False).read()
    assert not snap["running"]
    assert [(r["rank"], r["state"]) for r in snap["ranks"]] == [(0, "ended"), (1, "failed")]


def test_top_folds_per_node_sorts_and_filters(tmp_path):
    layout = _live_job(tmp_path / "log", ranks=40)
    snap = snapshot.Reader(layout.root, procs=False).read()
    view = top.View(sort="p99", reverse=True)
    rows, folded = view.rows(snap, height=20)
    assert folded and [r["host"] for r in rows] == ["n2", "n1"]
    assert rows[0]["ranks"] == "2-39 (38)"
    rows, folded = view.rows(snap, height=100)
    assert not folded and rows[0]["rank"] == 39
    assert [r["rank"] for r in top.filter_rows(snap["ranks"], "n1", False)] == [0, 1]
    assert view.key("s") and view.sort == "cpu" and not view.key("q")
    frame = json.loads(top.as_json(snap, top.View(text="n1")))
    assert [r["rank"] for r in frame["ranks"]] == [0, 1] and "histograms" not in frame


def test_top_once_prints_a_frame_without_colour_over_a_pipe(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("NO_COLOR", "1")
    layout = _live_job(tmp_path / "log", host="elsewhere")
    from fluidctl import tables
    monkeypatch.setattr(tables, "_consoles", {})
    assert top.run(layout.root, once=True) == 0
    out = capsys.readouterr().out
    assert "job bert" in out and "backend local" in out and "\x1b[" not in out
    assert "step 100/400" in out and "ETA" in out


def test_metrics_text_has_every_rank_and_the_job_series(tmp_path):
    pytest.importorskip("prometheus_client")
    from prometheus_client import CollectorRegistry, generate_latest
    from prometheus_client.parser import text_string_to_metric_families
    from fluidctl.observe.metrics import JobCollector
    layout = _live_job(tmp_path / "log")
    registry = CollectorRegistry(auto_describe=False)
    registry.register(JobCollector(snapshot.Reader(layout.root, procs=False)))
    families = {f.name: f for f in text_string_to_metric_families(
        generate_latest(registry).decode())}
    counts = [s for s in families["fluidctl_step_seconds"].samples
              if s.name.endswith("_count")]
    assert sorted(s.labels["rank"] for s in counts) == ["0", "1", "2", "3"]
    assert {s.labels["node"] for s in counts} == {"n1", "n2"}
    assert all(s.labels["job"] == "bert" and s.labels["world"] == "4" for s in counts)
    assert all(s.value == 10 for s in counts)
    assert families["fluidctl_hang_watchdog"].samples[0].value == 1.0
    assert families["fluidctl_restarts"].samples[0].value == 0
    assert sorted(s.labels["rank"] for s in families["fluidctl_rank_rss_bytes"].samples) == \
        ["0", "1"]                       # the two ranks whose usage their agent reported


def test_the_grafana_dashboard_asks_only_for_series_the_endpoint_serves(tmp_path):
    pytest.importorskip("prometheus_client")
    import re
    from pathlib import Path
    from prometheus_client import CollectorRegistry, generate_latest
    from fluidctl.observe.metrics import JobCollector
    layout = _live_job(tmp_path / "log")
    registry = CollectorRegistry(auto_describe=False)
    registry.register(JobCollector(snapshot.Reader(layout.root, procs=False)))
    served = set(re.findall(r"^(fluidctl_\w+)", generate_latest(registry).decode(), re.M))
    dashboard = json.loads((Path(__file__).resolve().parents[2] / "templates" /
                            "grafana-fluidctl.json").read_text())
    asked = {name for panel in dashboard["panels"] for target in panel["targets"]
             for name in re.findall(r"fluidctl_\w+", target["expr"])}
    assert asked and asked <= served, asked - served


def test_an_agents_usage_sample_names_its_running_ranks():
    from fluidctl.observe import usage
    me = _Proc(3, None, pid=os.getpid())
    ended = _Proc(4, 0, pid=os.getpid())
    found = usage.sample(snapshot.Procs(), [me, ended, _Proc(None, None)])
    assert list(found) == ["3"] and found["3"]["rss"] > 0 and "cpu" in found["3"]
