"""A collective mismatch that gloo turned into an abort, read from a rank's log.

gloo (torch's and Paddle's CPU backend) does not hang when ranks pass tensors of different
sizes or dtypes to one collective: the rank that receives the odd message aborts (SIGABRT) with

    terminate called after throwing an instance of 'gloo::EnforceNotMet'
      what():  [enforce fail at .../gloo/transport/tcp/pair.cc:456] op.preamble.length <=
      op.nbytes. 1024 vs 512. Received data size doesn't match expected size. ...

(bytes of one message: what the peer sent, what this rank's own collective expected; Paddle
prints the same line without the last sentence), and its peers fail next with "Connection
reset/closed by peer". With ``TORCH_DISTRIBUTED_DEBUG=DETAIL`` torch checks every collective
first and raises instead, naming two ranks' fingerprints (op, shape, dtype):

    RuntimeError: Detected mismatch between collectives on ranks. Rank 0 is running collective:
    CollectiveFingerPrint(SequenceNumber=0, OpType=ALLREDUCE, TensorShape=[512],
    TensorDtypes=Float, ...), but Rank 1 is running collective: CollectiveFingerPrint(...)

``classify_log`` turns either into a mismatch (or, for different ops, a desync) ``Verdict``.
Standard library only (node agents import the diagnostics package).
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Tuple

from fluidctl.diagnostics.classify import DESYNC, MISMATCH, Verdict
from fluidctl.diagnostics.stacks import rank_list

_SIZE = re.compile(r"(\S*)gloo/transport/tcp/pair\.cc:\d+\] op\.preamble\.length <= "
                   r"op\.nbytes\. (\d+) vs (\d+)")
_PRINT = re.compile(r"Rank (\d+) is running collective: CollectiveFingerPrint\("
                    r"SequenceNumber=(\d+), OpType=(\w+), TensorShape=\[([^\]]*)\], "
                    r"TensorDtypes=(\w+)")
# torch's OpType names as the user called them
_OPS = {"ALLREDUCE": "all_reduce", "ALLGATHER": "all_gather", "_ALLGATHER_BASE":
        "all_gather_into_tensor", "ALLGATHER_COALESCED": "all_gather_coalesced",
        "ALLREDUCE_COALESCED": "all_reduce_coalesced", "REDUCE_SCATTER": "reduce_scatter",
        "_REDUCE_SCATTER_BASE": "reduce_scatter_tensor", "ALLTOALL": "all_to_all",
        "ALLTOALL_BASE": "all_to_all_single"}


@dataclass(frozen=True)
class SizeAbort:
    """gloo's "op.preamble.length <= op.nbytes. SENT vs EXPECTED" (bytes of one message)."""
    sent: int
    expected: int
    torch: bool         # torch's gloo (its hint applies), else Paddle's or another


@dataclass(frozen=True)
class Fingerprint:
    """One rank's collective as torch's DETAIL check printed it."""
    rank: int
    sequence: int
    op: str             # as the user called it: all_reduce, broadcast, ...
    shape: str          # "[1024]", "[2, 3]", "[]"
    dtype: str          # torch's name: Float, Double, Long, ...

    @property
    def tensor(self) -> str:
        dims = [d.strip() for d in self.shape.split(",") if d.strip()]
        size = dims[0] if len(dims) == 1 else f"[{', '.join(dims)}]"
        return f"{size} {self.dtype.lower()}s"


def size_abort(lines: Sequence[str]) -> Optional[SizeAbort]:
    """The last gloo message-size abort in ``lines``."""
    for line in reversed(lines):
        m = _SIZE.search(line)
        if m:
            return SizeAbort(int(m.group(2)), int(m.group(3)), "pytorch" in m.group(1))
    return None


def fingerprints(lines: Sequence[str]) -> List[Fingerprint]:
    """Every rank's fingerprint named by torch's DETAIL mismatch errors in ``lines`` (one per
    rank, the last one seen)."""
    seen: Dict[int, Fingerprint] = {}
    for line in lines:
        if "Detected mismatch between collectives" not in line:
            continue
        for rank, seq, op, shape, dtype in _PRINT.findall(line):
            seen[int(rank)] = Fingerprint(int(rank), int(seq), _OPS.get(op, op.lower()),
                                          shape, dtype)
    return [seen[r] for r in sorted(seen)]


def _from_fingerprints(prints: List[Fingerprint]) -> Verdict:
    """Ranks grouped by what they called; the smallest group (the odd one out) first."""
    groups: Dict[Tuple[str, int, str], List[int]] = {}
    for p in prints:
        groups.setdefault((p.op, p.sequence, p.tensor), []).append(p.rank)
    ordered = sorted(groups.items(), key=lambda kv: (len(kv[1]), kv[1][0]))
    same_call = len({(op, seq) for op, seq, _ in groups}) == 1
    kind = MISMATCH if same_call else DESYNC
    parts = [f"{rank_list(ranks)} " + ("" if same_call and i else f"called {op} ")
             + f"with {tensor}" for i, ((op, _, tensor), ranks) in enumerate(ordered)]
    return Verdict(kind, f"{kind}: {', '.join(parts)} (torch's collective check, "
                   "TORCH_DISTRIBUTED_DEBUG=DETAIL)", ordered[0][1])


def classify_log(lines: Sequence[str], rank: Optional[int] = None) -> Optional[Verdict]:
    """A mismatch (or desync) verdict from a failed rank's log lines, None when they show
    neither a DETAIL fingerprint mismatch nor gloo's message-size abort."""
    prints = fingerprints(lines)
    if len(prints) >= 2:
        return _from_fingerprints(prints)
    abort = size_abort(lines)
    if abort is None:
        return None
    who = f"rank {rank}" if rank is not None else "a rank"
    hint = ("; TORCH_DISTRIBUTED_DEBUG=DETAIL makes torch name each rank's shape and dtype"
            if abort.torch else "")
    return Verdict(MISMATCH, f"{MISMATCH}: {who} received a {abort.sent}-byte message from a "
                   f"peer where its collective expected {abort.expected} bytes, and gloo "
                   "aborted it: the ranks passed tensors of different sizes or dtypes to one "
                   f"collective (or called different collectives){hint}",
                   [rank] if rank is not None else [])
