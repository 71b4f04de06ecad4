"""Issue 40 (hardening), Slurm: the #SBATCH lines of the batch script fluidctl writes (#10).
A line break in --slurm-arg cannot add a command to the script; spaces and quotes in the
script's name, the log dir and the job name reach sbatch quoted. Against the real Slurm of
tests/slurm.py."""
import re
import subprocess
import sys

from launchutil import wait_for

JOB = "import os\nprint('ran as', os.environ['SLURM_JOB_NAME'])\n"


def fluidctl(slurm, tmp_path, *args, timeout=120):
    env = slurm.env(FLUIDCTL_STATE_DIR=str(tmp_path / "state"))
    return subprocess.run([sys.executable, "-m", "fluidctl", *map(str, args)], env=env,
                          cwd=tmp_path, capture_output=True, text=True, timeout=timeout)


def test_40_10_a_line_break_in_slurm_arg_is_refused_not_run(slurm, tmp_path):
    script = tmp_path / "job.py"
    script.write_text(JOB)
    planted = tmp_path / "planted"
    res = fluidctl(slurm, tmp_path, "train", "--backend", "slurm", "--nodes", 1, "--nproc", 1,
                   "--detach", "--log-dir", tmp_path / "log",
                   "--slurm-arg", f"--comment=x\ntouch {planted}", script)
    assert res.returncode == 2 and len(res.stderr.splitlines()) == 1, res.stderr
    assert res.stderr.startswith("error: --slurm-arg ") and "line break" in res.stderr
    assert "submitted" not in res.stderr and not planted.exists()


def test_40_10_spaces_and_quotes_in_names_and_paths_reach_sbatch_quoted(slurm, tmp_path):
    script = tmp_path / "my \"odd\" script's.py"
    script.write_text(JOB)
    log = tmp_path / "log dir #1 \"x\""
    res = fluidctl(slurm, tmp_path, "train", "--backend", "slurm", "--nodes", 1, "--nproc", 1,
                   "--detach", "--log-dir", log, "--job-name", "bert \"large\" #2",
                   "--slurm-arg", "--comment=two words", script)
    assert res.returncode == 0, res.stderr
    job_id = re.search(r"submitted Slurm job (\d+)", res.stderr).group(1)
    shown = slurm.run("scontrol", "show", "job", "-o", job_id, check=False).stdout
    assert 'JobName=bert "large" #2' in shown and "Comment=two words" in shown, shown
    out = log / f"slurm-{job_id}.out"
    wait_for(lambda: (log / f"slurm-{job_id}.exitcode").exists(), 90, "the job to end")
    assert (log / f"slurm-{job_id}.exitcode").read_text() == "0\n", out.read_text()
