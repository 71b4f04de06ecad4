"""Helpers for the tests of fluidctl top and the metrics endpoint: a real Prometheus (Debian's
``prometheus``) in the foreground with its own config and data dir, its HTTP API, tmux
sessions, and a running straggle.py job."""
import contextlib
import json
import re
import shutil
import subprocess
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

from fluidctl.net import free_port
from launchutil import wait_for


def metrics_url(log_dir: Path, timeout: float = 60.0) -> str:
    """The endpoint the launcher named in launch.log (``--metrics-port 0``: a free port)."""
    def found():
        try:
            hit = re.search(r"metrics: (http://\S+)", (log_dir / "launch.log").read_text())
        except FileNotFoundError:
            return None
        return hit.group(1) if hit else None
    return wait_for(found, timeout, "the metrics URL in launch.log")


def query(base: str, expr: str, timeout: float = 10.0) -> list:
    """Prometheus's /api/v1/query result for ``expr`` (instant vector)."""
    url = f"{base}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
    with urllib.request.urlopen(url, timeout=timeout) as reply:
        body = json.load(reply)
    assert body["status"] == "success", body
    return body["data"]["result"]


@contextlib.contextmanager
def prometheus(tmp_path: Path, target: str, interval: str = "1s"):
    """A real Prometheus scraping ``target`` (host:port) every ``interval``; yields its base
    URL once it is ready; stopped (TERM, then KILL) by pid at the end."""
    binary = shutil.which("prometheus")
    if binary is None:
        pytest.skip("Debian's prometheus is not installed (.ci/run installs it)")
    where = tmp_path / "prometheus"
    (where / "data").mkdir(parents=True, exist_ok=True)
    config = where / "prometheus.yml"
    config.write_text(
        "global:\n  scrape_interval: {i}\n  evaluation_interval: {i}\n"
        "scrape_configs:\n  - job_name: fluidctl\n    honor_labels: true\n"
        "    scrape_interval: {i}\n    scrape_timeout: {i}\n"
        "    static_configs:\n      - targets: ['{t}']\n".format(i=interval, t=target))
    for attempt in range(3):            # a port another test took meanwhile: another one
        port = free_port("127.0.0.1")
        log = open(where / f"prometheus.{attempt}.log", "wb")
        proc = subprocess.Popen(
            [binary, f"--config.file={config}", f"--storage.tsdb.path={where / 'data'}",
             f"--web.listen-address=127.0.0.1:{port}", "--storage.tsdb.retention.time=1h"],
            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        base = f"http://127.0.0.1:{port}"
        try:
            wait_for(lambda: proc.poll() is not None or _ready(base), 60, "prometheus ready")
            if proc.poll() is None:
                break
        except BaseException:
            _stop(proc)
            raise
        finally:
            log.close()
    else:
        raise AssertionError((where / "prometheus.2.log").read_text()[-2000:])
    try:
        yield base
    finally:
        _stop(proc)


def stop_job(proc, stop_file: Path, timeout: float = 90) -> None:
    """End a test job that runs until ``stop_file`` exists (SIGTERM if it has not ended by
    ``timeout``), and reap it."""
    import signal
    stop_file.touch()
    try:
        proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=60)


def _ready(base: str) -> bool:
    try:
        with urllib.request.urlopen(f"{base}/-/ready", timeout=2) as reply:
            return reply.status == 200
    except OSError:
        return False


def _stop(proc) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


class Tmux:
    """A detached tmux server of the test's own (its socket in tmp_path): ``start(cmd)``,
    ``screen()`` (capture-pane -p), killed with its server at the end."""

    def __init__(self, tmp_path: Path, width: int = 200, height: int = 50):
        if shutil.which("tmux") is None:
            pytest.skip("tmux is not installed (.ci/run installs it)")
        self.socket = str(tmp_path / "tmux.sock")
        self.width, self.height = width, height

    def _run(self, *args, check=True):
        return subprocess.run(["tmux", "-S", self.socket, *args], capture_output=True,
                              text=True, timeout=20, check=check)

    def start(self, command: str, env: dict) -> None:
        exports = " ".join(f"{k}={_quote(v)}" for k, v in env.items())
        self._run("new-session", "-d", "-x", str(self.width), "-y", str(self.height),
                  "-s", "top", f"env -u COLUMNS -u LINES {exports} {command}")

    def screen(self) -> str:
        return self._run("capture-pane", "-p", "-t", "top", check=False).stdout

    def keys(self, *keys) -> None:
        self._run("send-keys", "-t", "top", *keys)

    def close(self) -> None:
        self._run("kill-server", check=False)


def _quote(value: str) -> str:
    import shlex
    return shlex.quote(str(value))


def wait_until(predicate, timeout: float, what: str, every: float = 0.2):
    """``wait_for`` at a slower pace (each look runs a command)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(every)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")
