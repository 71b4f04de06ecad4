"""Issue 27.7 (and 25.1): the wheel of fluidctl that cluster setup ships to the nodes is built
from this machine's own fluidctl, in a plain `python3 -m venv` too, and "fluidctl" is never
fetched by name from a package index."""
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

import fluidctl
from fluidctl.cluster.wheelhouse import pip_error

WT = Path(fluidctl.__file__).resolve().parent.parent

# Runs wheelhouse.build in the venv's python and records every pip command it runs.
BUILD = """
import json, subprocess, sys
from pathlib import Path
calls = []
real = subprocess.run
def run(argv, *a, **k):
    if list(argv[1:3]) == ["-m", "pip"]:
        calls.append([str(x) for x in argv])
    return real(argv, *a, **k)
subprocess.run = run
from fluidctl.cluster import wheelhouse
try:
    house = wheelhouse.build(Path(sys.argv[1]), no_deps=True)
    result = {"wheels": [w.file for w in house.wheels]}
except Exception as exc:
    result = {"error": str(exc)}
print(json.dumps({"calls": calls, **result}))
"""
FETCHES_FLUIDCTL = re.compile(r"(?i)fluidctl\s*(\[.*\])?\s*([=<>!~;@].*)?")


def venv(path: Path, *pip_args):
    subprocess.run([sys.executable, "-m", "venv", str(path)], check=True)
    if pip_args:
        proc = subprocess.run([str(path / "bin" / "python"), "-m", "pip", "install", "-q",
                               *pip_args], capture_output=True, text=True, cwd=path)
        assert proc.returncode == 0, proc.stderr
    return path / "bin" / "python"


def build_in(python: Path, tmp_path: Path) -> dict:
    proc = subprocess.run([str(python), "-c", BUILD, str(tmp_path / "house")],
                          capture_output=True, text=True, cwd=tmp_path, timeout=600)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


def assert_nothing_fetched_by_name(calls):
    for argv in calls:
        for arg in argv[3:]:
            assert not FETCHES_FLUIDCTL.fullmatch(arg.strip()), f"pip fetches {arg!r}: {argv}"


def test_27_7_the_wheel_builds_in_a_fresh_venv_from_an_editable_install(tmp_path):
    python = venv(tmp_path / "v", "-e", str(WT), "--no-deps")
    result = build_in(python, tmp_path)
    assert result.get("wheels") == ["fluidctl-0.1.0-py3-none-any.whl"], result
    assert_nothing_fetched_by_name(result["calls"])


def test_27_7_no_pip_command_names_fluidctl_and_an_installed_copy_is_packed(tmp_path):
    python = venv(tmp_path / "v", "--no-deps", str(WT))             # not editable
    result = build_in(python, tmp_path)
    assert_nothing_fetched_by_name(result["calls"])
    assert result.get("wheels") == ["fluidctl-0.1.0-py3-none-any.whl"], result
    # the packed wheel installs without an index, and its command runs
    node = tmp_path / "node"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(node)], check=True)
    proc = subprocess.run([str(python), "-m", "pip", "--python", str(node / "bin" / "python"),
                           "install", "-q", "--no-index", "--no-deps",
                           str(tmp_path / "house" / result["wheels"][0])],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    out = subprocess.run([str(node / "bin" / "fluidctl"), "--version"], capture_output=True,
                         text=True, cwd=tmp_path)
    assert out.stdout.strip() == "fluidctl, version 0.1.0", out


def test_27_7_a_failed_build_shows_pip_s_real_error_line(tmp_path):
    """What `pip wheel --no-build-isolation` says in a fresh venv (setuptools without
    bdist_wheel): the cause, not pip's last line."""
    python = venv(tmp_path / "v")
    proc = subprocess.run([str(python), "-m", "pip", "wheel", "--no-deps",
                           "--no-build-isolation", "-w", str(tmp_path / "w"), str(WT)],
                          capture_output=True, text=True, cwd=tmp_path)
    if proc.returncode == 0:
        pytest.skip("this venv's setuptools builds wheels without the 'wheel' package")
    assert pip_error(proc.stderr + proc.stdout) == "error: invalid command 'bdist_wheel'"


def test_the_wheel_is_built_from_a_copy_and_the_checkout_is_left_as_it_was(tmp_path):
    """pip builds a source tree in place (setuptools writes build/ and fluidctl.egg-info into
    it): built in the checkout itself, setup raced any other build or `pip install -e` of that
    checkout (ENOENT in test_setup_from_a_bare_venv beside its twin) and left build/ there."""
    import os
    import shutil
    checkout = tmp_path / "checkout"
    shutil.copytree(WT, checkout, ignore=shutil.ignore_patterns(
        ".git", "build", "*.egg-info", "__pycache__", "*.so", "tests", "bench", "docs",
        "demo*", "templates"))
    python = venv(tmp_path / "v", "-e", str(checkout), "--no-deps")
    before = sorted(os.listdir(checkout))
    result = build_in(python, tmp_path)
    assert result.get("wheels") == ["fluidctl-0.1.0-py3-none-any.whl"], result
    assert sorted(os.listdir(checkout)) == before and "build" not in before, before
