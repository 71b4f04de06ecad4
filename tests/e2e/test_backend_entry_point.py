"""docs/architecture.md's "Adding a backend", as written: its files become a package with a
dist-info that declares the ``fluidctl.backends`` entry point, put on PYTHONPATH (as pip would
install it), and a real ``fluidctl`` lists it in --help, plans with it (--dry-run), runs a job
with it, and refuses its option under another backend."""
import json
import re

import pytest

from launchutil import ROOT, fluidctl


def walkthrough():
    text = (ROOT / "docs" / "architecture.md").read_text()
    section = re.search(r"^## Adding a backend\n(.*?)(?=^## )", text, re.S | re.M).group(1)
    return re.findall(r"^```(\w+)\n(.*?)^```", section, re.S | re.M)


@pytest.fixture
def site(tmp_path):
    """The walkthrough's package, installed into a directory of its own."""
    root = tmp_path / "site"
    points = None
    for lang, text in walkthrough():
        first = text.splitlines()[0]
        if lang == "python":
            path = root / first.lstrip("# ").strip()
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
        elif lang == "ini":
            points = text[text.index("fluidctl.backends ="):]
    assert points and (root / "fluidctl_tiny" / "__init__.py").exists()
    meta = root / "fluidctl_tiny-0.1.dist-info"
    meta.mkdir()
    (meta / "METADATA").write_text("Metadata-Version: 2.1\nName: fluidctl-tiny\nVersion: 0.1\n")
    entries = [line.strip() for line in points.splitlines()[1:] if line.strip()]
    (meta / "entry_points.txt").write_text("[fluidctl.backends]\n" + "\n".join(entries) + "\n")
    return {"PYTHONPATH": str(root)}


SCRIPT = """import os
print("rank", os.environ["RANK"], "of", os.environ["WORLD_SIZE"], "says",
      os.environ["TINY_GREETING"], flush=True)
"""


def test_a_site_backend_from_an_entry_point_plans_runs_and_is_listed(tmp_path, site):
    script = tmp_path / "t.py"
    script.write_text(SCRIPT)
    helped = fluidctl("train", "--help", cwd=tmp_path, env=site, check=0)
    assert re.search(r"--backend \[[a-z0-9|]*\|tiny\]", helped.stdout), helped.stdout
    assert "--tiny-greeting WORD" in helped.stdout and "tiny: the word every rank" in helped.stdout

    planned = fluidctl("train", "--backend", "tiny", "--nproc", 2, "--tiny-greeting", "hi",
                       "--dry-run", "--json", script, cwd=tmp_path, env=site, check=0)
    plan = json.loads(planned.stdout)
    assert plan["backend"] == "tiny" and len(plan["trainer_endpoints"]) == 2
    assert {p["env"]["TINY_GREETING"] for p in plan["procs"]} == {"hi"}

    ran = fluidctl("train", "--backend", "tiny", "--nproc", 2, "--tee", "all", "--log-dir",
                   tmp_path / "logs", script, cwd=tmp_path, env=site, check=0)
    for rank in (0, 1):
        assert f"rank {rank} of 2 says hello" in ran.stdout, ran.stdout + ran.stderr
        assert f"rank {rank} of 2 says hello" in (tmp_path / "logs" / f"workerlog.{rank}"
                                                  ).read_text()

    refused = fluidctl("train", "--tiny-greeting", "hi", script, cwd=tmp_path, env=site)
    assert refused.returncode == 2
    assert refused.stderr == "error: --tiny-greeting is a Tiny option (add --backend tiny)\n"


def test_without_the_entry_point_the_name_is_not_known(tmp_path):
    script = tmp_path / "t.py"
    script.write_text(SCRIPT)
    res = fluidctl("train", "--backend", "tiny", "--dry-run", script, cwd=tmp_path)
    assert res.returncode == 2 and "'tiny' is not one of" in res.stderr, res.stderr


def test_a_site_backend_that_cannot_load_is_one_line_and_the_rest_works(tmp_path, site):
    """A broken site package: naming it is one line; fluidctl's own backends still run."""
    (tmp_path / "site" / "fluidctl_tiny" / "launcher.py").write_text("import no_such_module\n")
    script = tmp_path / "t.py"
    script.write_text(SCRIPT.replace('os.environ["TINY_GREETING"]', '"-"'))
    broken = fluidctl("train", "--backend", "tiny", "--dry-run", script, cwd=tmp_path, env=site)
    assert broken.returncode == 2, broken.stdout + broken.stderr
    assert broken.stderr.startswith("error: --backend tiny (fluidctl_tiny.launcher:TinyLauncher)"
                                    " cannot be loaded: No module named 'no_such_module'"), \
        broken.stderr
    assert len(broken.stderr.strip().splitlines()) == 1, broken.stderr
    fluidctl("train", "--nproc", 1, "--dry-run", script, cwd=tmp_path, env=site, check=0)
