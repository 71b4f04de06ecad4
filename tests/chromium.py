"""Headless Chromium (Debian's ``chromium``) for the tests that open a page as a user would:
a screenshot, the DOM after the page is parsed and laid out, optionally inside a fresh network
namespace with no interface but a down loopback (the page must open offline). Every run has a
deadline; Chromium and every process it starts are killed by their process group when it
passes, and after every run (its zygote and GPU helpers outlive a headless main process)."""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator, Optional, Sequence

BINARY = "chromium"


def available() -> Optional[str]:
    """None when Chromium can run here, else why not."""
    return None if shutil.which(BINARY) else "no chromium (apt-get install chromium)"


def run(args: Sequence[str], profile: Path, timeout: float = 120,
        netns: Optional[str] = None) -> subprocess.CompletedProcess:
    """``chromium --headless ARGS`` with its own profile and home under ``profile`` (never
    the user's), in network namespace ``netns`` if given."""
    profile.mkdir(parents=True, exist_ok=True)
    argv = [BINARY, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
            "--disable-extensions", "--disable-dev-shm-usage", "--hide-scrollbars",
            f"--user-data-dir={profile / 'data'}", *args]
    if netns:
        argv = ["ip", "netns", "exec", netns, *argv]
    env = dict(os.environ, HOME=str(profile), XDG_CONFIG_HOME=str(profile / "config"),
               XDG_CACHE_HOME=str(profile / "cache"))
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=env, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        _kill_group(proc.pid)
        out, err = proc.communicate(timeout=30)
        raise AssertionError(f"chromium ran past {timeout}s: {err[-2000:]}") from None
    finally:
        _kill_group(proc.pid)
    return subprocess.CompletedProcess(argv, proc.returncode, out, err)


def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


@contextmanager
def offline_namespace(name: str) -> Iterator[str]:
    """A fresh network namespace (only its loopback, down: no route anywhere), removed
    after."""
    made = subprocess.run(["ip", "netns", "add", name], capture_output=True, text=True,
                          timeout=30)
    if made.returncode != 0:
        raise RuntimeError(f"ip netns add {name}: {made.stderr.strip()}")
    try:
        yield name
    finally:
        subprocess.run(["ip", "netns", "delete", name], capture_output=True, timeout=30)
