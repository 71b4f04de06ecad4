"""Which fluidctl a benchmark times: this checkout in the running interpreter (default), or, with
``--venv DIR``, fluidctl as ``pip install`` gives it to a user, in a venv of its own.

Why both: the interpreter a developer runs here starts with site hooks a user's install does not
have (an editable install's finder, a sandbox's CA-injecting .pth: ~25 ms of every Python start
on this machine, against ~10 ms in a plain venv), and fluidctl's quick commands are measured in
tens of milliseconds. ``--venv`` times the install users get; the default times the checkout.
"""
from __future__ import annotations

import compileall
import os
import subprocess
import sys
from pathlib import Path

import fluidctl

ROOT = Path(__file__).resolve().parent.parent


def add_option(parser) -> None:
    parser.add_argument("--venv", metavar="DIR",
                        help="time fluidctl pip-installed (not editable) into this venv, as "
                             "users have it: created with its dependencies if missing, "
                             "fluidctl reinstalled from this checkout each run")


def fluidctl_argv(venv) -> list:
    """The argv prefix that runs ``fluidctl``; byte-compiled, as pip leaves an install."""
    if not venv:
        compileall.compile_dir(os.path.dirname(fluidctl.__file__), quiet=1)
        return [sys.executable, "-m", "fluidctl"]
    venv = Path(venv).resolve()
    pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "-q",
           "--disable-pip-version-check"]
    if not (venv / "bin" / "python").exists():
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        subprocess.run(pip + [str(ROOT)], check=True)
    else:
        subprocess.run(pip + ["--no-deps", "--force-reinstall", str(ROOT)], check=True)
    return [str(venv / "bin" / "fluidctl")]


def describe(argv: list) -> str:
    return (f"fluidctl pip-installed in {Path(argv[0]).parent.parent}" if len(argv) == 1 else
            f"fluidctl from {os.path.dirname(fluidctl.__file__)} under {sys.executable}")


def python(argv: list) -> str:
    """The interpreter that runs that fluidctl (for a ``python -c pass`` beside it)."""
    return str(Path(argv[0]).parent / "python") if len(argv) == 1 else sys.executable
