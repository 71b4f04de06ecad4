"""The stack takers of the mpi and slurm backends (fluidctl/diagnostics/shareddir.py), run as
real processes: Open MPI's second mpirun, started beside the job's, has died of SIGSEGV at
start with nothing on stderr; the takers are then run once more, and the report says so."""
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
    d = SharedDirDiagnostics(stack_takers=lambda root: [sys.executable, str(taker), root,
                                                        str(crashes)],
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
