"""Issue 27, hardening of shard-data: concurrent runs into one output."""
import json
import subprocess
import sys
from pathlib import Path


def test_27_10_concurrent_runs_into_one_output_one_wins(tmp_path):
    data = tmp_path / "in.txt"
    with open(data, "w") as f:
        for i in range(400_000):
            f.write(f"record {i:09d} " + "x" * 40 + "\n")
    argv = [sys.executable, "-m", "fluidctl", "shard-data", str(data), "-n", "4",
            "-o", str(tmp_path / "out"), "--shuffle", "-q"]
    procs = [subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for _ in range(4)]
    try:
        results = [(p.wait(timeout=300), p.stderr.read()) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
            p.stdout.close()
            p.stderr.close()
    codes = sorted(code for code, _ in results)
    assert codes == [0, 2, 2, 2], results
    for code, err in results:
        if code == 2:
            lines = err.strip().splitlines()
            assert len(lines) == 1 and lines[0].startswith("error: output "), err
            assert "--force" in lines[0] and "Traceback" not in err
    manifest = json.loads((tmp_path / "out" / "manifest.json").read_text())
    names = sorted(p.name for p in (tmp_path / "out").iterdir())
    assert names == sorted([s["file"] for s in manifest["shards"]] + ["manifest.json"])
    assert sum(s["records"] for s in manifest["shards"]) == 400_000
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.txt", "out"]   # no staging left
