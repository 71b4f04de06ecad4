"""fluidctl top JOBID and --metrics-port on a job submitted to the real Slurm of tests/slurm.py:
the batch job's own launcher (on a compute node) writes live.json in the job's own log dir and
serves the metrics; `fluidctl top JOBID` finds that dir through the job's record, as `fluidctl
job` does, and shows every rank of the two nodes and the rank whose data loader sleeps."""
import json
import re
import subprocess
import sys
import urllib.request
from pathlib import Path

from launchutil import default_sigint, wait_for
from observeutil import stop_job, wait_until

SCRIPTS = Path(__file__).resolve().parent.parent / "scripts"
STRAGGLE = str(SCRIPTS / "straggle.py")
WARM = 15
SLOW = 2


def test_top_and_metrics_of_a_submitted_slurm_job(tmp_path, slurm):
    env = slurm.env(FLUIDCTL_STATE_DIR=str(tmp_path / "state"))
    proc = subprocess.Popen(
        [sys.executable, "-m", "fluidctl", "train", "--backend", "slurm", "--nodes", "2",
         "--nproc", "2", "--partition", slurm.partition, "--time", "5:00",
         "--metrics-port", "0", STRAGGLE, "--steps", "100000", "--work", "5",
         "--slow-data", f"{SLOW}:100:{WARM}", "--stop-file", str(tmp_path / "STOP")],
        cwd=tmp_path, env=env, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        preexec_fn=default_sigint)
    try:
        own = wait_for(lambda: proc.poll() is not None or next(
            (d for d in (tmp_path / "mylog").glob("slurm-*/") if (d / "live.json").exists()),
            None), 180, "the batch job's live.json")
        assert proc.poll() is None, proc.communicate()
        job_id = own.name.split("-", 1)[1]

        def frame():
            res = subprocess.run([sys.executable, "-m", "fluidctl", "top", job_id, "--once",
                                  "--json"], cwd=tmp_path, env=env, capture_output=True,
                                 text=True, timeout=60)
            assert res.returncode == 0, res.stderr
            return json.loads(res.stdout)
        seen = wait_until(lambda: (lambda f: f if len(f["ranks"]) == 4 and
                                   f["ranks"][SLOW]["verdict"] else None)(frame()),
                          180, "4 ranks and the slow one marked", every=1.0)
        assert seen["backend"] == "slurm" and seen["log_dir"] == str(own)
        assert seen["ranks"][SLOW]["verdict"] == "slow data"
        assert {r["host"] for r in seen["ranks"]} == {"127.0.0.2", "127.0.0.3"}, seen["ranks"]
        assert all(r["state"] == "running" for r in seen["ranks"])
        url = re.search(r"metrics: (http://\S+)", (own / "launch.log").read_text()).group(1)
        with urllib.request.urlopen(url, timeout=10) as reply:
            text = reply.read().decode()
        counts = re.findall(r'^fluidctl_step_seconds_count\{[^}]*rank="(\d+)"', text, re.M)
        assert sorted(counts) == ["0", "1", "2", "3"], text[:2000]
    finally:
        stop_job(proc, tmp_path / "STOP", 120)
