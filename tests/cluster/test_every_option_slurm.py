"""The walk of every ``fluidctl train`` option (tests/optionwalk.py) against slurm, submitting
from outside an allocation to a real Slurm controller: ``--dry-run`` prints the batch script
(checked with ``sbatch --test-only``), whose own ``fluidctl train`` runs the job on the nodes.
Each option is honoured (its value in the batch script) or refused in one line with exit 2."""
import subprocess
import sys

import pytest

import optionwalk as walk

# what the batch script holds for an option that is passed on (default: "--flag VALUE"); None:
# honoured elsewhere, said why
IN_SCRIPT = {
    "--sync": None,                     # the default
    "--token-file": None,               # the token goes to the job in its environment
    "--include-bad": "--include-bad",
    "--export": "--env WALK_EXPORTED=yes", "--env-file": "--env WALK_FILE=2",
    "--log-dir": "--log-dir /", "--nodes": "#SBATCH --nodes=1",
    "--metrics-port": "--metrics-port 0",       # served by the batch job's own launcher
    "--job-name": "#SBATCH --job-name=jn",
    "--python": "/py/python3 -m fluidctl train",
    # the submitting fluidctl follows the job: it echoes the ranks' logs (--tee, --tee-ranks)
    # and resubmits a failed one (--max-restarts: tests/cluster/test_slurm_step_rerun.py)
    "--tee": None, "--tee-ranks": None, "--max-restarts": None,
}
REFUSED = {
    "--hostfile": walk.refused("takes its nodes from Slurm"),
    "--hosts": walk.refused("takes its nodes from Slurm"),
    "--pserver-endpoints": walk.refused("need --mode pserver"),
    "--pservers": walk.refused("need --mode pserver"),
    "--pserver-hosts": walk.refused("need --mode pserver"),
    "--async": walk.refused("need --mode pserver"),
    "--checkpoint-dir": walk.refused("need --mode pserver"),
    "--checkpoint-every": walk.refused("need --mode pserver"),
    "--node-rank": walk.refused("--node-rank is torchrun's"),
    "--health-gate": walk.refused("under Slurm the allocation chooses them"),
    "--show-secrets": walk.refused("--show-secrets only works with --dry-run --json"),
    "--gpus": walk.refused("gres"),     # on to sbatch as --gres, which this Slurm lacks
    "--started-port": walk.refused("under Slurm the ranks choose their endpoints"),
    "--metrics-host": walk.refused("--metrics-host", "--metrics-port"),
    **{flag: walk.refused(f"{flag} is for jobs on --hostfile/--hosts nodes") for flag in (
        "--ssh-config", "--accept-new-host-keys", "--ssh-timeout", "--remote-dir", "--venv")},
}
CASES = [n for n in walk.every_option() if walk._own_options().get(n) not in ("slurm",)]


def _fluidctl(slurm, tmp_path, *args):
    env = slurm.env(FLUIDCTL_STATE_DIR=str(tmp_path / "state"), WALK_EXPORTED="yes")
    return subprocess.run([sys.executable, "-m", "fluidctl", *map(str, args)], env=env,
                          cwd=tmp_path, capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("name", CASES)
def test_an_option_is_honoured_or_refused_by_slurm(name, slurm, tmp_path, monkeypatch):
    walk.prepare(tmp_path, monkeypatch)
    value = [str(v) for v in walk.value(name)]
    base = ["train", "--backend", "slurm", "--nodes", 2, "--partition", slurm.partition,
            "--time", "5:00"]
    res = _fluidctl(slurm, tmp_path, *base, name, *value, *(
        ["--pservers=1"] if name == "--mode" else []), "--dry-run", walk.BEHAVE)
    owner = walk._own_options().get(name)
    expect = walk.refused(walk.OWN[owner]) if owner else REFUSED.get(name)
    if expect is not None:
        assert res.returncode == 2, res.stdout + res.stderr
        assert res.stderr.startswith("error: ") and \
            len(res.stderr.strip().splitlines()) == 1, res.stderr
        assert all(w in res.stderr for w in expect[1]), res.stderr
        return
    assert res.returncode == 0, res.stderr
    script = res.stdout[res.stdout.index("#!/bin/bash\n"):]
    wanted = IN_SCRIPT.get(name, " ".join([name, *value]))
    if wanted is not None:
        assert wanted in script, script
