"""How many injected faults fluidctl's hang report classifies right: the class and the ranks
at fault in LOG_DIR/failure.json against the fault injected, and the time from the watchdog's
finding to the sentence (launch.log).

The faults are those of the fault tests, each run as its own job: the fluidctl.runtime script
tests/scripts/trouble.py (slow data, slow compute, dead peer, desync, and the two failures the
runtime raises: desync, mismatch; 3 ranks), the unmodified torch DDP script
tests/scripts/torch_hang.py (desync, dead peer) and Paddle DataParallel script
tests/scripts/paddle_hang.py (dead peer, desync), a size mismatch that gloo aborts on in torch
and in Paddle (tests/scripts/gloo_mismatch.py), all with `--nproc`; then over ssh on
namespace nodes (tests/netns.py, needs root) a cut link (partition), a frozen node and the
path between two nodes cut (stuck). The jobs of one group run side by side on this machine.

    sudo python bench/hang_accuracy.py --rounds 1 [--out DIR]

prints one line per fault and "correct N/M". --out keeps each job's stderr as DIR/<fault>.err.
"""
import argparse
import importlib.util
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from troubleutil import classified_after  # noqa: E402
SCRIPTS = ROOT / "tests" / "scripts"
TIMEOUT = 3

# name: (script, args, nproc, expected class, expected ranks)
LOCAL = [
    [("trouble-stuck", "trouble.py", ["stuck"], 3, "slow data", [1]),
     ("trouble-spin", "trouble.py", ["spin"], 3, "slow compute", [1]),
     ("trouble-stop", "trouble.py", ["stop"], 3, "dead peer", [1]),
     ("trouble-skip", "trouble.py", ["skip"], 3, "desync", [1]),
     ("trouble-desync", "trouble.py", ["desync"], 3, "desync", None),
     ("trouble-mismatch", "trouble.py", ["mismatch"], 3, "mismatch", None)],
    [("torch-uneven", "torch_hang.py", ["uneven"], 2, "desync", [1]),
     ("torch-stop", "torch_hang.py", ["stop"], 2, "dead peer", [1]),
     ("torch-gloo-mismatch", "gloo_mismatch.py", ["torch"], 3, "mismatch", None)],
    [("paddle-stop", "paddle_hang.py", ["stop"], 2, "dead peer", [1]),
     ("paddle-skip", "paddle_hang.py", ["skip"], 2, "desync", [1]),
     ("paddle-gloo-mismatch", "gloo_mismatch.py", ["paddle"], 2, "mismatch", None)],
]
NETNS = [("ssh-cut-link", "node2", "partition", [1]),
         ("ssh-frozen-node", "node4", "frozen node", [1]),
         ("ssh-cut-path", "node6", "stuck", [0, 1])]


def start(argv, log: Path, cwd: Path):
    return subprocess.Popen([sys.executable, "-m", "fluidctl", "train", "--hang-timeout",
                             str(TIMEOUT), "--log-dir", str(log), *map(str, argv)], cwd=cwd,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


def verdict(log: Path):
    """(class, ranks, seconds from finding to sentence) from the job's records."""
    try:
        record = json.loads((log / "failure.json").read_text())
    except (OSError, ValueError):
        return "(no failure.json)", None, None
    if record.get("hang"):
        try:
            took = classified_after(log)
        except (OSError, KeyError):
            took = None
        return record["hang"]["class"], record["hang"]["ranks"], took
    first = record.get("first_failure") or {}
    return first.get("kind", "(unclassified failure)"), None, None


def finish(jobs, out, results):
    for name, (proc, log, kind, ranks) in jobs.items():
        try:
            _, err = proc.communicate(timeout=300)
        finally:
            proc.kill()
        got, got_ranks, took = verdict(log)
        ok = got == kind and (ranks is None or got_ranks == ranks)
        results.append(ok)
        said = f"{took:.0f}s after the finding" if took is not None else ""
        print(f"{'ok  ' if ok else 'MISS'} {name:18} want {kind} {ranks or ''}, got {got} "
              f"{got_ranks or ''} {said}", flush=True)
        if out:
            (out / f"{name}.err").write_text(err)


def local_round(work: Path, out, results):
    for group in LOCAL:
        jobs = {}
        for name, script, args, nproc, kind, ranks in group:
            framework = name.split("-")[0]         # torch-..., paddle-...
            if script != "trouble.py" and importlib.util.find_spec(framework) is None:
                print(f"skip {name}: {framework} not installed")
                continue
            log = work / name
            jobs[name] = (start(["--nproc", nproc, SCRIPTS / script, *args], log, work), log,
                          kind, ranks)
        finish(jobs, out, results)


def netns_round(work: Path, out, results):
    import netns
    from launchutil import wait_for
    why = netns.available()
    if why:
        print(f"skip the namespace-node faults: {why}")
        return
    nodes = netns.NetnsNodes.start(work / "nodes", 6)
    try:
        faults = {"ssh-cut-link": nodes.link_down, "ssh-frozen-node": nodes.freeze,
                  "ssh-cut-path": lambda alias: nodes.cut_between("node5", alias)}
        jobs = {}
        for k, (name, alias, kind, ranks) in enumerate(NETNS):
            hosts = work / f"hosts-{name}"
            hosts.write_text(f"node{2 * k + 1} slots=1\nnode{2 * k + 2} slots=1\n")
            log = work / name
            jobs[name] = (start(["--hostfile", hosts, "--ssh-config", nodes.config,
                                 SCRIPTS / "trouble.py", "busy", 600], log, work),
                          log, kind, ranks)
        for k, (name, alias, _, _) in enumerate(NETNS):
            first = work / name / f"node{2 * k + 1}" / "workerlog.0"
            wait_for(lambda: first.exists() and "rank 0 ready" in first.read_text(),
                     timeout=60, what=f"rank 0 of {name} ready")
            faults[name](alias)
        try:
            finish(jobs, out, results)
        finally:
            nodes.thaw("node4")
    finally:
        nodes.stop()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--out", type=Path, help="keep each job's stderr here")
    args = ap.parse_args()
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
    results = []
    start_time = time.monotonic()
    for _ in range(args.rounds):
        with tempfile.TemporaryDirectory(prefix="hang-accuracy-") as tmp:
            local_round(Path(tmp), args.out, results)
            netns_round(Path(tmp), args.out, results)
    print(f"correct {sum(results)}/{len(results)} "
          f"({time.monotonic() - start_time:.0f}s, --hang-timeout {TIMEOUT})")


if __name__ == "__main__":
    main()
