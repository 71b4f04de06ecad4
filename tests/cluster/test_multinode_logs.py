"""Where a multi-node job's logs go (issue 13, item 8), over the two real sshd nodes on
127.0.0.2 and 127.0.0.3. They are this machine, so a node's LOG_DIR *is* the launcher's when
both use the same path (a shared file system): each log must then be written once, by the
rank, not once by the node and again by the launcher from the stream. With --remote-dir the
nodes' LOG_DIR is another directory (not shared): each side keeps its own complete copy.
Either way LOG_DIR/<host>/workerlog.N is the log, and an earlier, larger job's logs go."""
import json
import re
from pathlib import Path

import pytest

from launchutil import BEHAVE, fluidctl

LINES = 300
JOB = ("import os, sys\n"
       "rank = os.environ['PADDLE_TRAINER_ID']\n"
       f"for i in range({LINES}):\n"
       "    print(f'rank {rank} line {i}', flush=True)\n"
       "print(f'rank {rank} on stderr', file=sys.stderr, flush=True)\n")
PLACES = {0: "node1", 1: "node1", 2: "node2", 3: "node2"}


@pytest.fixture
def hosts(sshd_nodes):
    return sshd_nodes.hostfile("hosts.2x2", slots=2)


def expected(rank: int) -> str:
    return "".join(f"rank {rank} line {i}\n" for i in range(LINES)) + f"rank {rank} on stderr\n"


def plant_an_earlier_larger_job(logs: Path) -> dict:
    """Logs a 3-node, 9-rank job left in ``logs``; returns what must go and what must stay."""
    gone = {"root": logs / "workerlog.8",               # e.g. a local 9-rank job's
            "same host": logs / "node1" / "workerlog.5",
            "other host": logs / "node3" / "workerlog.7",
            "server": logs / "node3" / "serverlog.2",
            "marker": logs / ".fluidctl.shared.0123abcd"}   # a SIGKILLed launcher's
    stay = {"another job's log dir": logs / "exp2" / "workerlog.0",
            "not a log": logs / "node1" / "notes.txt"}
    for path in list(gone.values()) + list(stay.values()):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("from an earlier job\n")
    (logs / "exp2" / ".fluidctl.lock").write_text("1\n")
    return {"gone": gone, "stay": stay}


def rank_logs(where: Path):
    """Every workerlog.N below ``where``, by rank."""
    found = {}
    for path in where.rglob("workerlog.*"):
        if path.suffix[1:].isdigit():
            found.setdefault(int(path.suffix[1:]), []).append(path)
    return found


def test_a_shared_log_dir_holds_each_log_once(tmp_path, sshd_nodes, hosts):
    (tmp_path / "job.py").write_text(JOB)
    logs = tmp_path / "mylog"
    planted = plant_an_earlier_larger_job(logs)
    res = fluidctl("train", "--hostfile", hosts, "--ssh-config", sshd_nodes.config,
                   "--tee", "all", "job.py", cwd=tmp_path, timeout=180)
    assert res.returncode == 0, res.stdout + res.stderr
    for what, path in planted["gone"].items():
        assert not path.exists(), what
    assert not (logs / "node3").exists()                 # emptied, so removed
    for what, path in planted["stay"].items():
        assert path.read_text() == "from an earlier job\n", what
    found = rank_logs(tmp_path)
    for rank, host in PLACES.items():
        mine = [p for p in found[rank] if p.parent.name != "exp2"]
        assert mine == [logs / host / f"workerlog.{rank}"], mine      # exactly one file
        assert mine[0].read_text() == expected(rank)                   # complete, no doubles
        for i in (0, LINES - 1):                                       # echoed once each
            assert res.stdout.count(f"[{host}:{rank}] rank {rank} line {i}\n") == 1
    launch = (logs / "launch.log").read_text()
    assert launch.count("LOG_DIR is shared with the launcher") == 2, launch
    assert not list(logs.glob(".fluidctl.shared.*"))     # this job's marker is gone too


def test_a_log_dir_that_is_not_shared_gets_streamed_copies(tmp_path, sshd_nodes, hosts):
    ws, remote = tmp_path / "ws", tmp_path / "remote"
    for where in (ws, remote):                           # as `cluster sync` would leave it
        where.mkdir()
        (where / "job.py").write_text(JOB)
    here = plant_an_earlier_larger_job(ws / "mylog")
    there = remote / "mylog" / "node1" / "workerlog.5"   # the node's own earlier log
    there.parent.mkdir(parents=True)
    there.write_text("from an earlier job\n")
    res = fluidctl("train", "--hostfile", hosts, "--ssh-config", sshd_nodes.config,
                   "--remote-dir", remote, "job.py", cwd=ws, timeout=180)
    assert res.returncode == 0, res.stdout + res.stderr
    for what, path in here["gone"].items():
        assert not path.exists(), what
    assert not there.exists()
    for rank, host in PLACES.items():
        copy = ws / "mylog" / host / f"workerlog.{rank}"          # streamed to the launcher
        own = remote / "mylog" / host / f"workerlog.{rank}"       # written on the node
        assert copy.read_text() == expected(rank) == own.read_text()
        assert sorted(p for p in rank_logs(tmp_path)[rank] if p.parent.name != "exp2") == \
            sorted([copy, own])                          # one each side, nowhere else
    assert "LOG_DIR is shared" not in (ws / "mylog" / "launch.log").read_text()
    assert not list((remote / "mylog").glob(".fluidctl.shared.*"))
    assert re.search(r"node agent for node1: attempt 0",
                     (remote / "mylog" / "launch.node1.log").read_text())


@pytest.mark.parametrize("shared", [True, False])
def test_a_restart_header_is_written_once_per_log(tmp_path, sshd_nodes, hosts, shared):
    """The launcher writes restart headers into its logs and the node agent into its own:
    into a shared LOG_DIR only once."""
    remote = tmp_path if shared else tmp_path / "remote"
    remote.mkdir(exist_ok=True)
    res = fluidctl("train", "--hostfile", hosts, "--ssh-config", sshd_nodes.config,
                   "--remote-dir", remote, "--max-restarts", 1, BEHAVE,
                   "--fail-until-restart", 1, cwd=tmp_path, timeout=180)
    assert res.returncode == 0, res.stderr
    copies = {tmp_path / "mylog" / "node2" / "workerlog.3",
              remote / "mylog" / "node2" / "workerlog.3"}
    assert len(copies) == (1 if shared else 2)
    for log in copies:
        text = log.read_text()
        assert text.count("===== fluidctl: restart 1 of 1") == 1, text
        assert text.count("rank 3 ready restart 0") == 1, text
        assert text.count("rank 3 ready restart 1") == 1, text


def test_the_failure_report_reads_the_one_shared_log(tmp_path, sshd_nodes, hosts):
    """The report's log path, its --log-tail lines and failure.json name the one file."""
    (tmp_path / "job.py").write_text(JOB + "sys.exit(7 if rank == '3' else 0)\n")
    res = fluidctl("train", "--hostfile", hosts, "--ssh-config", sshd_nodes.config,
                   "--log-tail", 2, "job.py", cwd=tmp_path, timeout=180)
    assert res.returncode == 7, res.stderr
    log = tmp_path / "mylog" / "node2" / "workerlog.3"
    assert log.read_text() == expected(3)
    assert "log: mylog/node2/workerlog.3" in res.stderr
    assert f"rank 3 line {LINES - 1}\n" in res.stderr and "rank 3 on stderr" in res.stderr
    assert f"rank 3 line {LINES - 2}\n" not in res.stderr              # 2 lines, not more
    first = json.loads((tmp_path / "mylog" / "failure.json").read_text())["first_failure"]
    assert first["log"] == "mylog/node2/workerlog.3"
    assert first["log_tail"] == [f"rank 3 line {LINES - 1}", "rank 3 on stderr"]
    assert not (tmp_path / "mylog" / "workerlog.3").exists()
