"""The stack takers of the mpi and slurm backends (fluidctl/diagnostics/shareddir.py), run as
real processes side by side: a taker that dies of a signal (a launcher's, at its start) is run
once more, and the report says so; one that does not end within the deadline is killed."""
import json
import os
import sys

from fluidctl.diagnostics.shareddir import SharedDirDiagnostics
from fluidctl.diagnostics.watch import StackDump

# a taker that dies of SIGSEGV on its first start, and answers for rank 0 on its second
TAKER = """
import json, os, signal, sys
root, crashes = sys.argv[1], int(sys.argv[2])
seen = os.path.join(root, "starts")
starts = int(open(seen).read()) if os.path.exists(seen) else 0
open(seen, "w").write(str(starts + 1))
if starts < crashes:
    os.kill(os.getpid(), signal.SIGSEGV)
json.dump(%s, open(os.path.join(root, "stacks.node1.json"), "w"))
"""


def diagnostics(tmp_path, crashes):
    answer = StackDump(why={0: "answered on its second start"}).to_json()
    taker = tmp_path / "taker.py"
    taker.write_text(TAKER % json.dumps(answer))
    (tmp_path / "log").mkdir()
    d = SharedDirDiagnostics(stack_takers=lambda root: [[sys.executable, str(taker), root,
                                                         str(crashes)]],
                             world=1, log_root=tmp_path / "log")
    d.diag.rank_file(0).write_text("node1 4242")
    return d


def test_takers_that_die_of_a_signal_at_start_are_run_once_more(tmp_path):
    d = diagnostics(tmp_path, crashes=1)
    try:
        dump = d.stacks([])
        assert dump.why == {0: "answered on its second start"}
        assert dump.notes == [f"the stack takers ({os.path.basename(sys.executable)}) died "
                              "of SIGSEGV and were started again"], dump.notes
        assert (d.diag.root / "starts").read_text() == "2"
    finally:
        d.close()


def test_takers_that_die_twice_leave_the_nodes_unanswered_with_the_reason(tmp_path):
    d = diagnostics(tmp_path, crashes=2)
    try:
        dump = d.stacks([])
        assert dump.why == {0: "its node (node1) did not answer"}
        assert dump.state == {0: "unreachable"}
        assert "node node1: no stacks (exit code -11)" in dump.notes, dump.notes
        assert (d.diag.root / "starts").read_text() == "2"
    finally:
        d.close()


def test_takers_run_side_by_side_and_each_nodes_answer_is_merged(tmp_path):
    """Two takers, one per node, each waiting for the other to have started: run one after
    the other they would never both answer."""
    (tmp_path / "log").mkdir()
    taker = tmp_path / "taker.py"
    taker.write_text("""
import json, os, sys, time
root, me, other = sys.argv[1:]
open(os.path.join(root, "up." + me), "w").close()
deadline = time.monotonic() + 20
while not os.path.exists(os.path.join(root, "up." + other)):
    assert time.monotonic() < deadline
    time.sleep(0.01)
rank = int(me[-1]) - 1
json.dump({"texts": {}, "method": {}, "notes": [], "why": {str(rank): "answered by " + me}},
          open(os.path.join(root, "stacks." + me + ".json"), "w"))
""")
    d = SharedDirDiagnostics(
        stack_takers=lambda root: [[sys.executable, str(taker), root, "node1", "node2"],
                                   [sys.executable, str(taker), root, "node2", "node1"]],
        world=2, log_root=tmp_path / "log")
    d.diag.rank_file(0).write_text("node1 4242")
    d.diag.rank_file(1).write_text("node2 4243")
    try:
        dump = d.stacks([])
        assert dump.why == {0: "answered by node1", 1: "answered by node2"}, dump.why
        assert dump.notes == []
    finally:
        d.close()


def test_a_taker_past_the_deadline_is_killed_and_its_node_left_unanswered(tmp_path, monkeypatch):
    from fluidctl.diagnostics import shareddir
    monkeypatch.setattr(shareddir, "STACKS_TIMEOUT", 1.0)
    (tmp_path / "log").mkdir()
    d = SharedDirDiagnostics(
        stack_takers=lambda root: [[sys.executable, "-c", "import time; time.sleep(60)"]],
        world=1, log_root=tmp_path / "log")
    d.diag.rank_file(0).write_text("node1 4242")
    try:
        dump = d.stacks([])
        assert dump.why == {0: "its node (node1) did not answer"}
        assert "node node1: no stacks (no answer within 1s)" in dump.notes, dump.notes
    finally:
        d.close()


def test_the_node_taker_does_nothing_on_the_node_the_launchers_own_taker_answers_for(
        tmp_path, monkeypatch):
    """mpi: the launcher's taker answers for the ranks mpirun started on its machine; the one
    reached over ssh on that same node (--unless-node: its name) must not signal them too."""
    from fluidctl.node import stacks
    from fluidctl.paths import DiagDir
    diag = DiagDir(tmp_path)
    monkeypatch.delenv("SLURMD_NODENAME", raising=False)
    monkeypatch.setenv("SSH_CONNECTION", "198.18.0.1 50000 198.18.0.2 22")
    assert stacks.main([str(tmp_path), "--unless-node", "198.18.0.2"]) == 0
    assert not diag.node_stacks("198.18.0.2").exists()
    assert stacks.main([str(tmp_path), "--unless-node", "198.18.0.9"]) == 0
    assert json.loads(diag.node_stacks("198.18.0.2").read_text())["texts"] == {}
    assert stacks.main([str(tmp_path), "--unless-node"]) == 2
