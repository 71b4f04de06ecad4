"""Time of `fluidctl cluster setup` on 2 nodes: first setup (fresh venvs) and the no-op re-run.

    python bench/cluster_setup.py [--repeat 5]

Starts two real sshd servers on 127.0.0.2 and 127.0.0.3 (tests/sshd.py), writes a one-module
requirement wheel, then per round: a fresh setup into new per-node venvs ({host} in the path;
--system-site-packages --no-deps, so fluidctl's own dependencies come from the system), the
re-run on that ready cluster, and as the peer the hand-run equivalent over `cluster exec`
(python -m venv + pip install --no-index --find-links of the same wheels, already on the node).
Prints medians. The wheelhouse is built before the first round (its build is not timed).
"""
import argparse
import shutil
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from sshd import SSHNodes  # noqa: E402
from test_cluster_setup import make_wheel  # noqa: E402
from wallclock import interleaved, report, timed  # noqa: E402

PY = f"python{sys.version_info[0]}.{sys.version_info[1]}"


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    why_not = SSHNodes.available()
    if why_not:
        raise SystemExit(why_not)
    work = Path(tempfile.mkdtemp(prefix="fluidctl-bench-setup-"))
    nodes = SSHNodes.start(work / "sshd")
    try:
        hosts = nodes.hostfile("hosts", slots=1)
        make_wheel(work / "index", "tinyreq", "1.0")
        reqs = work / "requirements.txt"
        reqs.write_text(f"--no-index\n--find-links {work / 'index'}\ntinyreq==1.0\n")
        common = [sys.executable, "-m", "fluidctl", "cluster", "setup", "--hostfile", str(hosts),
                  "--ssh-config", str(nodes.config), "-r", str(reqs), "--wheelhouse",
                  str(work / "wheelhouse"), "--system-site-packages", "--no-deps",
                  "--python", PY]
        ready = str(work / "ready" / "{host}" / "venv")
        timed([*common, "--venv", ready], work)                  # builds the wheelhouse
        wheels = " ".join(str(p) for p in sorted((work / "wheelhouse").glob("*.whl")))
        rounds = iter(range(10 ** 6))

        def fresh():
            return timed([*common, "--venv", str(work / f"fresh{next(rounds)}" / "{host}")], work)

        def by_hand():
            where = work / f"hand{next(rounds)}"
            node = f"{where}/$(echo $SSH_CONNECTION | cut -d' ' -f3)"       # one dir per node
            script = (f"{PY} -m venv --system-site-packages --without-pip {node} && "
                      f"{node}/bin/python -m pip install -q "
                      f"--disable-pip-version-check --no-index --find-links {work / 'wheelhouse'} "
                      f"{wheels}")
            return timed([sys.executable, "-m", "fluidctl", "cluster", "exec", "--hostfile",
                          str(hosts), "--ssh-config", str(nodes.config), "--", script], work)
        times = interleaved({
            "setup, fresh nodes": fresh,
            "setup, re-run (no-op)": lambda: timed([*common, "--venv", ready], work),
            "venv + pip install by hand (cluster exec)": by_hand,
        }, args.repeat)
    finally:
        nodes.stop()
        shutil.rmtree(work, ignore_errors=True)
    report(f"2 nodes, fluidctl + 1 requirement, median of {args.repeat} runs", times)


if __name__ == "__main__":
    main()
