"""`fluidctl shard-data --to-hosts`: shard i lands only on the node of trainer i (two real sshd
nodes; '{host}' in --remote-dir keeps their copies apart on this one machine)."""
import os
import subprocess
import sys

from launchutil import fluidctl


def _data(tmp_path, lines=1000):
    path = tmp_path / "train.txt"
    path.write_text("".join(f"record {i}\n" for i in range(lines)))
    return path


def test_each_shard_goes_only_where_its_trainer_runs_25_8_with_progress(tmp_path, sshd_nodes):
    """... and in a pipe each node's steps are one stderr line each, as they happen."""
    hosts = sshd_nodes.hostfile("hosts.shard", slots=2)
    _data(tmp_path)
    remote = tmp_path / "remote" / "{host}"
    res = fluidctl("shard-data", "train.txt", "--trainers", 4, "-o", "shards", "--to-hosts",
                   hosts, "--ssh-config", sshd_nodes.config, "--remote-dir", remote,
                   cwd=tmp_path, timeout=120)
    assert res.returncode == 0, res.stderr
    for node in ("node1", "node2"):
        steps = [line for line in res.stderr.splitlines() if line.startswith(f"{node}: ")]
        assert [s.split(" (")[0] for s in steps] == [
            f"{node}: connected", f"{node}: sending 2 shard(s) and the manifest",
            f"{node}: verifying the shards' digests", f"{node}: done"], res.stderr
    for node, ranks in (("node1", (0, 1)), ("node2", (2, 3))):
        where = tmp_path / "remote" / node / "shards"
        assert sorted(os.listdir(where)) == sorted(
            [f"train.txt-{r:05d}" for r in ranks] + ["manifest.json"])
        for r in ranks:
            name = f"train.txt-{r:05d}"
            assert (where / name).read_bytes() == (tmp_path / "shards" / name).read_bytes()
    # trainer 2 on node2 finds its shard there with the runtime's reader
    out = subprocess.run(
        [sys.executable, "-c", "from fluidctl.runtime.data import shard_path; "
         f"print(shard_path({str(tmp_path / 'remote' / 'node2' / 'shards')!r}))"],
        env=dict(os.environ, PADDLE_TRAINER_ID="2", PADDLE_TRAINERS_NUM="4"),
        capture_output=True, text=True, check=True).stdout
    assert out.strip().endswith("node2/shards/train.txt-00002")


def test_slots_must_match_trainers_and_nothing_is_written(tmp_path, sshd_nodes):
    hosts = sshd_nodes.hostfile("hosts.shard3", slots=2)
    _data(tmp_path)
    res = fluidctl("shard-data", "train.txt", "--trainers", 3, "-o", "shards", "--to-hosts",
                   hosts, "--ssh-config", sshd_nodes.config, cwd=tmp_path, timeout=60)
    assert res.returncode == 2 and "4 trainer slot(s) but --trainers is 3" in res.stderr
    assert not (tmp_path / "shards").exists()


def test_an_unreachable_node_stops_before_sharding(tmp_path, sshd_nodes):
    hosts = tmp_path / "hosts"
    hosts.write_text("node1 slots=1\n127.0.0.4:1 slots=1\n")
    _data(tmp_path)
    res = fluidctl("shard-data", "train.txt", "--trainers", 2, "-o", "shards", "--to-hosts",
                   hosts, "--ssh-config", sshd_nodes.config, cwd=tmp_path, timeout=60)
    assert res.returncode == 2
    assert res.stderr.splitlines()[-1].startswith("error: node 127.0.0.4 could not be reached: ")
    assert not (tmp_path / "shards").exists()


def test_remote_options_need_to_hosts(tmp_path):
    _data(tmp_path)
    res = fluidctl("shard-data", "train.txt", "--trainers", 2, "-o", "shards", "--remote-dir",
                   "/x", cwd=tmp_path)
    assert res.returncode == 2 and "go with --to-hosts" in res.stderr
    assert not (tmp_path / "shards").exists()
