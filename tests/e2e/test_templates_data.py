"""The templates read files sharded by `fluidctl shard-data` (fluidctl.runtime.data): write the
data set, shard it, train on it, in both modes."""
import re
import subprocess
import sys

from launchutil import TEMPLATES, fluidctl


def test_nccl2_template_trains_on_shards(tmp_path):
    subprocess.run([sys.executable, TEMPLATES / "train_nccl2.py", "--write-data", "train.txt",
                    "--samples", "1000"], cwd=tmp_path, check=True)
    fluidctl("shard-data", "train.txt", "--trainers", 2, "-o", "shards", "--equalize", "pad",
             "-q", cwd=tmp_path, check=0)
    res = fluidctl("train", "--nproc", 2, TEMPLATES / "train_nccl2.py", "--data", "shards",
                   "--epochs", 3, cwd=tmp_path, timeout=120, check=0)
    assert re.search(r"2 trainer\(s\), .* 50[0-9] examples each", res.stdout), res.stdout
    losses = [float(v) for v in re.findall(r"epoch \d: loss ([\d.]+)", res.stdout)]
    assert len(losses) == 3 and losses[-1] < losses[0]


def test_pserver_template_trains_on_shards(tmp_path):
    subprocess.run([sys.executable, TEMPLATES / "train_pserver.py", "--write-data", "ctr.txt",
                    "--examples", "4000"], cwd=tmp_path, check=True)
    fluidctl("shard-data", "ctr.txt", "--trainers", 2, "-o", "shards", "-q", cwd=tmp_path,
             check=0)
    res = fluidctl("train", "--mode", "pserver", "--pservers", 1, "--nproc", 2, "--tee", "all",
                   TEMPLATES / "train_pserver.py", "--data", "shards", "--steps", 120,
                   cwd=tmp_path, timeout=120, check=0)
    done = re.findall(r"trainer \d done: loss ([\d.]+) -> ([\d.]+)", res.stdout)
    assert len(done) == 2 and all(float(b) < float(a) for a, b in done), res.stdout
