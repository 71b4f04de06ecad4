"""``fluidctl report`` on a real 4-rank local job (a straggler from a sleeping data loader, a
checkpoint, a failed attempt, a restart, a final failure), opened in headless Chromium as a
user would: a screenshot, the DOM (one line per rank, the timeline's events), and the page
opened inside a network namespace with no network. A report of the job while it runs, and
bad input (one line, exit 2)."""
import os
import re
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

import chromium
import netns
from launchutil import fluidctl

from fluidctl.telemetry.steptimes import read_history

JOB = str(Path(__file__).parent.parent / "scripts" / "telemetry_job.py")
RANKS = 4
# anything that would make a browser fetch: a URL in src/href/..., in CSS, an import, a script
FETCHES = re.compile(r"""(?:\b(?:src|href|action|poster|srcset|data)\s*=\s*["']?\s*"""
                     r"""(?:https?:|ftp:)?//)|url\(\s*["']?\s*(?:https?:)?//|@import|<script""",
                     re.I)


def _wait_for(condition, timeout: float, what: str, proc=None):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = condition()
        if got:
            return got
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"the job ended ({proc.returncode}) before {what}")
        time.sleep(0.1)
    raise AssertionError(f"no {what} within {timeout}s")


@pytest.fixture(scope="module")
def finished_job(tmp_path_factory):
    """The job run to its end (once for this module's tests), with a report made while it
    ran: (log dir, that report, the job's console)."""
    tmp_path = tmp_path_factory.mktemp("report-job")
    log = tmp_path / "mylog"
    release = tmp_path / "release"
    argv = [sys.executable, "-m", "fluidctl", "train", "--nproc", str(RANKS),
            "--max-restarts", "1", JOB, str(tmp_path / "ckpt"), str(log / "stragglers.json"),
            "--slow", "2", "--fail", "3", "--again", "--release", str(release),
            "--min-steps", "40"]
    proc = subprocess.Popen(argv, cwd=tmp_path, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        _wait_for(lambda: len(read_history(log / "steptimes.jsonl")) >= 2, 90,
                  "step history of the running job", proc)
        running = fluidctl("report", log, "-o", tmp_path / "running.html", cwd=tmp_path,
                           timeout=120)
        release.touch()
        out, _ = proc.communicate(timeout=180)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate(timeout=30)
    assert proc.returncode != 0, out          # rank 3 failed both attempts
    assert running.returncode == 0, running.stdout + running.stderr
    return log, (tmp_path / "running.html").read_text(), out


def test_the_report_of_a_running_job_shows_it_so_far(finished_job):
    _, page, _ = finished_job
    assert "running (the report shows the job so far)" in page
    for rank in range(RANKS):
        assert f'id="rank-row-{rank}"' in page
    assert 'class="event event-attempt"' in page and "event-exit" not in page


def test_report_opens_offline_with_one_line_per_rank_and_the_timeline(finished_job, tmp_path):
    log, _, console = finished_job
    res = fluidctl("report", log, "--png", tmp_path / "plots", cwd=tmp_path, timeout=120)
    assert res.returncode == 0, res.stdout + res.stderr
    page_path = log / "report.html"
    page = page_path.read_text()
    assert not FETCHES.search(page), FETCHES.search(page)       # self-contained: no fetch
    for name in ("timeline", "step-times", "heat-map"):
        png = (tmp_path / "plots" / f"{name}.png").read_bytes()
        assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 5000, name

    shot = tmp_path / "shot.png"
    res = chromium.run(["--window-size=1200,3200", f"--screenshot={shot}",
                        page_path.as_uri()], tmp_path / "chromium")
    assert res.returncode == 0 and shot.exists(), res.stderr[-3000:]
    from matplotlib.image import imread
    pixels = imread(shot)
    assert pixels.shape[0] >= 3000 and pixels.shape[1] >= 1100
    ink = (pixels[..., :3] < 0.9).any(axis=-1)          # not white
    assert ink.mean() > 0.03, ink.mean()                # plots and tables were drawn
    colours = {tuple(p) for p in (pixels[::7, ::7, :3] * 255).astype(int).reshape(-1, 3)}
    assert len(colours) > 50                             # colour plots, not a blank page

    why = netns.available()
    if why:
        pytest.skip(why)
    with chromium.offline_namespace(f"flreport{uuid.uuid4().hex[:8]}") as ns:
        inside = subprocess.run(["ip", "netns", "exec", ns, "ip", "-o", "link"],
                                capture_output=True, text=True, timeout=30)
        assert inside.stdout.count(": ") and "lo:" in inside.stdout
        assert len(inside.stdout.strip().splitlines()) == 1, inside.stdout  # only lo
        res = chromium.run(["--dump-dom", page_path.as_uri()], tmp_path / "chromium-offline",
                           netns=ns)
    dom = res.stdout
    assert res.returncode == 0 and "</html>" in dom, res.stderr[-3000:]
    for rank in range(RANKS):
        assert f'id="rank-row-{rank}"' in dom                # the table's row
        assert f'id="step-rank-{rank}"' in dom               # its line in the plot
        assert f'id="own-rank-{rank}"' in dom
    assert 'id="rank-row-4"' not in dom
    events = re.findall(r'<tr class="event event-(\w+)">', dom)
    assert events.count("attempt") == 2 and events.count("restart") == 1, events
    assert "straggler" in events and "checkpoint" in events and events[-1] == "exit", events
    straggler = re.search(r'class="rank bad"[^>]*>|id="rank-row-2" class="rank bad"', dom)
    assert straggler, "rank 2 (the sleeping data loader) is marked as the straggler"
    first = re.search(r'id="first-failure">([^<]*)<', dom)
    assert first and "trainer 3" in first[1] and "exit code 3" in first[1], first
    assert "ended with exit code" in dom


@pytest.mark.parametrize("make, why", [
    (lambda p: p / "nope", "no job"),
    (lambda p: (p / "empty").mkdir() or p / "empty", "holds no job's logs"),
    (lambda p: (p / "f.txt").write_text("x") and p / "f.txt", "is a file"),
])
def test_bad_input_is_one_line_and_exit_2(tmp_path, make, why):
    res = fluidctl("report", make(tmp_path), cwd=tmp_path, timeout=60)
    assert res.returncode == 2, res.stdout + res.stderr
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:") and why in lines[0], res.stderr


def test_an_output_in_a_missing_directory_is_one_line(tmp_path):
    log = tmp_path / "mylog"
    log.mkdir()
    (log / "launch.log").write_text("")
    res = fluidctl("report", log, "-o", tmp_path / "no" / "r.html", cwd=tmp_path, timeout=60)
    assert res.returncode == 2 and len(res.stderr.strip().splitlines()) == 1, res.stderr
    assert "-o" in res.stderr and "Traceback" not in res.stderr
