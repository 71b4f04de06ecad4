"""Helpers for tests that run the real ``fluidctl`` CLI in subprocesses."""
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parent.parent
BEHAVE = str(ROOT / "tests" / "scripts" / "behave.py")
TEMPLATES = ROOT / "templates"


# Open MPI across two "nodes" that are one host (loopback sshd at 127.0.0.2 and .3). A real
# cluster needs none of these:
# - btl tcp,self: the shared-memory transport collides between two daemons of one host;
# - coll ^han: HAN's MPI_Barrier across the two aliases hangs, even under plain mpirun;
# - ranks' TCP (btl) over lo only: by default Open MPI uses every interface, and the netns
#   tests add and remove bridges with 198.18 addresses on this host while other tests run; a
#   rank bound to an address that then vanished failed in bind() or hung in its first message.
# PRRTE's own daemons (oob) are not told to leave out 198.18.0.0/15: with that exclusion and
# several namespace bridges up (several workers' netns tests), Open MPI 5.0.11's mpirun and
# prted die of SIGSEGV in prte_oob_base_select (17 of 20 starts with four bridges, 0 of 20
# without it). The bridges cannot vanish under a running mpirun: a test that runs one holds
# tests/netns.py's INTERFACES_LOCK, which making and removing namespace nodes waits for.
# ``-c HELD_... HOLD [args]``: a process whose import of fluidctl.launch.run (the supervisor)
# takes until the file HOLD exists: what it does before that module is in. The module's body
# waits (``exec_module``), as a slow import's does, holding that module's lock only: a finder
# that waited would hold the interpreter's import lock, and every other import.
_HOLD_RUN = """
import importlib.abc, importlib.machinery, os, runpy, sys, time
HOLD = sys.argv.pop(1)


class Held(importlib.abc.Loader):
    def __init__(self, loader):
        self.loader = loader

    def create_module(self, spec):
        return self.loader.create_module(spec)

    def exec_module(self, module):
        deadline = time.monotonic() + 60
        while not os.path.exists(HOLD) and time.monotonic() < deadline:
            time.sleep(0.005)
        self.loader.exec_module(module)


class Hold(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name != "fluidctl.launch.run":
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        spec.loader = Held(spec.loader)
        return spec


sys.meta_path.insert(0, Hold())
"""
HELD_AGENT = _HOLD_RUN + """
sys.argv[0] = "agent"
runpy.run_module("fluidctl.node.agent", run_name="__main__")
"""
HELD_FLUIDCTL = _HOLD_RUN + """
from fluidctl.cli import main
main(sys.argv[1:])
"""

ONE_HOST_MPI_ENV = {"OMPI_MCA_btl": "tcp,self", "OMPI_MCA_coll": "^han",
                    "OMPI_MCA_btl_tcp_if_include": "lo"}


def fluidctl(*args, cwd, env=None, timeout=120, check=None):
    """Run ``python -m fluidctl ARGS`` and return the CompletedProcess (text)."""
    full_env = dict(os.environ)
    full_env.pop("CUDA_VISIBLE_DEVICES", None)
    full_env.update(env or {})
    proc = subprocess.run([sys.executable, "-m", "fluidctl", *map(str, args)], cwd=cwd,
                          env=full_env, capture_output=True, text=True, timeout=timeout)
    if check is not None:
        assert proc.returncode == check, (proc.returncode, proc.stdout, proc.stderr)
    return proc


def torch_exit_ok(code: int, output: str) -> bool:
    """A torch job that finished: exit 0, or torch's own gloo abort in its exit handlers after
    the script ended ("terminate called without an active exception", SIGABRT: torchrun shows
    it too, about 1 run in 10, more on a crowded machine). Anything else is a real failure."""
    return code == 0 or (code == 134 and "terminate called without an active exception"
                         in output)


def default_sigint() -> None:
    """``preexec_fn`` for a child the test will Ctrl-C: SIGINT back to its default disposition.
    A shell starts a background job (``nohup python -m pytest -q &``) with SIGINT ignored, exec
    keeps an ignored signal ignored, and Python then installs no KeyboardInterrupt handler: the
    child would never see the test's SIGINT. A user's terminal gives a foreground command the
    default; so does this."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def start_fluidctl(*args, cwd, env=None):
    full_env = dict(os.environ)
    full_env.update(env or {})
    return subprocess.Popen([sys.executable, "-m", "fluidctl", *map(str, args)], cwd=cwd,
                            env=full_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, preexec_fn=default_sigint)


def wait_for(condition, timeout=30.0, what="condition"):
    """Poll ``condition`` until true; fail the test with ``what`` after ``timeout``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.02)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def read_pids(pid_dir: Path, ranks):
    pids = []
    for r in ranks:
        pids += [int(p) for p in (pid_dir / f"{r}.pids").read_text().split()]
    return pids


def alive(pid: int) -> bool:
    """True if the pid is a running (not zombie) process."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def assert_all_gone(pids, timeout=10.0):
    """Every pid ended; zombies count as left behind only while their parent lives."""
    wait_for(lambda: not any(alive(p) for p in pids), timeout, f"pids {pids} to end")


def read_terminal(fd: int) -> bytes:
    """Everything written to the pseudo-terminal whose controller side is ``fd``, until the
    child closes it (Linux then gives EIO); ``fd`` is closed."""
    chunks = []
    while True:
        try:
            chunk = os.read(fd, 65536)
        except OSError:             # EIO: the child closed the terminal
            break
        if not chunk:
            break
        chunks.append(chunk)
    os.close(fd)
    return b"".join(chunks)


def table_row(out: str, first_cell: str):
    """The cells of the table row that starts with ``first_cell`` (rich's box, or the plain
    " | " columns fluidctl prints off a terminal)."""
    for line in out.splitlines():
        sep = "│" if "│" in line else "|"
        cells = [c.strip() for c in line.strip("│ ").split(sep)]
        if cells and cells[0] == first_cell:
            return cells
    raise AssertionError(f"no row {first_cell!r} in:\n{out}")


def silent_node_progress(argv, host: str, timeout: int, wait_s: float = 120):
    """Run a many-node command (``argv``) in a pipe, as a script would, with ``host`` a node
    that accepts connections but never speaks SSH: assert that its stderr names ``host``
    while the command still waits for it (``waiting for HOST (N s of TIMEOUT s)``), then
    let it end. Returns (exit code, stdout, every stderr line)."""
    proc = subprocess.Popen([str(a) for a in argv], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True,
                            env={"PATH": "/usr/bin:/bin", "NO_COLOR": "1",
                                 "HOME": str(Path.home()), "FLUIDCTL_STATE_DIR": os.environ["FLUIDCTL_STATE_DIR"]})
    try:
        seen = []
        for line in proc.stderr:        # the command's own --timeout bounds this
            seen.append(line.rstrip("\n"))
            if line.startswith(f"waiting for {host} ("):
                assert proc.poll() is None          # said while waiting, not afterwards
                break
        assert seen and seen[-1].startswith(f"waiting for {host} (") and \
            seen[-1].endswith(f" of {timeout} s)"), seen
        out, err = proc.communicate(timeout=wait_s)
    finally:
        proc.kill()
        proc.wait()
    return proc.returncode, out, seen + err.splitlines()
