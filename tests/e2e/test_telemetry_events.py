"""A real local job's events (fluidctl/telemetry): its restart, straggler and checkpoint
commit each land in LOG_DIR/events.jsonl and in launch.log, once each."""
from pathlib import Path

from launchutil import fluidctl

from fluidctl.telemetry import from_record, read_events

JOB = str(Path(__file__).parent.parent / "scripts" / "telemetry_job.py")


def test_restart_straggler_and_checkpoint_events_land_once_each(tmp_path):
    log_dir = tmp_path / "mylog"
    res = fluidctl("train", "--nproc", 2, "--max-restarts", 1, JOB, tmp_path / "ckpt",
                   log_dir / "stragglers.json", cwd=tmp_path, timeout=180)
    assert res.returncode == 0, res.stdout + res.stderr
    events = [from_record(r) for r in read_events(log_dir / "events.jsonl")]
    kinds = [e.KIND for e in events]
    assert kinds.count("restart") == 1 and kinds.count("checkpoint") == 1, kinds
    assert kinds.count("straggler") >= 1, kinds
    restart = next(e for e in events if e.KIND == "restart")
    assert (restart.attempt, restart.of, restart.label) == (1, 1, "trainer 1")
    straggler = next(e for e in events if e.KIND == "straggler")
    assert (straggler.kind, straggler.ranks) == ("data", (1,))
    commit = next(e for e in events if e.KIND == "checkpoint")
    assert commit.step == 3 and Path(commit.dir).parent == tmp_path / "ckpt"
    launch = (log_dir / "launch.log").read_text().splitlines()
    for event in events:            # each event's line once in launch.log
        assert sum(line.endswith(" " + event.log_line()) for line in launch) == 1, event
    # the console said the restart and the straggler, once each
    assert res.stdout.count("restarting the job (restart 1 of 1)") == 1
    assert res.stdout.count(straggler.line) == 1
