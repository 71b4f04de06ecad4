"""torch's collective records at a hang (fluidctl/diagnostics/collective_records.py): a rank's thread
answers the launcher's request once per request, and the report lines name a collective that
differs between ranks, a rank that never reached the others' collective, or nothing more when
every rank is in the same one."""
import json
import os
import time

from fluidctl.diagnostics import collective_records as records
from fluidctl.paths import DiagDir


def entry(seq, op, sizes=((4,),), dtype="Float", retired=False, pg=0):
    return {"collective_seq_id": seq, "profiling_name": f"gloo:{op}", "pg_id": pg,
            "input_sizes": [list(s) for s in sizes], "input_dtypes": [dtype] * len(sizes),
            "retired": retired, "time_created_ns": seq, "is_p2p": False}


def test_a_rank_answers_each_request_once_with_its_default_groups_last_records(tmp_path):
    diag = DiagDir(tmp_path)
    entries = [entry(s, "all_reduce", retired=True) for s in range(1, 12)] + [
        entry(12, "broadcast"), entry(3, "all_reduce", pg=1)]
    assert records.answer(diag, 2, entries, 0) == 0             # nobody asked
    assert not diag.collectives(2).exists()
    asked = records.request(diag)
    answered = records.answer(diag, 2, entries, 0)
    assert answered == os.stat(diag.collectives_request).st_mtime_ns
    got = json.loads(diag.collectives(2).read_text())
    assert [r["seq"] for r in got] == list(range(5, 13))        # the last KEEP, group 0 only
    assert got[-1] == {"seq": 12, "op": "broadcast", "sizes": [[4]], "dtypes": ["Float"],
                       "done": False, "t": 12}
    diag.collectives(2).unlink()
    assert records.answer(diag, 2, entries, answered) == answered   # asked once, answered once
    assert not diag.collectives(2).exists()
    records.answer(diag, 2, entries, 0)
    began = time.monotonic()
    found = records.collect(diag, [0, 2], asked, marked=[2])
    assert list(found) == [2] and time.monotonic() - began < 0.5   # no wait for the answered


def test_lines_name_the_differing_collective_or_the_rank_behind():
    same_number = {0: [records.record_of(entry(5, "broadcast", ((3,),), "Int"))],
                   1: [records.record_of(entry(5, "barrier", ()))],
                   2: [records.record_of(entry(5, "broadcast", ((3,),), "Int"))]}
    assert records.lines(same_number) == [
        "torch's collective records, each rank's last: ranks 0,2 #5 broadcast ([3] int), not "
        "finished; rank 1 #5 barrier, not finished",
        "  collective #5 differs between ranks: ranks 0,2 called broadcast ([3] int); rank 1 "
        "called barrier"]
    behind = {0: [records.record_of(entry(7, "all_reduce"))],
              1: [records.record_of(entry(6, "all_reduce", retired=True))]}
    assert records.lines(behind)[1] == ("  rank 1 never called collective #7, which the "
                                        "others wait in")
    stuck = {0: [records.record_of(entry(9, "all_reduce"))],
             1: [records.record_of(entry(9, "all_reduce"))]}
    assert records.lines(stuck) == ["torch's collective records, each rank's last: ranks 0,1 "
                                    "#9 all_reduce ([4] float), not finished"]
    assert records.lines({}) == [] and records.lines({0: []}) == []
