"""Every option of ``fluidctl train`` (trainargs.py declares them all, the backends' own
included) against the backends that plan without a cluster (local, mpi, k8s): each is honoured,
seen in what the backend makes of it, or refused in one line with exit 2; nothing is silently
dropped (issue 42). The table and the walk: tests/optionwalk.py; ssh and fabric:
tests/cluster/test_every_option_nodes.py; slurm (its batch script, on a real controller):
tests/cluster/test_every_option_slurm.py."""
import pytest

import optionwalk as walk


def test_every_option_is_walked():
    """A new option without a row in the walk's table fails here."""
    own = set(walk._own_options())
    assert set(walk.every_option()) - own == set(walk.WALK) - own


CASES = [(name, backend) for name in walk.every_option() for backend in walk.BACKENDS]


@pytest.mark.parametrize("name,backend", CASES, ids=[f"{b}{n}" for n, b in CASES])
def test_an_option_is_honoured_or_refused(name, backend, capsys, tmp_path, monkeypatch):
    expect = walk.expectation(name, backend)
    if expect is None:
        pytest.skip("the backend's own option: its own tests")
    walk.prepare(tmp_path, monkeypatch)
    base = list(walk.BACKENDS[backend])
    if name in ("--hostfile", "--hosts") and backend == "mpi":
        base = base[:2] + base[4:]              # its own nodes instead of the walk's
    walk.walk_one(name, backend, base, expect, capsys, tmp_path, monkeypatch)
