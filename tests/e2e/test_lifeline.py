"""The launcher's watchdog (fluidctl/procs/lifeline.py), a POSIX sh loop: what it kills and removes
when the launcher dies, what it leaves alone at a normal end, and which lines it refuses."""
import os
import signal
import subprocess
import sys

import psutil
import pytest

from fluidctl.procs import lifeline
from launchutil import wait_for


def _group():
    """A process group of a sleeper and its own child (what a worker's children look like)."""
    proc = subprocess.Popen(["sh", "-c", "sleep 300 & exec sleep 300"], start_new_session=True)
    wait_for(lambda: len(psutil.Process(proc.pid).children()) == 1, what="the sleeper's child")
    return proc, [proc.pid] + [c.pid for c in psutil.Process(proc.pid).children()]


def _alive(pids):
    return [p for p in pids if psutil.pid_exists(p)
            and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]


def test_launcher_death_kills_every_group_and_removes_the_dirs(tmp_path):
    proc, pids = _group()
    diag = tmp_path / "diag"
    (diag / "sub").mkdir(parents=True)
    dog = lifeline.Watchdog()
    try:
        dog.add(proc.pid)
        dog.remove_on_death(diag)
        dog._proc.stdin.close()          # EOF without "done": what the kernel does on SIGKILL
        assert dog._proc.wait(10) == 0
        wait_for(lambda: proc.poll() is not None, what="the group leader's end")
        assert proc.returncode == -signal.SIGKILL
        wait_for(lambda: not _alive(pids), what="every process of the group to end")
        assert not diag.exists()
    finally:
        for p in _alive(pids):
            os.kill(p, signal.SIGKILL)
        proc.wait()


def test_a_normal_end_kills_nothing(tmp_path):
    proc, pids = _group()
    diag = tmp_path / "diag"
    diag.mkdir()
    dog = lifeline.Watchdog()
    try:
        dog.add(proc.pid)
        dog.remove_on_death(diag)
        dog.close()
        assert dog._proc.returncode == 0
        assert _alive(pids) == pids and diag.is_dir()
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def _watchdog_logging(command, log, feed, shell="/bin/sh", env=None):
    """The watchdog script with ``command`` (kill or rm) replaced by a logger writing its
    arguments to ``log``, fed ``feed`` then EOF (the launcher gone); the script's exit code."""
    script = f'{command}() {{ printf "%s\\n" "$*" >> "{log}"; }}\n' + lifeline._WATCH_SH
    return subprocess.run([shell, "-c", script], input=feed, text=True, env=env,
                          timeout=30).returncode


SHELLS = [s for s in ("/bin/dash", "/bin/bash") if os.path.exists(s)]


@pytest.mark.parametrize("home", ["set", "unset"])
@pytest.mark.parametrize("shell", SHELLS)
def test_a_service_group_gets_sigterm_first_under_dash_and_bash(tmp_path, shell, home):
    """'~PGID' registers a pserver's group as a service: SIGTERM before anything else, then
    the grace period, then SIGKILL. '${line#~}' would tilde-expand '~' to $HOME (so nothing
    is stripped and the group is never registered): tested with HOME set and unset, under
    both shells that run /bin/sh in practice. Ids below 2 and junk are refused as for '+'."""
    env = {k: v for k, v in os.environ.items() if k != "HOME"}
    if home == "set":
        env["HOME"] = str(tmp_path)
    log = tmp_path / "killed"
    feed = "@1\n~1\n~\n~x7\n~-5\n~4242\n+4343\n"
    assert _watchdog_logging("kill", log, feed, shell, env) == 0
    lines = log.read_text().splitlines()
    assert lines[:2] == ["-s TERM -- -4242", "-s KILL -- -4343"], lines
    assert lines[-1] == "-s KILL -- -4242", lines
    assert not any(l.endswith(("-1", "-", "-x7", "--5")) for l in lines), lines


def _fresh_python(code):
    """stdout of ``code`` run by a new interpreter (a process with no children of pytest's)."""
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60)
    assert res.returncode == 0, res.stderr
    return res.stdout


def test_only_group_ids_above_1_are_taken(tmp_path):
    """'kill -- -1' would be every process we may signal: the script is run with kill()
    replaced by a logger, fed junk and dangerous ids, then EOF."""
    log = tmp_path / "killed"
    feed = "+1\n+0\n+\n+-5\n+12x\n+ 7\n+$(touch {bad})\n!\n+4242\n+017\n".format(
        bad=tmp_path / "bad")
    assert _watchdog_logging("kill", log, feed) == 0
    assert log.read_text().splitlines() == ["-s KILL -- -4242", "-s KILL -- -017"]
    assert not (tmp_path / "bad").exists()


def test_the_root_directory_is_never_removed(tmp_path):
    """rm replaced by a logger: '!/' is refused, a real path is passed on."""
    log = tmp_path / "removed"
    assert _watchdog_logging("rm", log, f"!/\n!{tmp_path}/diag\n") == 0
    assert log.read_text().splitlines() == [f"-rf -- {tmp_path}/diag"]


def test_has_children_sees_a_child_of_any_thread():
    """sweep_descendants imports psutil only when /proc says this process has a child; a child
    started by another thread is listed under that thread's task."""
    code = (
        "import subprocess, threading\n"
        "from fluidctl.procs.local import _has_children\n"
        "seen = [_has_children()]\n"
        "p = subprocess.Popen(['sleep', '30'])\n"
        "seen.append(_has_children())\n"
        "p.kill(); p.wait()\n"
        "seen.append(_has_children())\n"
        "box = []\n"
        "t = threading.Thread(target=lambda: box.append(subprocess.Popen(['sleep', '30'])))\n"
        "t.start(); t.join()\n"
        "seen.append(_has_children())\n"
        "box[0].kill(); box[0].wait()\n"
        "print(seen)\n")
    assert _fresh_python(code).strip() == "[False, True, False, True]"


def test_has_children_scans_again_when_a_thread_ends_meanwhile():
    """A task listed but gone by the time its children file is read (a thread that just ended)
    is not 'unknown': the scan is made again, and a clean process is still found childless."""
    code = (
        "import os\n"
        "from fluidctl.procs import local\n"
        "real, calls = os.listdir, []\n"
        "def listdir(path):\n"
        "    calls.append(path)\n"
        "    names = real(path)\n"
        "    return names + ['999999999'] if len(calls) == 1 else names\n"
        "os.listdir = listdir\n"
        "print(local._has_children(), len(calls))\n")
    assert _fresh_python(code).split() == ["False", "2"]


def test_the_sweep_reaps_dead_descendants_and_reports_only_live_ones():
    """A rank whose mpirun exited before collecting it is re-parented to the launcher (a child
    subreaper) as a zombie: reaped, not reported as a leftover; a live one is stopped and
    named. (Every mpirun abort used to log 'stopped 6 leftover process(es)' for 3 dead ranks
    and their tees.)"""
    code = (
        "import subprocess, time, psutil\n"
        "from fluidctl.procs import local\n"
        "assert local.become_subreaper()\n"
        "subprocess.run(['sh', '-c', 'sleep 0.2 & sleep 30 & exit 0'])\n"
        "me, deadline = psutil.Process(), time.monotonic() + 20\n"
        "while time.monotonic() < deadline:\n"
        "    kids = me.children()\n"
        "    if any(k.status() == psutil.STATUS_ZOMBIE for k in kids): break\n"
        "    time.sleep(0.02)\n"
        "live = [k.pid for k in kids if k.status() != psutil.STATUS_ZOMBIE]\n"
        "names = local.sweep_descendants(5)\n"
        "print(len(kids), len(names), names[0].startswith(f'{live[0]} sleep (parent '),\n"
        "      me.children())\n")
    assert _fresh_python(code).strip() == "2 1 True []"


def test_only_dead_descendants_cost_no_psutil_import():
    """srun leaves a helper of its own re-parented here as a zombie at every normal end: it is
    reaped without importing psutil (~5-12 ms of every Slurm launch's exit)."""
    code = (
        "import subprocess, sys, time\n"
        "from fluidctl.procs import local\n"
        "assert local.become_subreaper()\n"
        "subprocess.run(['sh', '-c', 'sleep 0.1 & exit 0'])\n"
        "deadline = time.monotonic() + 20\n"
        "while local._has_children() and time.monotonic() < deadline:\n"
        "    time.sleep(0.02)\n"
        "dead = local._child_pids()\n"
        "print(len(dead), local.sweep_descendants(5), 'psutil' in sys.modules,\n"
        "      local._child_pids())\n")
    assert _fresh_python(code).strip() == "1 [] False []"


STARTER = """
import os, signal, sys, time
from fluidctl.procs.local import LocalProcess
p = LocalProcess("t", sys.argv[1:], dict(os.environ), os.devnull, service=bool(os.environ.get("SVC")))
print(p.pid, flush=True)
time.sleep(300)
"""


@pytest.mark.parametrize("service, signum", [(False, signal.SIGKILL), (True, signal.SIGTERM)])
def test_a_started_process_gets_its_signal_when_its_starter_is_killed(tmp_path, service,
                                                                        signum):
    """No watchdog here: the parent-death signal alone ends the child, through setpriv where
    the machine has it (Popen can vfork then: no Python runs in the child before its exec)."""
    if lifeline._setpriv():
        run, preexec = lifeline.dying_with_us(["sleep", "300"], signum, os.environ)
        assert preexec is None and run[-3:] == ["--", "sleep", "300"]
        assert run[1:3] == ["--pdeathsig", signum.name]
    trap = tmp_path / "trapped"
    child = ["sh", "-c", f"trap 'echo TERM > {trap}; exit 0' TERM; sleep 300 & wait"]
    starter = subprocess.Popen([sys.executable, "-c", STARTER, *child], stdout=subprocess.PIPE,
                               text=True, env={**os.environ, "SVC": "1" if service else ""})
    pid = int(starter.stdout.readline())
    try:
        wait_for(lambda: psutil.Process(pid).cmdline()[:2] == ["sh", "-c"],
                 what="the child's exec")
        starter.kill()
        starter.wait()
        starter.stdout.close()
        wait_for(lambda: not _alive([pid]), what="the child's end after its starter's")
        assert trap.exists() == service      # a service's SIGTERM is trapped; SIGKILL is not
    finally:
        try:
            os.killpg(pid, signal.SIGKILL)  # the sleep: the watchdog's part, not tested here
        except ProcessLookupError:
            pass


def test_a_program_exec_cannot_run_fails_in_popen_as_before(tmp_path):
    """setpriv would exit 127 for it; the program is checked first and Popen says why."""
    run, preexec = lifeline.dying_with_us(["no-such-program-here"], signal.SIGKILL, os.environ)
    assert run == ["no-such-program-here"] and preexec is not None
    script = tmp_path / "not-executable.sh"
    script.write_text("echo hi\n")
    run, preexec = lifeline.dying_with_us([f"./{script.name}"], signal.SIGKILL, os.environ,
                                          cwd=str(tmp_path))
    assert preexec is not None
    from fluidctl.procs.local import LocalProcess
    with pytest.raises(FileNotFoundError):
        LocalProcess("t", ["no-such-program-here"], dict(os.environ), str(tmp_path / "log"))


@pytest.mark.parametrize("knows, found", [(True, True), (False, False)])
def test_setpriv_is_used_only_where_it_knows_pdeathsig(tmp_path, monkeypatch, knows, found):
    """util-linux before 2.33 has setpriv without --pdeathsig: the option's name is looked
    for in the program (its getopt table), and without it the preexec path stays."""
    fake = tmp_path / "setpriv"
    fake.write_text("#!/bin/sh\n# --reuid --regid" + (" --pdeathsig" if knows else "") + "\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setattr(lifeline, "_SETPRIV", None)
    assert lifeline._setpriv() == (str(fake) if found else "")
    run, preexec = lifeline.dying_with_us(["sleep", "1"], signal.SIGKILL, os.environ)
    assert (preexec is None) == found and (run[0] == str(fake)) == found
