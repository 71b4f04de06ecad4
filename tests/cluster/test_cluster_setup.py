"""``fluidctl cluster setup`` on two real sshd nodes, each with its own directory (``{host}`` in
the venv path): first setup, the no-op second run, a node where pip fails, a version drift that
``cluster check`` finds, and jobs that run with the provisioned environment.

The requirement is a tiny wheel written here (offline, milliseconds); the venvs see the system's
packages (--system-site-packages, --no-deps), so fluidctl's own dependencies are not
re-installed per node and a setup takes seconds.
"""
import base64
import hashlib
import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from launchutil import ONE_HOST_MPI_ENV
from launchutil import table_row as row

FLUIDCTL = [sys.executable, "-m", "fluidctl"]
PY = f"python{sys.version_info[0]}.{sys.version_info[1]}"


def fluidctl(*args, timeout=300, env=None):
    return subprocess.run([*FLUIDCTL, *map(str, args)], capture_output=True, text=True,
                          timeout=timeout, env={"PATH": "/usr/bin:/bin", "NO_COLOR": "1",
                                                "COLUMNS": "250", "HOME": str(Path.home()), "FLUIDCTL_STATE_DIR": os.environ["FLUIDCTL_STATE_DIR"],
                                                **(env or {})})


def make_wheel(where: Path, name: str, version: str) -> Path:
    """A minimal pure-Python wheel: ``import NAME`` gives ``NAME.VERSION``."""
    files = {f"{name}/__init__.py": f"VERSION = {version!r}\n",
             f"{name}-{version}.dist-info/METADATA":
                 f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n",
             f"{name}-{version}.dist-info/WHEEL":
                 "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
             f"{name}-{version}.dist-info/top_level.txt": f"{name}\n"}
    record = []
    for path, text in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=")
        record.append(f"{path},sha256={digest.decode()},{len(text.encode())}")
    record.append(f"{name}-{version}.dist-info/RECORD,,")
    where.mkdir(parents=True, exist_ok=True)
    wheel = where / f"{name}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        for path, text in files.items():
            zf.writestr(path, text)
        zf.writestr(f"{name}-{version}.dist-info/RECORD", "\n".join(record) + "\n")
    return wheel


@pytest.fixture(scope="module")
def cluster(sshd_nodes, tmp_path_factory):
    """Hostfile, ssh config, a local index holding tinyreq 1.0 and 2.0, a requirements file
    pinning 1.0, and a wheelhouse directory shared by the tests (built once)."""
    root = tmp_path_factory.mktemp("setup")
    index = root / "index"
    make_wheel(index, "tinyreq", "1.0")
    make_wheel(root / "newer", "tinyreq", "2.0")
    requirements = root / "requirements.txt"
    requirements.write_text(f"--no-index\n--find-links {index}\ntinyreq==1.0\n")
    return {"root": root, "hostfile": sshd_nodes.hostfile("hosts.setup", slots=1),
            "config": sshd_nodes.config, "requirements": requirements,
            "wheelhouse": root / "wheelhouse", "newer": root / "newer"}


def setup_args(cluster, venv, *more):
    return ["cluster", "setup", "--hostfile", cluster["hostfile"], "--ssh-config",
            cluster["config"], "--requirements", cluster["requirements"], "--venv", venv,
            "--wheelhouse", cluster["wheelhouse"], "--system-site-packages", "--no-deps",
            "--python", PY, *more]


def venv_python_says(venv: Path, code: str) -> str:
    return subprocess.run([str(venv / "bin" / "python"), "-c", code], capture_output=True,
                          text=True, check=True, cwd="/").stdout.strip()


@pytest.fixture(scope="module")
def ready(cluster):
    """Both nodes set up once (first run, checked by test_first_setup_then_no_op)."""
    template = cluster["root"] / "nodes" / "{host}" / "venv"
    first = fluidctl(*setup_args(cluster, template))
    return template, first


def test_first_setup_then_no_op(cluster, ready):
    template, first = ready
    assert first.returncode == 0, first.stderr + first.stdout
    for host in ("node1", "node2"):
        cells = row(first.stdout, host)
        venv = Path(str(template).replace("{host}", host))
        assert cells[1] == str(venv) and cells[2] == "create"
        assert cells[3].startswith("2 (") and cells[4] == "2"     # fluidctl and tinyreq
        assert cells[5].startswith("ready fluidctl 0.1.0")
        # the node's own venv: tinyreq from the wheelhouse, fluidctl from this checkout's wheel
        assert venv_python_says(venv, "import tinyreq; print(tinyreq.VERSION)") == "1.0"
        where = venv_python_says(venv, "import fluidctl; print(fluidctl.__file__)")
        assert where.startswith(str(venv) + "/")
        assert sorted(p.name for p in (venv / "wheelhouse").iterdir()) == [
            "fluidctl-0.1.0-py3-none-any.whl", "tinyreq-1.0-py3-none-any.whl"]
        record = json.loads((venv / "fluidctl-env.json").read_text())
        assert record["versions"] == {"tinyreq": "1.0"}
    again = fluidctl(*setup_args(cluster, template))
    assert again.returncode == 0, again.stderr
    assert "building the wheelhouse" not in again.stderr          # reused as it was
    for host in ("node1", "node2"):
        cells = row(again.stdout, host)
        assert cells[2:5] == ["ready", "nothing", "-"], again.stdout


def test_dry_run_says_what_would_happen_and_changes_nothing(cluster, ready, tmp_path):
    template = tmp_path / "{host}" / "env"
    r = fluidctl(*setup_args(cluster, template, "--dry-run"))
    assert r.returncode == 0, r.stderr
    for host in ("node1", "node2"):
        assert row(r.stdout, host)[2:5] == ["create", row(r.stdout, host)[3], "2"]
        venv = str(template).replace("{host}", host)
        line = next(l for l in r.stdout.splitlines() if l.startswith(f"{host}: "))
        assert line.startswith(f"{host}: {venv}: create the venv with {PY}; push "
                               "fluidctl-0.1.0-py3-none-any.whl (")
        assert line.endswith("; install fluidctl-0.1.0-py3-none-any.whl, "
                             "tinyreq-1.0-py3-none-any.whl")
        assert "tinyreq-1.0-py3-none-any.whl (" in line
        assert not (tmp_path / host).exists()
    # on the ready cluster: nothing to push or install
    r = fluidctl(*setup_args(cluster, ready[0], "--dry-run"))
    assert r.returncode == 0, r.stderr
    assert row(r.stdout, "node2")[2:5] == ["ready", "nothing", "-"]
    assert f"node2: {str(ready[0]).replace('{host}', 'node2')}: use the venv there; push " \
        "nothing; install nothing" in r.stdout


def test_a_failing_node_is_named_with_pips_error_and_the_other_is_set_up(cluster, ready,
                                                                        tmp_path):
    template = tmp_path / "{host}" / "venv"
    site = tmp_path / "node1" / "venv" / "lib" / PY / "site-packages"
    site.mkdir(parents=True)
    (site / "tinyreq").write_text("a file where the package directory goes\n")
    r = fluidctl(*setup_args(cluster, template))
    assert r.returncode == 1, r.stdout + r.stderr
    lines = r.stderr.strip().splitlines()[-1:]      # after the progress lines
    assert "Traceback" not in r.stderr
    assert lines[0].startswith("error: node node1 failed the setup: pip install "
                               "failed: ERROR: ")
    assert "Not a directory" in lines[0] and "node2" not in lines[0]
    assert row(r.stdout, "node1")[5] == "FAIL"
    assert row(r.stdout, "node2")[5].startswith("ready")
    assert venv_python_says(tmp_path / "node2" / "venv", "import tinyreq; print(1)") == "1"


def test_cluster_check_reports_the_environment_and_a_version_drift(cluster, ready, tmp_path):
    template = ready[0]
    check = ["cluster", "check", "--hostfile", cluster["hostfile"], "--ssh-config",
             cluster["config"], "--venv", template]
    # this machine has tinyreq 1.0 too (unpacked on PYTHONPATH): both nodes agree
    here = tmp_path / "here"
    with zipfile.ZipFile(next((cluster["root"] / "index").glob("*.whl"))) as zf:
        zf.extractall(here)
    env = {"PYTHONPATH": str(here)}
    r = fluidctl(*check, env=env)
    assert r.returncode == 0, r.stderr + r.stdout
    for host in ("node1", "node2"):
        assert row(r.stdout, host)[2:4] == ["ok", "ok"], r.stdout      # status, env
    node1 = Path(str(template).replace("{host}", "node1"))
    newer = next(cluster["newer"].glob("*.whl"))
    subprocess.run([str(node1 / "bin" / "python"), "-m", "pip", "install", "-q", "--no-index",
                    "--disable-pip-version-check", str(newer)], check=True)
    try:
        r = fluidctl(*check, env=env)
        assert r.returncode == 1
        assert r.stderr.strip().splitlines()[-1] == (
            "error: node node1 failed the check: "
                                    "tinyreq 2.0 there, 1.0 here (run fluidctl cluster setup)")
    finally:       # put the ready environment back for the other tests
        fixed = fluidctl(*setup_args(cluster, template))
        assert fixed.returncode == 0, fixed.stderr
    assert venv_python_says(node1, "import tinyreq; print(tinyreq.VERSION)") == "1.0"


JOB = """import os, sys, tinyreq
print("rank", os.environ["PADDLE_TRAINER_ID"], "python", sys.executable, "tinyreq",
      tinyreq.VERSION, flush=True)
"""


@pytest.mark.parametrize("backend", ["ssh", "fabric"])
def test_train_runs_with_the_provisioned_environment(cluster, ready, tmp_path, backend):
    """No --python: each node's ranks run with that node's venv (tinyreq is only there)."""
    template = ready[0]
    (tmp_path / "job.py").write_text(JOB)
    r = subprocess.run([*FLUIDCTL, "train", "--hostfile", str(cluster["hostfile"]),
                        "--ssh-config", str(cluster["config"]), "--backend", backend,
                        "--venv", str(template), "--log-dir", str(tmp_path / "logs"),
                        "job.py"], cwd=tmp_path, capture_output=True, text=True, timeout=120,
                       env={"PATH": "/usr/bin:/bin", "HOME": str(Path.home()), "FLUIDCTL_STATE_DIR": os.environ["FLUIDCTL_STATE_DIR"], "NO_COLOR": "1"})
    assert r.returncode == 0, r.stderr + r.stdout
    for rank, host in enumerate(("node1", "node2")):
        log = (tmp_path / "logs" / host / f"workerlog.{rank}").read_text()
        python = str(template).replace("{host}", host) + "/bin/python"
        assert f"rank {rank} python {python} tinyreq 1.0" in log, log


@pytest.mark.usefixtures("openmpi")
def test_train_backend_mpi_runs_with_the_provisioned_environment(cluster, ready, tmp_path):
    """mpirun starts one command everywhere: the node's shell picks the venv's python where it
    exists (one path for every node, so one node here)."""
    venv = str(ready[0]).replace("{host}", "node1")
    (tmp_path / "job.py").write_text(JOB)
    r = subprocess.run([*FLUIDCTL, "train", "--backend", "mpi", "--hosts", "node1:1",
                        "--ssh-config", str(cluster["config"]), "--venv", venv,
                        "--log-dir", str(tmp_path / "logs"), "job.py"], cwd=tmp_path,
                       capture_output=True, text=True, timeout=120,
                       env={**os.environ, "NO_COLOR": "1", **ONE_HOST_MPI_ENV})
    assert r.returncode == 0, r.stderr + r.stdout
    log = (tmp_path / "logs" / "workerlog.0").read_text()
    assert f"rank 0 python {venv}/bin/python tinyreq 1.0" in log, log
    # a path that differs per node cannot be one mpirun command: refused before anything runs
    r = subprocess.run([*FLUIDCTL, "train", "--backend", "mpi", "--hosts", "node1:1",
                        "--venv", str(ready[0]), "job.py"], cwd=tmp_path, capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 2 and r.stderr.startswith("error: --venv ") and \
        "differs per node" in r.stderr


@pytest.mark.parametrize("version", ["3.11", "3.12"])
def test_setup_from_a_bare_venv(cluster, tmp_path, version):
    """A new user's path: ``python3 -m venv``, ``pip install`` this checkout (pip's build
    isolation fetches setuptools), then that venv's fluidctl sets the nodes up (its wheelhouse
    build isolated too, with nothing but pip in the venv to lean on)."""
    import shutil
    python = shutil.which(f"python{version}", path="/usr/bin:/usr/local/bin")
    if python is None:
        pytest.skip(f"no python{version} here")
    bare = tmp_path / "bare"
    subprocess.run([python, "-m", "venv", str(bare)], check=True)
    checkout = Path(__file__).resolve().parents[2]
    subprocess.run([str(bare / "bin" / "python"), "-m", "pip", "install", "-q",
                    "--disable-pip-version-check", "-e", str(checkout)], check=True,
                   capture_output=True, timeout=600)
    template = tmp_path / "nodes" / "{host}" / "venv"
    r = subprocess.run([str(bare / "bin" / "fluidctl"), "cluster", "setup", "--hostfile",
                        str(cluster["hostfile"]), "--ssh-config", str(cluster["config"]),
                        "--requirements", str(cluster["requirements"]), "--venv", str(template),
                        "--wheelhouse", str(tmp_path / "wheels"), "--system-site-packages",
                        "--no-deps", "--python", f"python{version}"],
                       capture_output=True, text=True, timeout=300,
                       env={"PATH": "/usr/bin:/bin", "NO_COLOR": "1", "HOME": str(Path.home()), "FLUIDCTL_STATE_DIR": os.environ["FLUIDCTL_STATE_DIR"]})
    assert r.returncode == 0, r.stderr + r.stdout
    for host in ("node1", "node2"):
        assert row(r.stdout, host)[5].startswith("ready fluidctl 0.1.0"), r.stdout
        venv = Path(str(template).replace("{host}", host))
        assert venv_python_says(venv, "import tinyreq; print(tinyreq.VERSION)") == "1.0"


def test_cluster_exec_runs_with_the_setup_venv(cluster, ready, tmp_path):
    """Right after setup, what it installed is what ``cluster exec`` finds (tinyreq is only in
    the nodes' venvs); a node without that venv runs the command as it is."""
    template = ready[0]
    exec_ = ["cluster", "exec", "--hostfile", cluster["hostfile"], "--ssh-config",
             cluster["config"], "--venv", template, "--"]
    r = fluidctl(*exec_, "python -c 'import sys, tinyreq; print(sys.prefix, tinyreq.VERSION)'")
    assert r.returncode == 0, r.stderr + r.stdout
    for host in ("node1", "node2"):
        assert f"[{host}] {str(template).replace('{host}', host)} 1.0" in r.stdout, r.stdout
    r = fluidctl("cluster", "exec", "--hostfile", cluster["hostfile"], "--ssh-config",
                 cluster["config"], "--venv", tmp_path / "none", "--", "echo $VIRTUAL_ENV-")
    assert r.returncode == 0 and sorted(r.stdout.split()) == ["-", "-", "[node1]", "[node2]"]
