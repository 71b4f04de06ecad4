"""What the straggler marks cost an unmodified torch or Paddle rank
(fluidctl/diagnostics/stepmarks.py), with the hooks and without them in the same run:

- in line, per call (CPU time of this thread, median of --repeat rounds): a DataLoader
  ``next`` with and without its timing, a function with and without a backward marker, and a
  world-of-one torch ``all_reduce`` of --floats float32 with the Flight Recorder on
  (TORCH_FR_BUFFER_SIZE=64, what the launcher sets) and off (each in its own process);
- the poller: one Flight Recorder dump of its 64 entries and their marks, per poll (every
  0.25 s), and so per collective at a given collective rate;
- the launcher: one verdict over three ranks' rings.

    python bench/step_markers.py --repeat 7
"""
import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
import timeit

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

ALLREDUCE = r"""
import os, statistics, sys, time
import torch, torch.distributed as dist
os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=sys.argv[1], RANK="0", WORLD_SIZE="1")
torch.set_num_threads(1)
dist.init_process_group("gloo")
x = torch.ones(int(sys.argv[2]))
for _ in range(500):
    dist.all_reduce(x)
rounds = []
for _ in range(int(sys.argv[3])):
    began = time.thread_time()
    for _ in range(3000):
        dist.all_reduce(x)
    rounds.append((time.thread_time() - began) / 3000)
dump = None
if os.environ.get("TORCH_FR_BUFFER_SIZE"):
    from fluidctl.diagnostics import stepmarks, stragglers
    from fluidctl.diagnostics import stragglerwatch as sw
    from fluidctl.paths import DiagDir
    import tempfile
    marks = stepmarks.Marks(DiagDir(__import__("pathlib").Path(tempfile.mkdtemp())), 0,
                            stragglers.FLIGHT_RECORDER)
    entries = stepmarks.flight_recorder()
    polls = []
    for _ in range(int(sys.argv[3])):
        began = time.thread_time()
        for _ in range(20):
            stepmarks.mark_new(marks, entries(), 0)
        polls.append((time.thread_time() - began) / 20)
    dump = statistics.median(polls)
print(statistics.median(rounds), dump)
dist.destroy_process_group()
"""


def per_call(fn, number, repeat):
    return statistics.median(timeit.repeat(fn, number=number, repeat=repeat,
                                           timer=time.thread_time)) / number


def allreduce(port, floats, repeat, fr):
    env = {k: v for k, v in os.environ.items() if k != "TORCH_FR_BUFFER_SIZE"}
    if fr:
        env["TORCH_FR_BUFFER_SIZE"] = "64"
    env["PYTHONPATH"] = ROOT
    out = subprocess.run([sys.executable, "-c", ALLREDUCE, str(port), str(floats), str(repeat)],
                         env=env, capture_output=True, text=True, timeout=600, check=True)
    call, dump = out.stdout.split()
    return float(call), None if dump == "None" else float(dump)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--floats", type=int, default=1024, help="allreduce size (float32)")
    args = parser.parse_args()
    from fluidctl.diagnostics import stepmarks, stragglers as st
    from fluidctl.diagnostics import stragglerwatch as sw
    from fluidctl.paths import DiagDir
    from pathlib import Path

    diag = DiagDir(Path(tempfile.mkdtemp(prefix="step_markers.")))
    stepmarks._marks = stepmarks.Marks(diag, 0, st.MARKERS)

    class Plain:
        def __next__(self):
            return 1

    class Timed(Plain):
        pass
    stepmarks.time_next(Timed)

    class Owner:
        @staticmethod
        def backward():
            return None
    plain_backward = Owner.backward
    stepmarks.mark_calls(Owner, "backward", lambda: 0, st.MARKERS)
    plain_it, timed_it = Plain(), Timed()
    n = 200_000
    rows = []
    for _ in range(args.repeat):            # interleaved, so drift hits both alike
        rows.append((per_call(plain_it.__next__, n, 1), per_call(timed_it.__next__, n, 1),
                     per_call(plain_backward, n, 1), per_call(Owner.backward, n, 1)))
    med = [statistics.median(r[i] for r in rows) for i in range(4)]
    print(f"DataLoader next: {med[1] * 1e9:.0f} ns timed, {med[0] * 1e9:.0f} ns without "
          f"({(med[1] - med[0]) * 1e9:+.0f} ns per batch)")
    print(f"backward marker: {med[3] * 1e9:.0f} ns marked, {med[2] * 1e9:.0f} ns without "
          f"({(med[3] - med[2]) * 1e9:+.0f} ns per backward)")

    port = 29700 + os.getpid() % 200
    off, on = [], []
    for i in range(3):                      # interleaved processes
        off.append(allreduce(port + 2 * i, args.floats, args.repeat, False)[0])
        on.append(allreduce(port + 2 * i + 1, args.floats, args.repeat, True))
    base, fr = statistics.median(off), statistics.median(c for c, _ in on)
    dump = statistics.median(d for _, d in on)
    print(f"torch all_reduce of {args.floats} float32, world of one: {fr * 1e6:.2f} us with "
          f"the Flight Recorder, {base * 1e6:.2f} us without ({(fr - base) * 1e9:+.0f} ns, "
          f"{fr / base:.3f}x)")
    print(f"poller: one dump of 64 entries and their marks {dump * 1e3:.2f} ms CPU every "
          f"{st.POLL:g} s ({dump / st.POLL * 100:.2f}% of a core); per collective at 100 / "
          f"1000 collectives per second: {dump / (100 * st.POLL) * 1e6:.1f} / "
          f"{dump / (1000 * st.POLL) * 1e6:.1f} us")

    t0 = 1_795_000_000 * 10**9
    before = {r: st.Sample(0, 0, 0, 0, 0, -1, st.FLIGHT_RECORDER) for r in range(3)}
    now = {r: st.Sample(64, 0, 0, 0, 0, -1, st.FLIGHT_RECORDER,
                        tuple((s, t0 + s * 10**8 + (r == 2) * 6 * 10**7) for s in range(1, 65)))
           for r in range(3)}
    verdict = per_call(lambda: sw.classify(before, now), 200, args.repeat)
    print(f"launcher: one verdict over 3 ranks' 64 marks {verdict * 1e6:.0f} us")
    diag.remove()


if __name__ == "__main__":
    main()
