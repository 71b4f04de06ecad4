"""Issue 40, item 13 (validation): a Kubernetes namespace is an RFC 1123 label of at most 63
characters; pserver counts and frame sizes have upper bounds. One line, exit 2, nothing
started."""
import subprocess
import sys

import pytest

from fluidctl.errors import UsageError
from fluidctl.backends.k8s.plan import K8sOptions


@pytest.mark.parametrize("namespace", ["a" * 64, "a" * 80, "-ml", "ml-", "ML", ""])
def test_40_13_a_namespace_is_an_rfc_1123_label_of_at_most_63(namespace):
    with pytest.raises(UsageError, match="--namespace") as err:
        K8sOptions(kind="pytorchjob", image="img:1", namespace=namespace).check()
    assert "63" in err.value.one_line()


def test_40_13_a_63_character_namespace_is_fine():
    K8sOptions(kind="pytorchjob", image="img:1", namespace="a" * 63).check()


def _refused(argv, state):
    res = subprocess.run(argv, capture_output=True, text=True, timeout=60,
                         env={"PATH": "/usr/bin:/bin", "FLUIDCTL_STATE_DIR": str(state)})
    assert res.returncode == 2, (res.returncode, res.stderr)
    assert len(res.stderr.splitlines()) == 1 and res.stderr.startswith("error: "), res.stderr
    return res.stderr


@pytest.mark.parametrize("flag, value", [("--trainers", "100000000000000000000"),
                                         ("--max-frame-mb", "100000000000")])
@pytest.mark.parametrize("entry", ["cli", "module"])
def test_40_13_pserver_counts_and_frame_sizes_have_upper_bounds(tmp_path, flag, value, entry):
    argv = ([sys.executable, "-m", "fluidctl", "pserver", "start"] if entry == "cli" else
            [sys.executable, "-m", "fluidctl.runtime.pserver", "--no-state"])
    err = _refused(argv + ["--port", "7164", flag, value], tmp_path)
    assert flag in err and "1048576" in err
