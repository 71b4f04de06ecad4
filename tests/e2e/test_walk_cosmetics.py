"""The small things a new user read on a third walk (issue 39): a path with a doubled slash, a
pserver log line per connection that names no trainer."""
from launchutil import TEMPLATES, fluidctl


def test_verify_names_the_manifest_once_slashed(tmp_path):
    (tmp_path / "data.txt").write_text("".join(f"{i}\n" for i in range(100)))
    fluidctl("shard-data", "data.txt", "--trainers", 2, "-o", "shards/", cwd=tmp_path, check=0)
    with open(tmp_path / "shards" / "data.txt-00000", "a") as shard:
        shard.write("x\n")
    res = fluidctl("shard-data", "--verify", "shards/", cwd=tmp_path, check=1)
    assert "differ from shards/manifest.json:" in res.stderr, res.stderr
    assert "//" not in res.stderr, res.stderr


def test_pserver_log_has_no_line_per_connection_without_a_trainer(tmp_path):
    fluidctl("train", "--mode", "pserver", "--pservers", 1, "--nproc", 2, "--log-dir",
             tmp_path / "logs", TEMPLATES / "train_pserver.py", cwd=tmp_path, timeout=180,
             check=0)
    log = (tmp_path / "logs" / "serverlog.0").read_text()
    assert "serving" in log, log
    assert "trainer None" not in log, log
