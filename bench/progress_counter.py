"""What the hang watchdog costs a training step: the runtime's progress counter.

Every completed collective bumps an 8-byte counter mapped from /dev/shm (fluidctl/diagnostics/progress.py);
the launcher reads every rank's counter once per poll. Prints the median time of one bump and
of one read of all counters, over --repeat rounds.

    python bench/progress_counter.py --repeat 7
"""
import argparse
import statistics
import timeit

from fluidctl.diagnostics import progress
from fluidctl.paths import DiagDir


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--ranks", type=int, default=8, help="counters the launcher reads")
    args = parser.parse_args()
    diag = DiagDir.create()
    try:
        reporters = [progress.Reporter(diag, r) for r in range(args.ranks)]
        progress._reporter = reporters[0]
        n = 200_000
        bump = statistics.median(timeit.repeat(progress.bump, number=n, repeat=args.repeat)) / n
        m = 2_000
        read = statistics.median(timeit.repeat(lambda: progress.read_all(diag), number=m,
                                               repeat=args.repeat)) / m
        print(f"bump per collective: {bump * 1e9:.0f} ns")
        print(f"read {args.ranks} counters (one watchdog poll): {read * 1e6:.1f} us")
        for r in reporters:
            r.close()
    finally:
        progress._reporter = None
        diag.remove()


if __name__ == "__main__":
    main()
