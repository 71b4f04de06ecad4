"""The follower of a submitted job says the straggler lines the job's own launcher appends to
its stragglers.log (fluidctl/diagnostics/followed.py): whole lines only, without their time
stamp, from the start of the next job's log after a restart, and the last ones at stop."""
from fluidctl.diagnostics.followed import FollowedDiagnostics, LogRelay

from launchutil import wait_for

LINE = "fluidctl: straggler: rank 2 (127.0.0.3) is slow data: ..."


def test_lines_are_said_whole_as_they_come_and_at_stop(tmp_path):
    first, second = tmp_path / "a.log", tmp_path / "b.log"
    where = [None]
    said = []
    relay = LogRelay(lambda: where[0], said.append, poll=0.01)
    relay.start()
    try:
        where[0] = first
        first.write_text(f"2026-11-26 03:32:52 {LINE}\n2026-11-26 03:32:53 half")
        wait_for(lambda: said, 5, "the first line")
        assert said == [LINE]
        with open(first, "a") as f:
            f.write(" a line\n")
        wait_for(lambda: len(said) == 2, 5, "the completed line")
        assert said[1] == "half a line"
        second.write_text("2026-11-26 03:40:00 next job\n")    # a restart's new submission
        where[0] = second
        wait_for(lambda: len(said) == 3, 5, "the next job's line")
    finally:
        relay.stop()
    assert said[2] == "next job"
    with open(second, "a") as f:
        f.write("2026-11-26 03:40:01 just before the end\n")
    relay.stop()                                     # a last look
    assert said[3:] == ["just before the end"]


def test_the_follower_relays_nothing_until_the_job_has_a_directory(tmp_path):
    root = [None]
    said = []
    diagnostics = FollowedDiagnostics(lambda: root[0])
    try:
        assert diagnostics.log_root is None              # its job writes LOG_DIR reports
        relay = diagnostics.watch_stragglers(lambda: [], said.append)
        relay.stop()
        assert said == []
        (tmp_path / "stragglers.log").write_text(f"2026-11-26 03:32:52 {LINE}\n")
        root[0] = tmp_path
        relay.look()
        assert said == [LINE]
    finally:
        diagnostics.close()
