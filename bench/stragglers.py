"""What the straggler report costs a collective: the rank's timing of each call.

fluidctl.runtime times every collective (a clock read before, one after, three stores into
shared memory: fluidctl/diagnostics/stragglers.py). Prints the median CPU time per call
(this thread's), over --repeat rounds, of:

- the recording alone (clock + record, the recorder mapped in /dev/shm);
- a world-of-one ``ctx.allreduce`` of --floats float32 with the recording (what scripts call)
  and without it (the same call as it was before: the communicator plus the progress counter);
- one ``add`` (a data-loader batch or a ring piece that streamed: one store);

and the launcher's side: one reading of --ranks ranks' sums and one verdict.

    python bench/stragglers.py --repeat 7
"""
import argparse
import os
import statistics
import time
import timeit

import numpy as np


def median_per_call(fn, number, repeat):
    """CPU time of this thread per call: what the call costs, not how long the machine's other
    work kept it waiting (this bench runs beside other work on a 2-core machine)."""
    return statistics.median(timeit.repeat(fn, number=number, repeat=repeat,
                                           timer=time.thread_time)) / number


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--floats", type=int, default=1024, help="allreduce size (float32)")
    parser.add_argument("--ranks", type=int, default=8, help="ranks the launcher reads")
    args = parser.parse_args()
    from fluidctl.paths import DiagDir
    diag = DiagDir.create()
    os.environ["FLUIDCTL_DIAG_DIR"] = str(diag.root)
    try:
        import fluidctl.runtime
        from fluidctl.diagnostics import progress, stragglers
        from fluidctl.diagnostics import stragglerwatch as sw
        ctx = fluidctl.runtime.init()
        assert stragglers._recorder is not None and progress._reporter is not None
        x = np.ones(args.floats, np.float32)
        clock, record = stragglers.clock, stragglers.record

        def recording():
            record(clock())

        def with_recording():
            ctx.allreduce(x)

        def without():              # Context.allreduce without the two lines of the recording
            out = ctx._need_comm().allreduce(x, "sum")
            progress.bump()
            return out

        n = 200_000
        alone = median_per_call(recording, n, args.repeat)
        add = median_per_call(lambda: stragglers.add(stragglers.DATA, 1), n, args.repeat)
        m = 50_000
        pairs = []
        for _ in range(args.repeat):         # interleaved, so drift hits both alike
            pairs.append((median_per_call(without, m, 1), median_per_call(with_recording, m, 1)))
        base = statistics.median(p[0] for p in pairs)
        timed = statistics.median(p[1] for p in pairs)
        others = [stragglers.Recorder(diag, r) for r in range(1, args.ranks)]
        read = median_per_call(lambda: stragglers.read_all(diag), 2_000, args.repeat)
        before = stragglers.read_all(diag)
        for r in others:
            r.collective(stragglers.clock())
        for _ in range(10):
            for r in [stragglers._recorder] + others:
                r.collective(stragglers.clock())
        now = stragglers.read_all(diag)
        verdict = median_per_call(lambda: sw.classify(before, now), 2_000, args.repeat)
        print(f"recording per collective (clock + record): {alone * 1e9:.0f} ns")
        print(f"ctx.allreduce of {args.floats} float32, world of one: "
              f"{timed * 1e6:.2f} us with the recording, {base * 1e6:.2f} us without "
              f"({(timed - base) * 1e9:+.0f} ns, {timed / base:.3f}x)")
        print(f"add (a data batch or a streamed ring piece): {add * 1e9:.0f} ns")
        print(f"launcher: read {args.ranks} ranks' sums {read * 1e6:.1f} us; "
              f"one verdict {verdict * 1e6:.1f} us")
        for r in others:
            r.close()
        fluidctl.runtime.finalize()
    finally:
        diag.remove()


if __name__ == "__main__":
    main()
