"""A rank's pages on a network file system (fluidctl/diagnostics/pages.py): which file systems
get a published copy, the copy itself, and that pages seen late (as through NFS) never make
the straggler watcher name the wrong rank or kind."""
import os
from pathlib import Path

import pytest

from fluidctl.diagnostics import pages, progress
from fluidctl.diagnostics import stragglers as st
from fluidctl.diagnostics import stragglerwatch as sw
from fluidctl.paths import DiagDir, LogLayout

from launchutil import wait_for

MOUNTINFO = """\
22 27 0:21 / /proc rw,relatime - proc proc rw
27 1 254:0 / / rw,relatime - ext4 /dev/vda rw
25 24 0:23 / /dev/shm rw,relatime - tmpfs tmpfs rw
40 27 0:50 / /shared rw,relatime shared:7 - nfs4 fs1:/export rw,vers=4.2
41 40 0:51 / /shared/fast rw,relatime - lustre 10.0.0.1@tcp:/fs rw
42 27 0:52 / /home/me/my\\040data rw - fuse.sshfs me@box:/d rw
"""


def test_the_mount_holding_a_path_and_whether_it_gets_a_copy():
    found = {p: pages.mount_of(p, MOUNTINFO) for p in (
        "/shared/logs/.fluidctl_diag.x", "/shared/fast/logs", "/dev/shm/fluidctl_diag.1",
        "/sharedness/x", "/home/me/my data/log")}
    assert found == {"/shared/logs/.fluidctl_diag.x": ("/shared", "nfs4"),
                     "/shared/fast/logs": ("/shared/fast", "lustre"),
                     "/dev/shm/fluidctl_diag.1": ("/dev/shm", "tmpfs"),
                     "/sharedness/x": ("/", "ext4"),
                     "/home/me/my data/log": ("/home/me/my data", "fuse.sshfs")}
    assert [t for t in ("nfs", "nfs4", "cifs", "fuse.sshfs", "9p") if not pages.published(t)] == []
    assert [t for t in ("tmpfs", "ext4", "xfs", "lustre", "gpfs", "ceph") if pages.published(t)] == []


def test_the_environment_decides_where_the_guess_is_wrong(tmp_path):
    assert pages.mode_for(tmp_path, {"FLUIDCTL_DIAG_WRITE": "pwrite"}) == "pwrite"
    assert pages.mode_for(tmp_path, {"FLUIDCTL_DIAG_WRITE": "mmap"}) == "mmap"
    assert pages.mode_for("/dev/shm", {}) == "mmap"


def test_a_published_page_reaches_its_file_whole_and_its_last_state_on_close(tmp_path):
    diag = DiagDir(tmp_path)
    page = pages.map_shared(diag.steps(3), st.SLOTS * 8, mode="pwrite")
    assert isinstance(page, pages.PublishedPage)
    assert diag.steps(3).read_bytes() == bytes(st.SLOTS * 8)    # there, zero-filled, at once
    sums = memoryview(page).cast("q")
    sums[st.COMPUTE], sums[st.WAIT], sums[st.COUNT] = 5, 6, 2
    wait_for(lambda: 3 in st.read_all(diag) and st.read_all(diag)[3].count == 2, 5,
             "the copy")
    assert st.read_all(diag)[3][:3] == (2, 5, 6)
    sums[st.COUNT] = 3
    sums.release()
    page.close()                                    # the last state, without waiting
    assert st.read_all(diag)[3].count == 3
    assert page not in pages._pages


def test_the_hang_watchdog_counter_is_published_too(tmp_path, monkeypatch):
    monkeypatch.setenv("FLUIDCTL_DIAG_WRITE", "pwrite")
    monkeypatch.setattr(pages, "_modes", {})
    reporter = progress.Reporter(DiagDir(tmp_path), 1)
    try:
        assert isinstance(reporter._map, pages.PublishedPage)
        reporter.bump()
    finally:
        reporter.close()
    assert progress.read_all(DiagDir(tmp_path)) == {1: 1}


# --- pages seen late: never a false report ---------------------------------------------------
PERIOD = 0.011, 0.111       # seconds per collective before and during the fault


def truth(rank, t, fault):
    """Rank ``rank``'s sums at time ``t`` of a job whose rank 0 data loader sleeps 100 ms per
    batch during ``fault`` (start, end): the others wait that long for it."""
    s = [0, 0, 0, 0]                                # count, compute, wait, data in s
    edges = [0.0, fault[0], fault[1], t]
    for i, (a, b) in enumerate(zip(edges, edges[1:])):
        b = min(b, t)
        if b <= a:
            continue
        slow = i == 1
        n = (b - a) / PERIOD[slow]
        compute = 0.110 if slow and rank == 0 else 0.010
        s[0] += n
        s[1] += n * compute
        s[2] += n * (PERIOD[slow] - compute)
        s[3] += n * (0.100 if slow and rank == 0 else 0.0)
    count, compute, wait, data = int(s[0]), *(int(v * 1e9) for v in s[1:])
    return st.Sample(count=count, compute=compute, wait=wait, data=data, link=0, peer=-1)


def test_pages_seen_up_to_a_second_late_name_the_slow_rank_or_nobody(tmp_path):
    """Each rank's page is seen as it was at its last copy (every 0.5 s, each rank at its own
    phase) plus up to 0.5 s of the reader's caching: whatever the lag, a verdict names rank 0's
    data loader, during the fault, and nothing else; a healthy job is never reported."""
    for fault in ((5.0, 12.0), (1e9, 1e9)):
        now = [0.0]
        lag = {0: 0.13, 1: 0.61, 2: 0.97}           # seconds behind, different per rank

        def samples():
            t = now[0]
            return {r: truth(r, max(0.0, t - lag[r] - ((t - lag[r]) % pages.PUBLISH_EVERY)),
                             fault) for r in lag}
        said = []
        log = tmp_path / f"log{fault[0]:g}"
        log.mkdir()
        w = sw.Watcher(samples, lambda: {0: "node1", 1: "node2", 2: "node3"}, said.append, log,
                       clock=lambda: now[0])
        found = []
        while now[0] < 20.0:
            now[0] += st.POLL
            v = w.step()
            if v is not None:
                found.append((now[0], v))
        if fault[0] > 100:
            assert said == [] and not LogLayout(log).stragglers_json.exists()
            continue
        assert found and all(v.key() == ("data", (0,)) for _, v in found), found
        assert all(fault[0] < t <= fault[1] + 2.0 for t, _ in found), found
        assert said[0].startswith("fluidctl: straggler: rank 0 (node1) is slow data")


def test_a_fork_never_publishes_its_parents_pages(tmp_path):
    page = pages.map_shared(tmp_path / "steps.0", 64, mode="pwrite")
    try:
        pid = os.fork()
        if pid == 0:
            forgotten = pages._pages == [] and pages._thread is None
            memoryview(page).cast("q")[0] = 99          # the child's copy changes ...
            page.close()                                # ... and is never written
            os._exit(0 if forgotten else 1)
        assert os.waitpid(pid, 0)[1] == 0
        assert page in pages._pages
        assert (tmp_path / "steps.0").read_bytes() == bytes(64)
    finally:
        page.close()


def _diag_dir_of_a_killed_process():
    """A DiagDir made by a child that is then SIGKILLed (as an agent killed with -9): its
    directory stays behind in /dev/shm."""
    import signal
    import subprocess
    import sys
    child = subprocess.Popen([sys.executable, "-c",
                              "import sys, time\n"
                              "from fluidctl.paths import DiagDir\n"
                              "print(DiagDir.create().root, flush=True)\n"
                              "time.sleep(300)\n"], stdout=subprocess.PIPE, text=True)
    try:
        root = Path(child.stdout.readline().strip())
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait(30)
    return root


def test_39_13_a_later_diag_dir_sweeps_those_of_dead_processes():
    import os
    import shutil
    if not os.access("/dev/shm", os.W_OK):
        pytest.skip("no writable /dev/shm")
    dead = _diag_dir_of_a_killed_process()
    assert dead.is_dir() and str(dead).startswith("/dev/shm/fluidctl_diag.")
    alien = Path("/dev/shm") / f"fluidctl_diag.{os.getpid()}-no-owner"
    alien.mkdir()                           # no owner record: not ours to judge, kept
    mine = DiagDir.create()
    try:
        assert not dead.exists() and alien.is_dir() and mine.root.is_dir()
        again = DiagDir.create()            # a live one's directory is never swept
        assert mine.root.is_dir()
        again.remove()
    finally:
        mine.remove()
        shutil.rmtree(alien, ignore_errors=True)
        shutil.rmtree(dead, ignore_errors=True)
