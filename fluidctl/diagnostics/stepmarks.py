"""Step marks: the straggler report's numbers for unmodified torch and Paddle scripts.

``fluidctl/diagnostics/inject/sitecustomize.py`` calls ``install_torch`` once the script imported
``torch.distributed``, ``install_paddle`` once it imported ``paddle``; both write the rank's
``steps.<rank>`` page (layout in ``stragglers``) with *marks*: (seq, wall-clock epoch ns) of
the collectives the rank reached, and the time its data loader's ``next`` took (``DATA``).

- torch: its Flight Recorder (``TORCH_FR_BUFFER_SIZE``, set by the launcher) stamps every
  collective with ``collective_seq_id`` (the same numbering on every rank) and the time it was
  called. A daemon thread dumps it every ``POLL`` seconds, on the wall clock's multiples of
  ``POLL`` (every rank's dump then holds about the same collectives), and marks the new ones:
  the dump and the marks cost nothing on a collective's own path, but the Flight Recorder
  itself does (it records each call's Python stack: bench/step_markers.py). Without a Flight
  Recorder (an older torch), or with FLUIDCTL_STEP_HOOKS=backward, ``torch.autograd.backward``
  is marked instead (seq: the backward count; one mark per step).
- Paddle (no Flight Recorder): ``paddle.Tensor.backward`` is marked.
- data: ``__next__`` of the frameworks' DataLoader iterators is timed (a class attribute, looked
  up per call, so iterators made before still count).

Standard library only at import; never raises into the script: the first error stops the hooks
with one line on stderr.
"""
from __future__ import annotations

import collections
import os
import sys
import threading
import time
from typing import Optional

from fluidctl import envs
from fluidctl.diagnostics import progress, stragglers as st

POLL = st.POLL              # seconds between Flight Recorder dumps
BACKWARD = "backward"       # FLUIDCTL_STEP_HOOKS=backward: torch too marks backward calls
LOADS = 256                 # data-loader calls remembered (a dump comes every POLL seconds)
_now = time.perf_counter_ns
_wall = time.time_ns


class Marks:
    """The rank's ``steps.<rank>`` page, written with marks."""

    def __init__(self, diag, rank: int, source: int):
        self._map = progress.map_shared(diag.steps(rank), st.SLOTS * 8)
        self.slots = memoryview(self._map).cast("q")
        self.slots[st.PEER] = -1
        self.slots[st.SOURCE] = source
        # the data loader's time goes where the reader sees it with the matching COUNT
        self.data_slot = st.DATA_LIVE if source == st.FLIGHT_RECORDER else st.DATA
        # Flight Recorder: (epoch ns a data-loader call ended, DATA_LIVE then), for ``data_by``
        self.loads = collections.deque(maxlen=LOADS) if source == st.FLIGHT_RECORDER else None

    def time_of(self, seq: int) -> int:
        """The epoch ns collective ``seq`` was marked at (the newest MARKS only)."""
        return self.slots[st.MARK0 + 2 * (seq % st.MARKS) + 1]

    def loaded(self, took: int) -> None:
        """A data-loader call that took ``took`` ns has just ended."""
        self.slots[self.data_slot] += took
        if self.loads is not None:
            self.loads.append((_wall(), self.slots[self.data_slot]))

    def data_by(self, ns: int) -> int:
        """The data loader's time over the calls that ended by ``ns`` (the newest mark's time):
        published with that mark's COUNT, the page's data and collectives end at the same
        instant, however late the dump thread runs (a loader that sleeps once a step, read
        over a window of a few collectives, is otherwise off by one sleep and can read as
        slow compute)."""
        for ended, total in reversed(tuple(self.loads or ())):
            if ended <= ns:
                return total
        return self.slots[st.DATA]          # none that recent: what was published stands

    def mark(self, seq: int, ns: int) -> None:
        """Collective ``seq`` reached at ``ns`` (epoch). The pair's seq is cleared while its
        time changes, so a reader sees the old pair, no pair, or the new one (or a torn one
        whose time is later than the next pair's, which ``stragglers.marks_of`` drops)."""
        slots, i = self.slots, st.MARK0 + 2 * (seq % st.MARKS)
        slots[i] = 0
        slots[i + 1] = ns
        slots[i] = seq
        if seq > slots[st.COUNT]:
            slots[st.COUNT] = seq


_marks: Optional[Marks] = None
_failed = False
_halt = threading.Event()           # the torch poller stops


def _fail(exc: BaseException) -> None:
    """The hooks stop for good, with one line (the job goes on)."""
    global _failed, _marks
    if not _failed:
        _failed, _marks = True, None
        print(f"fluidctl: step marks off in this rank: {type(exc).__name__}: {exc}",
              file=sys.stderr, flush=True)


def stop() -> None:
    """No more marks in this process (``fluidctl.runtime`` times its collectives itself)."""
    global _marks, _failed
    _marks, _failed = None, True
    _halt.set()


def _open(rank: int, source: int) -> Optional[Marks]:
    global _marks
    if _marks is None and not _failed and getattr(st, "_recorder", None) is None:
        diag = progress.diag_of(None)
        if diag is not None:
            try:
                _marks = Marks(diag, rank, source)
            except (OSError, ValueError) as exc:
                _fail(exc)
    return _marks


def _forked() -> None:
    """A forked child (a data-loader worker) is not the rank: it writes nothing."""
    global _marks, _failed
    _marks, _failed = None, True


os.register_at_fork(after_in_child=_forked)


def _env_rank() -> int:
    return int(os.environ.get(envs.TRAINER_ID) or os.environ.get(envs.TORCH_RANK) or 0)


# --- data loaders ----------------------------------------------------------------------------

def time_next(cls) -> None:
    """``cls.__next__`` adds the time each call takes to the rank's data time."""
    inner = cls.__next__
    if getattr(inner, "_fluidctl_timed", False):
        return

    def __next__(self):
        began = _now()
        try:
            return inner(self)
        finally:
            marks = _marks
            if marks is not None:
                marks.loaded(_now() - began)
    __next__._fluidctl_timed = True         # type: ignore[attr-defined]
    cls.__next__ = __next__


# --- backward markers (Paddle; torch without a Flight Recorder) ------------------------------

def mark_calls(owner, name: str, rank, source: int) -> None:
    """``owner.name`` marks each call: seq = calls so far, at the time of the call."""
    inner = getattr(owner, name)
    if getattr(inner, "_fluidctl_marked", False):
        return
    count = [0]

    def marked(*args, **kwargs):
        try:
            marks = _marks or _open(rank(), source)
            if marks is not None:
                count[0] += 1
                marks.mark(count[0], _wall())
        except Exception as exc:        # never into the script
            _fail(exc)
        return inner(*args, **kwargs)
    marked._fluidctl_marked = True          # type: ignore[attr-defined]
    marked.__wrapped__ = inner              # type: ignore[attr-defined]
    marked.__doc__, marked.__name__ = inner.__doc__, getattr(inner, "__name__", name)
    setattr(owner, name, marked)


# --- torch -----------------------------------------------------------------------------------

def install_torch() -> None:
    """After ``import torch.distributed``: wait (in a daemon thread) for the process group,
    then time the data loader and mark collectives."""
    threading.Thread(target=_guarded(_torch_main), name="fluidctl-step-marks",
                     daemon=True).start()


def _guarded(fn):
    def run():
        try:
            fn()
        except Exception as exc:        # never into the script
            _fail(exc)
    return run


def _torch_main() -> None:
    import atexit
    import torch.distributed as dist
    while not dist.is_initialized():
        if _halt.wait(POLL):
            return
    atexit.register(_halt.set)          # before torch's own exit handlers run
    from torch.utils.data import dataloader
    time_next(dataloader._BaseDataLoaderIter)
    dump = None if os.environ.get(envs.STEP_HOOKS) == BACKWARD else flight_recorder()
    if dump is None:
        import torch.autograd
        mark_calls(torch.autograd, "backward", dist.get_rank, st.MARKERS)
        _open(dist.get_rank(), st.MARKERS)
        return
    rank = dist.get_rank()
    marks = _open(rank, st.FLIGHT_RECORDER)
    newest, answered, diag = 0, 0, progress.diag_of(None)
    from fluidctl.diagnostics import collective_records as records
    while marks is not None and not _halt.wait(POLL - time.time() % POLL):
        if not dist.is_initialized():
            return
        entries = dump()
        newest = mark_dump(marks, entries, newest)
        answered = records.answer(diag, rank, entries, answered)   # a hang report asks
        marks = _marks


def flight_recorder():
    """A callable returning the Flight Recorder's entries, or None where torch has none (or
    it records nothing: TORCH_FR_BUFFER_SIZE=0)."""
    import pickle
    try:
        from torch._C._distributed_c10d import _dump_fr_trace
    except ImportError:
        return None
    if int(os.environ.get(envs.TORCH_FR_BUFFER_SIZE) or 0) <= 0:
        return None

    def entries():
        return pickle.loads(_dump_fr_trace(True, False, False)).get("entries", [])
    entries()
    return entries


def mark_dump(marks: Marks, entries, newest: int) -> int:
    """Mark a dump's new collectives and publish the data time as of the newest of them."""
    newest = mark_new(marks, entries, newest)
    if newest:
        marks.slots[st.DATA] = marks.data_by(marks.time_of(newest))
    return newest


def mark_new(marks: Marks, entries, newest: int) -> int:
    """Mark the default process group's collectives newer than ``newest``; the newest now."""
    for e in entries:
        seq = e.get("collective_seq_id", 0)
        if seq > newest and not e.get("is_p2p") and e.get("pg_id", 0) == 0:
            marks.mark(seq, e["time_created_ns"])
            newest = seq
    return newest


# --- Paddle ----------------------------------------------------------------------------------

def install_paddle() -> None:
    """After ``import paddle``: mark every ``Tensor.backward``, time the DataLoader."""
    try:
        import paddle
        from paddle.io.dataloader import dataloader_iter
        mark_calls(paddle.Tensor, "backward", _env_rank, st.MARKERS)
        for name in ("_DataLoaderIterSingleProcess", "_DataLoaderIterMultiProcess"):
            time_next(getattr(dataloader_iter, name))
    except Exception as exc:
        _fail(exc)
