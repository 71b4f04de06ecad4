"""A partition: one node's link cut while the job runs (namespace nodes, tests/netns.py). The
ranks on the other node wait in their allreduce; the cut node's agent goes silent, and the hang
report names its rank as unreachable."""
import json
import re
import time

from launchutil import start_fluidctl, wait_for
from troubleutil import TROUBLE


def test_a_cut_link_is_a_partition_naming_the_node(tmp_path, netns_nodes):
    nodes = netns_nodes(2)
    log = tmp_path / "log"
    job = start_fluidctl("train", "--hostfile", nodes.hostfile(), "--ssh-config", nodes.config,
                         "--hang-timeout", 3, "--log-dir", log, TROUBLE, "busy", 600,
                         cwd=tmp_path)
    try:
        first = log / "node1" / "workerlog.0"
        wait_for(lambda: first.exists() and "rank 0 ready" in first.read_text(), timeout=60,
                 what="rank 0 ready")
        nodes.link_down("node2")
        cut = time.monotonic()
        _, err = job.communicate(timeout=120)
        took = time.monotonic() - cut
    finally:
        job.kill()
    assert job.returncode == 124, err
    assert re.search(r"fluidctl: the job hung: partition: rank 1 on node2 cannot be reached "
                     r"\(its node \(node2\) did not answer: nothing came from it for \d+s\); "
                     r"rank 0 waits in broadcast #\d+ \(trouble\.py:\d+\)", err), err
    assert took <= 3 + 10 + 5, took            # + the wait for the cut node's answer
    hang = json.loads((log / "failure.json").read_text())["hang"]
    assert hang["class"] == "partition" and hang["ranks"] == [1]
