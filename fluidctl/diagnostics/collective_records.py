"""torch's own collective records at a hang, aligned by collective number.

torch's Flight Recorder (on in every torch rank fluidctl starts: ``TORCH_FR_BUFFER_SIZE``, see
``stepmarks``) numbers each collective of the default process group the same way on every
rank (``collective_seq_id``) and keeps its name, its tensors' sizes and dtypes, and whether it
has finished (``retired``). When the launcher takes a hung job's stacks it asks for them
(``request``: the request file's time changes); each rank's step-marks thread answers within
one of its polls by writing its last ``KEEP`` records to ``collectives.<rank>`` in the
diagnostics directory (``answer``). ``lines`` puts them side by side for the hang report:
ranks in different collectives under the same number, a rank that is behind, or every rank in
the same unfinished collective.

Standard library only (ranks import it).
"""
from __future__ import annotations

import json
import os
import time
from typing import Dict, List, Sequence

from fluidctl.paths import DiagDir, write_atomic

KEEP = 8                # records per rank in its answer
ANSWER_WITHIN = 0.6     # seconds: a step-marks thread polls every 0.25 s


def record_of(entry: dict) -> dict:
    """The part of a Flight Recorder entry the report needs."""
    return {"seq": entry.get("collective_seq_id", 0),
            "op": str(entry.get("profiling_name", "")).replace("gloo:", "").replace("nccl:", ""),
            "sizes": entry.get("input_sizes") or [], "dtypes": entry.get("input_dtypes") or [],
            "done": bool(entry.get("retired")), "t": entry.get("time_created_ns", 0)}


def answer(diag: DiagDir, rank: int, entries: Sequence[dict], answered: int) -> int:
    """The rank's side, once per poll: if the launcher asked since ``answered`` (the request's
    mtime), write the default group's last records; the request's mtime now."""
    try:
        asked = os.stat(diag.collectives_request).st_mtime_ns
    except OSError:
        return answered
    if asked == answered:
        return answered
    mine = [record_of(e) for e in entries if e.get("pg_id", 0) == 0 and not e.get("is_p2p")]
    write_atomic(diag.collectives(rank), json.dumps(mine[-KEEP:]))
    return asked


def request(diag: DiagDir) -> float:
    """The launcher's side: ask every rank for its records (the request file's time changes);
    the time asked."""
    now = time.time()
    path = diag.collectives_request
    try:
        path.touch()
        os.utime(path, (now, now))
    except OSError:
        pass
    return now


def collect(diag: DiagDir, ranks: Sequence[int], asked: float, marked: Sequence[int],
            wait: float = ANSWER_WITHIN) -> Dict[int, List[dict]]:
    """The answers written since ``asked``; waits until ``wait`` seconds after it for the
    ``marked`` ranks (those whose step marks come from the Flight Recorder)."""
    found: Dict[int, List[dict]] = {}
    while True:
        for rank in ranks:
            if rank in found:
                continue
            path = diag.collectives(rank)
            try:
                if path.stat().st_mtime < asked - 0.01:
                    continue
                found[rank] = json.loads(path.read_text())
            except (OSError, ValueError):
                continue
        if all(r in found for r in marked) or time.time() >= asked + wait:
            return found
        time.sleep(0.05)


def _shape(rec: dict) -> str:
    sizes = rec.get("sizes") or []
    dtypes = rec.get("dtypes") or []
    if not sizes:
        return ""
    parts = [f"{list(s)}{' ' + str(d).lower() if d else ''}"
             for s, d in zip(sizes, dtypes + [""] * len(sizes))]
    return " (" + ", ".join(parts) + ")"


def _named(ranks: Sequence[int]) -> str:
    return ("rank " if len(ranks) == 1 else "ranks ") + ",".join(map(str, ranks))


def verdict(records: Dict[int, List[dict]]):
    """(class, sentence, ranks) from the records alone, for a hang without stacks (no py-spy,
    no fluidctl.runtime): ranks in different collectives under one number (desync), ranks
    behind the others' unfinished collective (desync), or every rank in the same unfinished
    one (stuck); None when they show none of these."""
    last = {r: recs[-1] for r, recs in records.items() if recs}
    if len(last) < 2:
        return None
    calls: Dict[int, Dict[str, List[int]]] = {}
    for rank, rec in sorted(last.items()):
        calls.setdefault(rec["seq"], {}).setdefault(rec["op"] + _shape(rec), []).append(rank)
    for seq, by_call in sorted(calls.items()):
        if len(by_call) > 1:
            said = "; ".join(f"{_named(r)} {'call' if len(r) > 1 else 'calls'} {call}"
                             for call, r in by_call.items())
            odd = min(by_call.values(), key=len)
            return ("desync", f"desync: collective #{seq} differs between ranks: {said} "
                    "(torch's collective records)", odd)
    ahead = max(rec["seq"] for rec in last.values())
    waiting = [r for r, rec in last.items() if rec["seq"] == ahead and not rec["done"]]
    behind = sorted(r for r, rec in last.items() if rec["seq"] < ahead)
    (call,) = calls[ahead]
    if waiting and behind:
        return ("desync", f"desync: {_named(behind)} never called collective #{ahead} "
                f"({call}), which {_named(waiting)} {'wait' if len(waiting) > 1 else 'waits'} "
                "in (torch's collective records)", behind)
    if not behind and waiting and len(waiting) == len(last):
        return ("stuck", f"stuck: every rank waits in collective #{ahead} ({call}) and none "
                "is missing from it (torch's collective records)", waiting)
    return None


def lines(records: Dict[int, List[dict]]) -> List[str]:
    """What the hang report says of torch's records ([] without them): each rank's last
    collective, grouped, and what that shows."""
    last = {r: recs[-1] for r, recs in records.items() if recs}
    if not last:
        return []
    groups: Dict[tuple, List[int]] = {}
    for rank in sorted(last):
        rec = last[rank]
        key = (rec["seq"], rec["op"], _shape(rec), rec["done"])
        groups.setdefault(key, []).append(rank)
    said = "; ".join(f"{_named(ranks)} #{seq} {op}{shape}, "
                     f"{'finished' if done else 'not finished'}"
                     for (seq, op, shape, done), ranks in
                     sorted(groups.items(), key=lambda kv: kv[1][0]))
    out = [f"torch's collective records, each rank's last: {said}"]
    seqs = {rec["seq"] for rec in last.values()}
    by_seq: Dict[int, Dict[str, List[int]]] = {}
    for rank, rec in last.items():
        by_seq.setdefault(rec["seq"], {}).setdefault(rec["op"] + _shape(rec), []).append(rank)
    clash = [(seq, calls) for seq, calls in sorted(by_seq.items()) if len(calls) > 1]
    if clash:
        seq, calls = clash[0]
        out.append(f"  collective #{seq} differs between ranks: " + "; ".join(
            f"{_named(sorted(r))} called {call}" for call, r in calls.items()))
    elif len(seqs) > 1 and not any(rec["done"] for rec in last.values()
                                   if rec["seq"] == max(seqs)):
        ahead = max(seqs)
        behind = sorted(r for r, rec in last.items() if rec["seq"] < ahead)
        out.append(f"  {_named(behind)} never called collective #{ahead}, which the others "
                   "wait in")
    return out
