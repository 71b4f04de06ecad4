"""A hang or a failure in one sentence: its class, the ranks and hosts, and the evidence.

The evidence of a hang is what the launcher can see without changing the script, per rank
(``Evidence``): its main-thread stack (py-spy, else the runtime's faulthandler signal), its
process state and CPU use while the stacks were taken (/proc/PID/stat), and, for scripts that
use fluidctl.runtime, how many collectives it completed (its progress counter), so the one it
waits in is number count + 1. ``classify`` reads them in this order:

- dead peer: a rank is stopped (SIGSTOP, a debugger, a frozen cgroup), a zombie, or exited,
  while the others wait for it;
- frozen node: a rank's node went silent, yet its link is up (it accepts a new TCP connection)
  and nothing on it answers (its processes are stopped: a frozen cgroup, a kernel or
  hypervisor stall);
- partition: a rank's node did not answer the request for its stack;
- desync: ranks wait in different collectives (another name or another number), or a rank
  idles outside any collective (it skipped the one the others wait in);
- slow data: a rank is inside its data loader (a frame of torch's DataLoader, fluidctl's
  ShardReader, or a function of the script named like load/read/fetch/batch);
- slow compute: a rank is busy in its own code (at least half a core) while the others wait;
- stuck: every rank waits in the same collective (no rank is missing from it: the transport
  makes no progress).

When every rank is busy in its own code and none waits in a collective, nobody is stuck: the
verdict says so (``hung`` False) and the launcher keeps watching instead of stopping the job
(a long silent step, or ranks still importing on a crowded machine).

A failure the runtime raised on every rank (``CollectiveError``: its metadata agreement found
ranks in different collectives, or different shapes/dtypes in the same one) is classed by
``classify_failure`` as desync or mismatch.

Standard library only (node agents import the diagnostics package).
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence, Tuple

from fluidctl.diagnostics.stacks import Frame, _is_user, rank_list

BUSY = 0.5          # CPU (cores) from which a rank counts as computing, not waiting

DEAD_PEER, PARTITION, DESYNC, MISMATCH = "dead peer", "partition", "desync", "mismatch"
SLOW_DATA, SLOW_COMPUTE, STUCK = "slow data", "slow compute", "stuck"
FROZEN = "frozen node"
SSHD_GONE = "sshd gone"
IDLE = "idle"           # every rank waits, none in a collective: on something outside the job

# the collectives of fluidctl.runtime (Context/Communicator), torch.distributed, mpi4py, Paddle
COLLECTIVES = frozenset("""
    allreduce all_reduce allreduce_coalesced all_reduce_coalesced broadcast broadcast_object_list
    allgather all_gather all_gather_into_tensor all_gather_object allgather_into_tensor
    reduce_scatter reduce_scatter_tensor barrier monitored_barrier reduce gather gather_object
    scatter scatter_object_list all_to_all all_to_all_single alltoall alltoall_single send recv
    isend irecv batch_isend_irecv sendrecv Allreduce Bcast Allgather Barrier Reduce Gather
    Scatter Alltoall bcast
""".split())
# torch DDP moves its gradients inside backward (a C++ thread; the main thread waits there)
# and runs collectives of its own in forward; Paddle's DataParallel moves them inside
# Tensor.backward (its reducer's allreduce, on the main thread)
BACKWARD = frozenset(["_engine_run_backward", "run_backward"])
_PADDLE_BACKWARD = os.sep.join(("", "paddle", "base", "dygraph", "tensor_patch_methods.py"))
_DDP = os.sep.join(("", "torch", "nn", "parallel", "distributed.py"))
_DATA_FILES = (os.sep + "torch" + os.sep + "utils" + os.sep + "data" + os.sep,
               os.sep + "fluidctl" + os.sep + "runtime" + os.sep + "data.py",
               os.sep + "paddle" + os.sep + "io" + os.sep)
_IMPORTING = "<frozen importlib"     # py-spy's file of the import machinery's frames
_DATA_WORDS = frozenset("""load loader read reader fetch batch batches dataset data dataloader
    shard shards prefetch sample samples""".split())


@dataclass
class Evidence:
    """What was seen of one rank when the hang was found."""
    rank: int
    host: str = ""
    frames: Optional[List[Frame]] = None     # main thread, innermost first; None: no stack
    why: str = ""                            # why no stack
    state: str = ""                          # /proc state: R S D T t Z, exited, unreachable,
                                             # frozen (its node is silent, its link up)
    cpu: Optional[float] = None              # cores used while the stacks were taken
    count: Optional[int] = None              # collectives completed (fluidctl.runtime)
    running: Optional[float] = None          # share of state samples in R (running/runnable)
    signalled: bool = False                  # sent the stack signal (which may end a C sleep)

    @property
    def busy(self) -> bool:
        """Computing: half a core, or runnable most of the time (a crowded machine)."""
        return (self.cpu or 0.0) >= BUSY or (self.running or 0.0) >= BUSY


@dataclass
class Verdict:
    kind: str                                # one of the classes above
    sentence: str                            # "<kind>: ..." naming ranks, hosts, evidence
    ranks: List[int] = field(default_factory=list)   # the ranks at fault
    hung: bool = True                        # False: every rank computes, none waits


@dataclass(frozen=True)
class _Place:
    """Where one rank is: ``what`` is collective | data | busy | idle."""
    what: str
    name: str           # the collective's or the function's name
    site: str           # the user's file:line that called it
    number: Optional[int] = None


def _one_call_apart(places) -> bool:
    """Every rank waits in one call site's collective, some in the call after the others'
    (the runtime's numbers): on a ring, a rank finishes a collective once its own last piece
    came, and may start the next while its peer still waits for a piece lost on the way."""
    numbers = {p.number for p in places}
    return (None not in numbers and max(numbers) - min(numbers) == 1
            and len({(p.what, p.name, p.site) for p in places}) == 1)


def _short(func: str) -> str:
    return func.rsplit(".", 1)[-1]


def _user_site(frames: Sequence[Frame], start: int) -> str:
    for frame in frames[start:]:
        if _is_user(frame):
            return frame.where
    return frames[-1].where if frames else "?"


def _data_name(name: str) -> bool:
    if name in ("__next__", "__getitem__", "__iter__"):
        return True
    return any(word in _DATA_WORDS for word in name.lower().strip("_").split("_"))


def place(ev: Evidence) -> Optional[_Place]:
    frames = ev.frames
    if not frames:
        return None
    number = None if ev.count is None else ev.count + 1
    user = next((i for i, f in enumerate(frames) if _is_user(f)), len(frames))
    for i in range(user - 1, -1, -1):       # the library call nearest the user's code
        name = _short(frames[i].func)
        if name in COLLECTIVES:
            return _Place("collective", name, _user_site(frames, i + 1), number)
        if frames[i].file.endswith(_DDP) and ev.cpu is not None and not ev.busy:
            # DDP's own collectives (bucket rebuild, buffer broadcast) run in its forward
            return _Place("collective", f"DDP {name}", _user_site(frames, i + 1), number)
    if any(f.file.startswith(_IMPORTING) for f in frames[:user]):
        # the script imports a library: no data loader even where the import passes through
        # torch.utils.data (torch's import alone takes seconds on a crowded machine)
        return _Place("busy" if ev.busy else "idle", "import", _user_site(frames, 0))
    for i, frame in enumerate(frames):
        if any(p in frame.file for p in _DATA_FILES):
            return _Place("data", _short(frame.func), _user_site(frames, i + 1))
    for frame in frames[user:]:
        if _is_user(frame) and _data_name(_short(frame.func)):
            return _Place("data", _short(frame.func), frame.where)
    for i, frame in enumerate(frames):
        if not ev.busy and (_short(frame.func) in BACKWARD or (
                _short(frame.func) == "backward" and frame.file.endswith(_PADDLE_BACKWARD))):
            return _Place("collective", "backward", _user_site(frames, i + 1), number)
    top = frames[user] if user < len(frames) else frames[0]
    what = "busy" if ev.busy else "idle"
    return _Place(what, _short(top.func), top.where)


def _cpu(ev: Evidence) -> str:
    if ev.cpu is None:
        return ""
    running = ("" if ev.running is None or not ev.busy
               else f", runnable in {ev.running * 100:.0f}% of samples")
    return f", {ev.cpu * 100:.0f}% CPU{running}"


def _on(evs: Sequence[Evidence]) -> str:
    hosts = list(dict.fromkeys(e.host for e in evs if e.host))
    return f" on {','.join(hosts)}" if hosts else ""


def _collective(p: _Place) -> str:
    number = f" #{p.number}" if p.number is not None else ""
    return f"{p.name}{number} ({p.site})"


def _waiters(groups: List[Tuple[_Place, List[Evidence]]]) -> str:
    parts = []
    for p, evs in groups:
        ranks = [e.rank for e in evs]
        verb = "wait" if len(ranks) > 1 else "waits"
        parts.append(f"{rank_list(ranks)} {verb} in {_collective(p)}")
    return "; ".join(parts)


def classify(evidence: Sequence[Evidence]) -> Optional[Verdict]:
    """The hang's class and sentence from every rank's evidence; None with no evidence."""
    if not evidence:
        return None
    evs = sorted(evidence, key=lambda e: e.rank)
    places = {e.rank: place(e) for e in evs}
    waiting: Dict[_Place, List[Evidence]] = {}
    for e in evs:
        p = places[e.rank]
        if p is not None and p.what == "collective":
            waiting.setdefault(p, []).append(e)
    groups = sorted(waiting.items(), key=lambda kv: (-len(kv[1]), kv[1][0].rank))
    tail = f"; {_waiters(groups)}" if groups else ""

    dead = [e for e in evs if e.state in ("T", "t", "Z", "exited")]
    if dead and all(e.state == "exited" for e in evs):
        return Verdict(DEAD_PEER, "every rank has exited: the job is ending, not hung",
                       [], hung=False)
    live = [e for e in evs if e not in dead]
    if dead and not groups and live and all(places[e.rank] is not None and
                                            places[e.rank].what == "busy" for e in live):
        # nobody waits for the missing rank: the others compute (a job ending rank by rank)
        return Verdict(DEAD_PEER, f"{rank_list([e.rank for e in dead])} ended while "
                       f"{rank_list([e.rank for e in live])} compute and none waits for it: "
                       "not a hang", [e.rank for e in dead], hung=False)
    if dead:
        words = {"T": "is stopped (SIGSTOP or a frozen cgroup)", "t": "is stopped by a debugger",
                 "Z": "has exited (a zombie)", "exited": "has exited"}
        said = "; ".join(f"{rank_list([e.rank])}{_on([e])} {words[e.state]}"
                         + (f" ({e.why})" if e.why and e.state == "exited" else "")
                         for e in dead)
        return Verdict(DEAD_PEER, f"{DEAD_PEER}: {said}{tail}", [e.rank for e in dead])

    frozen = [e for e in evs if e.state == "frozen"]
    if frozen:
        hosts = list(dict.fromkeys(e.host or "?" for e in frozen))
        verb = "is" if len(hosts) == 1 else "are"
        return Verdict(FROZEN, f"{FROZEN}: {rank_list([e.rank for e in frozen])} on "
                       f"{','.join(hosts)} {verb} alive but silent: {frozen[0].why}{tail}",
                       [e.rank for e in frozen])

    lost = [e for e in evs if e.state == "unreachable"
            or (e.frames is None and "did not answer" in e.why)]
    if lost:
        hosts = list(dict.fromkeys(e.host or "?" for e in lost))
        if all("Connection refused" in e.why for e in lost):     # their kernels answered
            return Verdict(SSHD_GONE, f"{SSHD_GONE}: {rank_list([e.rank for e in lost])} on "
                           f"{','.join(hosts)}: the node is up, its sshd refuses "
                           f"({lost[0].why}){tail}", [e.rank for e in lost])
        return Verdict(PARTITION, f"{PARTITION}: {rank_list([e.rank for e in lost])} on "
                       f"{','.join(hosts)} cannot be reached ({lost[0].why}){tail}",
                       [e.rank for e in lost])

    others = [e for e in evs if places[e.rank] is not None
              and places[e.rank].what != "collective"]
    ahead = ""
    if not others and len(groups) > 1 and _one_call_apart([p for p, _ in groups]):
        # those one call ahead finished the call the others still wait in: nobody is missing
        # from it, its last pieces were lost on the way (a cut path), not a desync
        first = min((p for p, _ in groups), key=lambda p: p.number)
        ahead = [e.rank for p, g in groups if p != first for e in g]
        ahead = (f"; {rank_list(ahead)} finished {'their' if len(ahead) > 1 else 'its'} part "
                 f"of it and {'wait' if len(ahead) > 1 else 'waits'} in #{first.number + 1}")
        groups = [(first, sorted((e for _, g in groups for e in g), key=lambda e: e.rank))]
    if not others:
        if len(groups) > 1:
            odd = [e.rank for _, evs_ in groups[1:] for e in evs_]
            parts = [f"{rank_list([e.rank for e in g])} "
                     f"{'wait' if len(g) > 1 else 'waits'} in {_collective(p)}"
                     + ("" if i == 0 else _on(g)) for i, (p, g) in enumerate(groups)]
            return Verdict(DESYNC, f"{DESYNC}: " + "; ".join(parts), odd)
        if groups:
            p, g = groups[0]
            cpu = max((e.cpu or 0.0) for e in g)
            return Verdict(STUCK, f"{STUCK}: every rank waits in {_collective(p)}{_on(g)}, "
                           f"at most {cpu * 100:.0f}% CPU: no rank is missing from it, its "
                           f"transport makes no progress (a link or a peer's network){ahead}",
                           [e.rank for e in g])
        return None

    if not groups and len(others) == len(evs) and all(places[e.rank].what == "busy"
                                                      for e in others):
        # nobody waits for anybody: a long silent step, or start-up on a crowded machine
        p = places[evs[0].rank]
        return Verdict(SLOW_COMPUTE, f"{SLOW_COMPUTE}: every rank is busy and none waits "
                       f"({rank_list([e.rank for e in evs])}{_on(evs)}; rank {evs[0].rank} in "
                       f"{p.name} at {p.site}{_cpu(evs[0])}): not a hang",
                       [e.rank for e in evs], hung=False)
    if not groups and len(others) == len(evs) and all(places[e.rank].what == "idle"
                                                      for e in others):
        return _every_rank_idles(evs, places)
    for kind, what in ((SLOW_DATA, "data"), (SLOW_COMPUTE, "busy"), (DESYNC, "idle")):
        hit = [e for e in others if places[e.rank].what == what]
        if not hit:
            continue
        p = places[hit[0].rank]
        who = f"{rank_list([e.rank for e in hit])}{_on(hit)}"
        verb = "is" if len(hit) == 1 else "are"
        if kind == SLOW_DATA:
            text = f"{who} {verb} in its data loader ({p.name} at {p.site}{_cpu(hit[0])})"
        elif kind == SLOW_COMPUTE:
            text = f"{who} {verb} busy in user code ({p.name} at {p.site}{_cpu(hit[0])})"
        else:
            missed = f" {_collective(groups[0][0])}" if groups else " the collective"
            text = (f"{who} never reached{missed}: {verb} idle outside any collective "
                    f"({p.name} at {p.site}{_cpu(hit[0])})")
        return Verdict(kind, f"{kind}: {text}{tail}", [e.rank for e in hit])
    return None


def _every_rank_idles(evs: Sequence[Evidence], places: Dict[int, "_Place"]) -> Verdict:
    """No rank computes and none is in a collective: not a desync (there is no collective to
    miss) but a job waiting on something else (a lock, a file, a service, a peer it polls)."""
    at: Dict[Tuple[str, str], List[Evidence]] = {}
    for e in evs:
        at.setdefault((places[e.rank].name, places[e.rank].site), []).append(e)
    if len(at) == 1:
        (name, site), group = next(iter(at.items()))
        said = f"every rank idles in {name} ({site}{_cpu(group[0])}{_on(group)})"
    else:
        said = "; ".join(f"{rank_list([e.rank for e in g])} "
                         f"{'idle' if len(g) > 1 else 'idles'} in {name} ({site}{_on(g)})"
                         for (name, site), g in at.items())
    return Verdict(IDLE, f"{IDLE}: {said}: no rank computes and none is in a collective (it "
                   "waits on something outside the collectives: a lock, a file, a service)",
                   [e.rank for e in evs])


# --- a node whose connection died ------------------------------------------------------------

def lost_node(host: str, probe: str) -> Optional[Verdict]:
    """A node whose SSH connection died before any hang timeout, from the probe of its link
    (``backends.ssh.diagnostics.probe_link``: "frozen: ..." when a new TCP connection is
    accepted but nothing answers, the failed connection when it is not): frozen node, sshd gone (refused:
    the node's kernel answered) or partition (no answer at all); None
    when its sshd answers or the probe could not tell."""
    if probe.startswith("frozen: "):
        return Verdict(FROZEN, f"{FROZEN}: {host} is alive but silent: {probe[len('frozen: '):]}")
    if probe.startswith("a new TCP connection") and "(Connection refused)" in probe:
        return Verdict(SSHD_GONE, f"{SSHD_GONE}: {host} is up but refused a new connection "
                       f"({probe}): its kernel answered, sshd is not listening (restart it, or "
                       "check Port in the ssh config)")
    if probe.startswith("a new TCP connection") and "failed" in probe:
        return Verdict(PARTITION, f"{PARTITION}: {host} cannot be reached ({probe}): its link "
                       "is cut or the node is down")
    return None


# --- failures the runtime's metadata agreement raised ----------------------------------------

_DESYNC_TEXT = ("every rank must make the same collective calls",)
_MISMATCH_TEXT = ("shape mismatch", "dtype mismatch", "asked for op", "names root")


def classify_failure(exc_type: str, message: str, where: str = "") -> Optional[Verdict]:
    """A ``CollectiveError`` of the runtime as desync or mismatch (None for anything else)."""
    if not exc_type.endswith("CollectiveError"):
        return None
    at = f" (at {where})" if where else ""
    ranks = sorted({int(r) for r in re.findall(r"rank (\d+)", message)})
    if any(t in message for t in _DESYNC_TEXT):
        return Verdict(DESYNC, f"{DESYNC}: {message}{at}", ranks)
    if any(t in message for t in _MISMATCH_TEXT):
        return Verdict(MISMATCH, f"{MISMATCH}: {message}{at}", ranks)
    return None


def _shape(frames: Optional[Sequence[Frame]]) -> Tuple:
    """A stack as compared between two looks: every frame's function and file, every line but
    the innermost (a loop is sampled on one line or the next)."""
    if not frames:
        return ()
    return tuple((f.func, f.file) for f in frames) + tuple(f.line for f in frames[1:])


SECOND_LOOK = (DESYNC, IDLE, SLOW_COMPUTE)    # verdicts about ranks outside collectives


def second_look(verdict: Verdict, first: Sequence[Evidence], second: Sequence[Evidence]
                ) -> Verdict:
    """A desync, idle or slow-compute verdict checked against a second look at every rank (one
    sample of a rank's state can catch a computing rank paused or descheduled on a crowded
    machine): the job is not hung when a collective completed between the looks, when the
    second look finds every rank busy, or when a rank at fault moved (its
    stack changed, or it ended by itself, not woken by the stack signal) or, for a desync,
    (desync, idle) computes in the second look. Otherwise the verdict stands."""
    if not verdict.hung or verdict.kind not in SECOND_LOOK:
        return verdict
    before = {e.rank: e for e in first}
    after = {e.rank: e for e in second}

    def not_hung(why: str) -> Verdict:
        return Verdict(verdict.kind, f"{verdict.sentence}; but {why} between two looks: not "
                       "a hang", verdict.ranks, hung=False)

    counted = [r for r, e in after.items() if r in before and e.count is not None
               and before[r].count is not None and e.count != before[r].count]
    if counted:
        return not_hung(f"{rank_list(counted)} completed a collective")
    again = classify(second)
    if again is not None and not again.hung and again.kind == SLOW_COMPUTE:
        return not_hung(again.sentence)
    moved, computing = [], []
    for rank in verdict.ranks:
        one, two = before.get(rank), after.get(rank)
        if one is None or two is None:
            continue
        if two.state == "exited" and not (one.signalled or two.signalled):
            moved.append(rank)              # it ended by itself: not hung
        elif one.frames and two.frames and _shape(one.frames) != _shape(two.frames):
            moved.append(rank)
        elif verdict.kind in (DESYNC, IDLE) and two.busy:
            computing.append(rank)
    if moved:
        return not_hung(f"the stack of {rank_list(moved)} moved")
    if computing:
        return not_hung(f"{rank_list(computing)} computes{_cpu(after[computing[0]])}")
    return verdict
