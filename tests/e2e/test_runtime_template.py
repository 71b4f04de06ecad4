"""templates/train_nccl2.py runs as one process and as several, and learns."""
import re
import subprocess
import sys

import rankspawn

SCRIPT = "templates/train_nccl2.py"
EPOCH = re.compile(r"^epoch (\d+): loss ([\d.]+) accuracy ([\d.]+)", re.M)


def epochs(text):
    return [(int(e), float(loss), float(acc)) for e, loss, acc in EPOCH.findall(text)]


def test_single_process_learns():
    out = subprocess.run([sys.executable, SCRIPT, "--epochs", "3"], cwd=rankspawn.ROOT,
                         capture_output=True, text=True, timeout=120, check=True).stdout
    seen = epochs(out)
    assert [e for e, _, _ in seen] == [1, 2, 3]
    assert seen[-1][1] < seen[0][1] and seen[-1][2] > 0.7
    assert "1 trainer(s), transport single" in out


def test_two_trainers_report_from_rank_0_only(tmp_path):
    result = rankspawn.run([SCRIPT, "--epochs", "3", "--strategy", "Reduce"], 2, tmp_path)
    assert result.ok(), result
    seen = epochs(result.outputs[0])
    assert [e for e, _, _ in seen] == [1, 2, 3] and seen[-1][2] > 0.7
    assert "2 trainer(s), transport shm" in result.outputs[0]
    assert epochs(result.outputs[1]) == []
