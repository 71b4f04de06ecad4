"""Acceptance: unmodified torch DDP and PaddlePaddle DataParallel scripts run under
`fluidctl train --nproc 2` on CPU (gloo), reading only the environment fluidctl sets.

They run when torch / paddle are importable (.ci/run installs both)."""
import importlib.util
import re

import pytest

from launchutil import ROOT, fluidctl, torch_exit_ok

SCRIPTS = ROOT / "tests" / "scripts"


def _ranks_agree(stdout, tag):
    found = re.findall(rf"\[trainer (\d)\] {tag} rank (\d)/2 .*allreduce 3\.0 weights (\[.*\])",
                       stdout)
    assert sorted((a, b) for a, b, _ in found) == [("0", "0"), ("1", "1")], stdout
    assert found[0][2] == found[1][2]          # gradients were averaged: same weights everywhere


@pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="torch not installed")
def test_unmodified_torch_ddp_gloo_script(tmp_path):
    res = fluidctl("train", "--nproc", 2, "--tee", "all", SCRIPTS / "torch_ddp.py",
                   cwd=tmp_path, timeout=300)
    assert torch_exit_ok(res.returncode, res.stdout + res.stderr), res.stdout + res.stderr
    _ranks_agree(res.stdout, "torch")


@pytest.mark.skipif(importlib.util.find_spec("paddle") is None, reason="paddle not installed")
def test_unmodified_paddle_dataparallel_script(tmp_path):
    res = fluidctl("train", "--nproc", 2, "--tee", "all", SCRIPTS / "paddle_dp.py",
                   cwd=tmp_path, timeout=300)
    assert res.returncode == 0, res.stdout + res.stderr
    _ranks_agree(res.stdout, "paddle")
