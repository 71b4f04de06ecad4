"""The batch script (golden string), job records, and ``fluidctl job list | status | logs |
cancel`` against the real Slurm of tests/slurm.py (no sacct: it has no accounting)."""
import json
import subprocess
import sys
from pathlib import Path

from fluidctl import paths
from fluidctl.backends.slurm import slurmctl
from fluidctl.backends.slurm.plan import SlurmOptions

from launchutil import wait_for

GOLDEN = """\
#!/bin/bash
# written by fluidctl 9.9
#SBATCH --job-name=train
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=4
#SBATCH --gpus-per-node=4
#SBATCH --partition=gpu
#SBATCH --time=01:30:00
#SBATCH --account="proj 1"
#SBATCH --qos=high
#SBATCH --constraint=a100&ib
#SBATCH --exclude=gpu[003-004]
#SBATCH --signal=B:USR1@120
#SBATCH --requeue
#SBATCH --output="/logs/my run/slurm-%j.out"
#SBATCH --open-mode=append
#SBATCH --chdir=/home/u/proj
#SBATCH --mail-type=END

rm -f '/logs/my run/slurm-'"$SLURM_JOB_ID".exitcode '/logs/my run/slurm-'"$SLURM_JOB_ID".exitcode.requeue
export FLUIDCTL_REQUEUE_FILE='/logs/my run/slurm-'"$SLURM_JOB_ID".exitcode.requeue
trap 'kill -USR1 "$pid" 2>/dev/null' USR1
/opt/py/bin/python -m fluidctl train --backend slurm --log-dir '/logs/my run/slurm-'"$SLURM_JOB_ID" train.py --lr '0.1 0.2' &
pid=$!
while kill -0 "$pid" 2>/dev/null; do wait "$pid"; done
wait "$pid"; code=$?
if [ "$code" = 75 ] && [ -f '/logs/my run/slurm-'"$SLURM_JOB_ID".exitcode.requeue ]; then
  if [ "${SLURM_RESTART_COUNT:-0}" -ge 100 ]; then
    echo "fluidctl: requeued 100 times already: not requeued again" >&2
  elif scontrol requeue "$SLURM_JOB_ID"; then
    exit 0
  fi
fi
echo "$code" > '/logs/my run/slurm-'"$SLURM_JOB_ID".exitcode.tmp && mv -f '/logs/my run/slurm-'"$SLURM_JOB_ID".exitcode.tmp '/logs/my run/slurm-'"$SLURM_JOB_ID".exitcode
exit "$code"
"""


def test_golden_sbatch_script():
    layout = paths.LogLayout(Path("/logs/my run"))
    options = SlurmOptions(partition="gpu", time="01:30:00", account="proj 1", qos="high",
                           constraint="a100&ib", exclude="gpu[003-004]",
                           slurm_args=("--mail-type=END",), checkpoint_warning=120)
    spec = slurmctl.SbatchSpec(
        job_name="train", nodes=2, ntasks_per_node=4, gpus_per_node=4, options=options,
        command=["/opt/py/bin/python", "-m", "fluidctl", "train", "--backend", "slurm",
                 "--log-dir", str(layout.slurm_job("%j").root), "train.py", "--lr", "0.1 0.2"],
        workdir="/home/u/proj", output=str(layout.slurm_output),
        exit_file=str(layout.job_exit("%j")), header="written by fluidctl 9.9")
    assert slurmctl.sbatch_script(spec) == GOLDEN
    # the script is valid bash
    subprocess.run(["bash", "-n"], input=GOLDEN, text=True, check=True)


def _run_batch_script(tmp_path, body, restarts):
    """The batch script run by bash with ``body`` as fluidctl's command, SLURM_RESTART_COUNT
    ``restarts`` and an scontrol that logs its arguments: (exit code, scontrol's calls)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    calls = tmp_path / "scontrol.calls"
    (bin_dir / "scontrol").write_text(f'#!/bin/sh\necho "$*" >> {calls}\n')
    (bin_dir / "scontrol").chmod(0o755)
    spec = slurmctl.SbatchSpec(job_name="j", nodes=1, ntasks_per_node=1,
                               command=["sh", "-c", body], workdir=str(tmp_path),
                               output=str(tmp_path / "out"),
                               exit_file=str(tmp_path / "slurm-%j.exitcode"))
    env = dict(__import__("os").environ, SLURM_JOB_ID="7", SLURM_RESTART_COUNT=str(restarts),
               PATH=f"{bin_dir}:/usr/bin:/bin")
    res = subprocess.run(["bash", "-c", slurmctl.sbatch_script(spec)], env=env, text=True,
                         capture_output=True, timeout=60)
    return res.returncode, calls.read_text().splitlines() if calls.exists() else [], res.stderr


def test_40_3_only_fluidctls_checkpoint_stop_is_requeued_and_at_most_the_limit(tmp_path):
    """Exit 75 requeues only with the requeue file fluidctl leaves after stopping the job on
    a checkpoint request; and not once SLURM_RESTART_COUNT reached REQUEUE_LIMIT."""
    ours = 'echo checkpointed > "$FLUIDCTL_REQUEUE_FILE"; exit 75'
    assert _run_batch_script(tmp_path, ours, 0)[:2] == (0, ["requeue 7"])
    (tmp_path / "scontrol.calls").unlink()
    assert _run_batch_script(tmp_path, "exit 75", 0)[:2] == (75, [])      # the script's own
    code, calls, err = _run_batch_script(tmp_path, ours, slurmctl.REQUEUE_LIMIT)
    assert (code, calls) == (75, []) and "not requeued again" in err
    assert (tmp_path / "slurm-7.exitcode").read_text() == "75\n"


# --- against the real Slurm -----------------------------------------------------------------
JOB = """
import os, sys, time
os.makedirs(os.path.join(sys.argv[1], "slurm-" + os.environ["SLURM_JOB_ID"]), exist_ok=True)
log = os.path.join(sys.argv[1], "slurm-" + os.environ["SLURM_JOB_ID"], "workerlog.0")
with open(log, "a") as f:
    for i in range(3):
        print(f"step {i} of job {os.environ['SLURM_JOB_ID']}", file=f, flush=True)
    print("rank 0 done", file=f, flush=True)
sys.exit(int(sys.argv[2]))
"""


def submit(slurm, tmp_path, monkeypatch, code=0, command=None):
    """Record a job the way the backend does (slurmctl.submit), from this process."""
    for name in [k for k in list(__import__("os").environ) if k.startswith("SLURM_")]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("SLURM_CONF", str(slurm.conf))
    monkeypatch.setenv("FLUIDCTL_STATE_DIR", str(tmp_path / "state"))
    log_dir = tmp_path / "logs"
    log_dir.mkdir(exist_ok=True)
    layout = paths.LogLayout(log_dir)
    script = tmp_path / "job.py"
    script.write_text(JOB)
    spec = slurmctl.SbatchSpec(
        job_name="jobtest", nodes=1, ntasks_per_node=1,
        command=command or [sys.executable, str(script), str(log_dir), str(code)],
        workdir=str(tmp_path), output=str(layout.slurm_output),
        exit_file=str(layout.job_exit("%j")))
    return slurmctl.submit(spec, layout)


def cli(slurm, tmp_path, *args, timeout=60):
    env = slurm.env(FLUIDCTL_STATE_DIR=str(tmp_path / "state"))
    return subprocess.run([sys.executable, "-m", "fluidctl", "job", *args], env=env,
                          capture_output=True, text=True, timeout=timeout, cwd=tmp_path)


def test_job_record_status_and_logs(slurm, tmp_path, monkeypatch):
    record = submit(slurm, tmp_path, monkeypatch, code=3)
    assert paths.job_record(record.job_id).is_file()
    assert Path(record.script).read_text().startswith("#!/bin/bash")
    follow = cli(slurm, tmp_path, "logs", record.job_id, "-f")
    assert follow.returncode == 3, follow.stdout + follow.stderr
    assert follow.stdout.splitlines() == [f"step {i} of job {record.job_id}" for i in range(3)] + [
        "rank 0 done"]
    assert f"job {record.job_id} FAILED, exit code 3" in follow.stderr
    status = cli(slurm, tmp_path, "status", record.job_id, "--json")
    assert status.returncode == 1
    row = json.loads(status.stdout)
    assert (row["state"], row["exit_code"], row["job_id"]) == ("FAILED", 3, record.job_id)
    assert (tmp_path / "logs" / f"slurm-{record.job_id}.exitcode").read_text() == "3\n"
    listed = json.loads(cli(slurm, tmp_path, "list", "--json").stdout)
    assert [(r["job_id"], r["state"], r["exit_code"]) for r in listed] == [
        (record.job_id, "FAILED", 3)]
    table = cli(slurm, tmp_path, "list")
    assert record.job_id in table.stdout and "FAILED" in table.stdout
    plain = cli(slurm, tmp_path, "logs", record.job_id)
    assert plain.returncode == 0 and plain.stdout.endswith("rank 0 done\n")
    missing = cli(slurm, tmp_path, "logs", record.job_id, "--rank", "5")
    assert missing.returncode == 2 and missing.stderr.startswith("error: ")
    assert len(missing.stderr.splitlines()) == 1


def test_state_after_slurmctld_forgot_the_job(slurm, tmp_path, monkeypatch):
    """Once scontrol no longer knows a job (MinJobAge), the exit file answers."""
    record = submit(slurm, tmp_path, monkeypatch, code=0)
    slurm.wait_gone(record.job_id)
    wait_for(lambda: record.layout.job_exit(record.job_id).exists(), what="exit file")
    record.job_id, real = "99999999", record.job_id      # an id slurmctld never had
    record.layout.job_exit(real).rename(record.layout.job_exit("99999999"))
    st = slurmctl.state(record)
    assert (st.state, st.exit_code, st.source) == ("COMPLETED", 0, "exit-file")


def test_cancel(slurm, tmp_path, monkeypatch):
    marker = tmp_path / "started"
    record = submit(slurm, tmp_path, monkeypatch, command=[
        "bash", "-c", f"touch {marker}; exec sleep 300"])
    wait_for(marker.exists, timeout=60, what="the job to start")
    res = cli(slurm, tmp_path, "cancel", record.job_id)
    assert res.returncode == 0 and f"cancelled job {record.job_id}" in res.stdout
    slurm.wait_gone(record.job_id)
    st = slurmctl.state(record)
    assert st.state == "CANCELLED" and st.exit_code != 0
    again = cli(slurm, tmp_path, "cancel", record.job_id)
    assert again.returncode == 0 and "already ended: CANCELLED" in again.stdout


def test_unknown_job_and_missing_slurm(tmp_path):
    env = dict(__import__("os").environ, FLUIDCTL_STATE_DIR=str(tmp_path), PATH="/nonexistent")
    res = subprocess.run([sys.executable, "-m", "fluidctl", "job", "status", "42"], env=env,
                         capture_output=True, text=True)
    assert res.returncode == 2 and res.stderr.startswith("error: no job 42 was submitted")
    (tmp_path / "jobs").mkdir()
    (tmp_path / "jobs" / "slurm-42.json").write_text(json.dumps(
        {"job_id": "42", "name": "x", "script": "s", "log_dir": str(tmp_path), "workdir": "w",
         "nodes": 1, "ntasks_per_node": 1}))
    res = subprocess.run([sys.executable, "-m", "fluidctl", "job", "status", "42"], env=env,
                         capture_output=True, text=True)
    assert res.returncode == 2
    assert res.stderr.startswith("error: Slurm's scontrol is not installed or not on PATH")
    assert len(res.stderr.splitlines()) == 1


def test_40_3_a_scripts_own_exit_75_fails_the_job_without_requeue(slurm, tmp_path, monkeypatch):
    """EX_TEMPFAIL from the script is not fluidctl's "checkpointed on request": the job ends
    FAILED with 75 at once, never requeued (it used to be requeued for ever)."""
    record = submit(slurm, tmp_path, monkeypatch, code=75)
    exit_file = record.layout.job_exit(record.job_id)
    wait_for(exit_file.exists, timeout=60, what="the batch script's exit file")
    assert exit_file.read_text() == "75\n"
    slurm.wait_gone(record.job_id)
    st = slurmctl.state(record)
    assert (st.state, st.exit_code) == ("FAILED", 75) and not st.restarts
