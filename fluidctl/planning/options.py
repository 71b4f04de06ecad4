"""Parsing of user input shared by several commands: --env, --env-file, SCRIPT checks.

Every mistake is a UsageError: one line, exit 2, nothing started.
"""
from __future__ import annotations

import os
import re
import shutil
from typing import Dict, Iterable, Optional

from fluidctl.errors import UsageError

TEE_CHOICES = ("rank0", "all", "none")      # --tee (here: train's parser needs no planner)

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def parse_env_pairs(pairs: Iterable[str], source: str = "--env") -> Dict[str, str]:
    env: Dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not _NAME.fullmatch(key):
            raise UsageError(f"malformed {source} {pair!r}",
                             "write KEY=VALUE with KEY made of letters, digits and _")
        env[key] = value
    return env


def read_env_file(path: Optional[str]) -> Dict[str, str]:
    """KEY=VALUE lines; '#' comments, blank lines, an optional 'export ' and quotes allowed."""
    if not path:
        return {}
    try:
        with open(path, encoding="utf-8") as f:
            lines = f.read().splitlines()
    except FileNotFoundError:
        raise UsageError(f"--env-file {path} does not exist", "check the path") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"cannot read --env-file {path}: {exc}", "check the file") from None
    env: Dict[str, str] = {}
    for number, line in enumerate(lines, 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("export "):
            line = line[len("export "):].strip()
        key, sep, value = line.partition("=")
        key, value = key.strip(), value.strip()
        if not sep or not _NAME.fullmatch(key):
            raise UsageError(f"{path}:{number}: malformed line {line!r}",
                             "write KEY=VALUE, one per line")
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
            value = value[1:-1]
        env[key] = value
    return env


def check_script(script: str) -> str:
    """A ``.py`` must be a readable file; anything else an executable file or on PATH.
    Returns the path to run (absolute for files, so a remote/other cwd cannot change it)."""
    if os.path.isdir(script):
        raise UsageError(f"SCRIPT {script} is a directory", "give the training script's path")
    if script.endswith(".py"):
        if not os.path.exists(script):
            raise UsageError(f"SCRIPT {script} does not exist", "check the path to your script")
        if not os.access(script, os.R_OK):
            raise UsageError(f"SCRIPT {script} is not readable", f"run 'chmod +r {script}'")
        return os.path.abspath(script)
    if os.sep in script or os.path.exists(script):
        if not os.path.exists(script):
            raise UsageError(f"SCRIPT {script} does not exist", "check the path")
        if not os.access(script, os.X_OK):
            raise UsageError(f"SCRIPT {script} is not executable",
                             f"run 'chmod +x {script}', or name a .py file")
        return os.path.abspath(script)
    if shutil.which(script) is None:
        raise UsageError(f"SCRIPT {script} is neither a file nor a program on PATH",
                         "check the spelling or give a path")
    return script


def exported(patterns: Iterable[str], environ: Optional[Dict[str, str]] = None) -> Dict[str, str]:
    """Variables of this environment whose names match a ``--export`` glob (e.g. 'NCCL_*')."""
    import fnmatch
    environ = dict(os.environ) if environ is None else environ
    return {name: value for name, value in environ.items()
            if any(fnmatch.fnmatchcase(name, pattern) for pattern in patterns)}
