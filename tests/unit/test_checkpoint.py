"""fluidctl.runtime.checkpoint in one process (a world of one): commit, resume from the newest
complete checkpoint, partial and bad ones named and skipped; and the request agreement
(runtime/request.py) of one rank: file and signal requests, save vs stop, once per request."""
import os
import signal
from types import SimpleNamespace

import numpy as np
import pytest

from fluidctl import envs
from fluidctl.runtime import checkpoint, request


def ctx():
    return SimpleNamespace(rank=0, world_size=1, comm=None, _requests=None)


def test_commit_and_resume_newest(tmp_path):
    ck = checkpoint.Checkpointer(ctx(), tmp_path / "ck", keep=2)
    assert ck.load() is None
    for step in (3, 7, 11):
        ck.save(step, {"w": np.full(5, float(step)), "n": np.arange(3)}, meta={"epoch": step})
    ck.wait()
    assert sorted(p.name for p in (tmp_path / "ck").iterdir()) == [
        "step-000000007", "step-000000011"]          # keep=2 pruned step 3
    found = ck.load()
    assert found.step == 11 and found.meta == {"epoch": 11}
    assert found.arrays["w"].dtype == np.float64 and (found.arrays["w"] == 11.0).all()
    assert found.arrays["n"].tolist() == [0, 1, 2]


def test_partial_truncated_and_corrupted_parts_are_skipped(tmp_path, capsys):
    ck = checkpoint.Checkpointer(ctx(), tmp_path / "ck", keep=5)
    for step in (1, 2, 3, 4):
        ck.save(step, {"w": np.full(1000, float(step))})
    layout = ck.layout
    part = layout.part(layout.committed(4), 0)
    data = bytearray(part.read_bytes())
    data[100] ^= 0xFF                                # corrupted: same size, another digest
    part.write_bytes(bytes(data))
    three = layout.part(layout.committed(3), 0)
    three.write_bytes(three.read_bytes()[:-8])      # truncated
    (layout.committed(2) / "manifest.json").unlink()  # never committed whole
    os.makedirs(layout.staging(9))                   # a save killed half-way
    found = ck.load()
    assert found.step == 1
    err = capsys.readouterr().err
    assert f"{part} is corrupted" in err and f"{three} is truncated" in err
    assert f"{layout.committed(2)} has no manifest" in err
    assert "step-000000009" not in err               # a partial save is not even looked at


def test_object_arrays_are_refused(tmp_path):
    ck = checkpoint.Checkpointer(ctx(), tmp_path / "ck")
    with pytest.raises(checkpoint.CheckpointError, match="Python objects"):
        ck.save(1, {"x": np.array([object()])})


def test_commit_is_recorded_for_the_launcher(tmp_path, monkeypatch):
    monkeypatch.setenv(envs.CHECKPOINT_STATE, str(tmp_path / "checkpoint.json"))
    ck = checkpoint.Checkpointer(ctx(), tmp_path / "ck")
    ck.save(5, {"w": np.zeros(2)})
    import json
    record = json.loads((tmp_path / "checkpoint.json").read_text())
    assert record["step"] == 5 and record["stop"] is False
    assert record["dir"] == str(tmp_path / "ck" / "step-000000005")


def test_request_file_agreed_once(tmp_path):
    path = tmp_path / "checkpoint.request"
    req = request.Requests(None, 1, {envs.CHECKPOINT_REQUEST: str(path)})
    try:
        assert not any(req.poll() for _ in range(50))
        path.write_text("save fluidctl job checkpoint\n")
        hits = [i for i in range(100000) if req.poll()]
        assert len(hits) == 1 and req.kind == request.SAVE     # honoured once, job goes on
        os.unlink(path)
        path.write_text("stop SIGUSR1\n")                       # a new request
        assert any(req.poll() for _ in range(100000)) and req.kind == request.STOP
    finally:
        for sig in req.signals:
            signal.signal(sig, signal.SIG_DFL)


def test_request_signal_and_spacing(tmp_path):
    req = request.Requests(None, 1, {envs.CHECKPOINT_SIGNAL: "USR2"})
    try:
        for _ in range(1000):
            req.poll()
        assert req.every > 1                   # fast calls: agreements spaced out
        os.kill(os.getpid(), signal.SIGUSR2)
        assert any(req.poll() for _ in range(10 ** 6)) and req.kind == request.STOP
        assert signal.getsignal(signal.SIGUSR2) == signal.SIG_IGN     # stopping now
    finally:
        for sig in req.signals:
            signal.signal(sig, signal.SIG_DFL)


def test_the_request_environment_is_made_once_by_the_request_channel(tmp_path):
    """A checkpoint request is not a diagnostic: the ranks' request environment comes from
    launch/requests.py (the launcher's RequestChannel; a node agent's rank_env), and a
    launcher hands it to the ranks it starts beside its diagnostics' own."""
    from fluidctl.backends.base import BaseLauncher
    from fluidctl.diagnostics.watch import Diagnostics
    from fluidctl.launch.requests import RequestChannel, rank_env
    from fluidctl.paths import LogLayout
    channel = RequestChannel(tmp_path, "USR1")
    layout = LogLayout(tmp_path)
    assert channel.rank_env() == {envs.CHECKPOINT_REQUEST: str(layout.checkpoint_request),
                                  envs.CHECKPOINT_STATE: str(layout.checkpoint_state),
                                  envs.CHECKPOINT_SIGNAL: "USR1"}
    assert channel.rank_env() == rank_env(layout.checkpoint_request, layout.checkpoint_state,
                                          "USR1")
    diagnostics = Diagnostics(log_root=tmp_path)
    try:
        assert diagnostics.env() == {envs.DIAG_DIR: str(diagnostics.diag.root)}
        launcher = BaseLauncher()
        launcher._diagnostics = diagnostics
        assert launcher.diag_env() == diagnostics.env()       # no channel: no requests
        launcher.request_env = channel.rank_env()
        assert launcher.diag_env() == {**diagnostics.env(), **channel.rank_env()}
    finally:
        diagnostics.close()


def test_the_prune_leaves_every_save_in_progress_alone(tmp_path):
    """After a commit, rank 0's prune removes only committed checkpoints older than the keep
    newest: another rank's part of this job's next save, and another job's save in the same
    directory (an older step), are still being written and stay."""
    ck = checkpoint.Checkpointer(ctx(), tmp_path / "ck", keep=1)
    layout = ck.layout
    ck.save(1, {"w": np.zeros(4)})
    ck.wait()
    nxt = layout.part(layout.staging(3), 1)          # rank 1 already writing save 3
    nxt.parent.mkdir()
    nxt.write_bytes(b"x" * 16)
    other = layout.part(layout.staging(0), 0)        # another job's save, an older step
    other.parent.mkdir()
    other.write_bytes(b"y" * 16)
    ck.save(2, {"w": np.ones(4)})
    ck.wait()
    assert nxt.read_bytes() == b"x" * 16 and other.read_bytes() == b"y" * 16
    assert layout.steps() == [2]                     # the older commit went


def test_the_same_step_saved_again_replaces_the_old_commit_without_trash(tmp_path):
    ck = checkpoint.Checkpointer(ctx(), tmp_path / "ck")
    ck.save(4, {"w": np.zeros(2)})
    ck.save(4, {"w": np.ones(2)})
    ck.wait()
    assert sorted(p.name for p in (tmp_path / "ck").iterdir()) == ["step-000000004"]
    assert (ck.load().arrays["w"] == 1).all()


def test_no_sound_checkpoint_among_committed_ones_is_an_error_not_step_0(tmp_path, capsys):
    """keep=2 and both newest bad: load() raises, naming each and how to start afresh, rather
    than returning None (the script would silently start at step 0 over them)."""
    ck = checkpoint.Checkpointer(ctx(), tmp_path / "ck", keep=2)
    for step in (1, 2, 3):
        ck.save(step, {"w": np.full(100, float(step))})
    ck.wait()
    layout = ck.layout
    for step in (2, 3):
        part = layout.part(layout.committed(step), 0)
        part.write_bytes(part.read_bytes()[:-8])
    with pytest.raises(checkpoint.CheckpointError) as err:
        ck.load()
    text = str(err.value)
    assert "none of the 2 committed checkpoints" in text and str(layout.root) in text
    assert "start from step 0" in text
    assert "truncated" in capsys.readouterr().err
    assert ck.load(fresh_if_none_sound=True) is None


def test_a_save_file_counts_on_rank_0_only_a_stop_everywhere(tmp_path):
    """Each node has its own copy of a relayed ``save`` request, arriving when it arrives:
    were every rank to honour its copy, a node whose copy came after the agreed save would
    make the job save twice (seen with two ssh nodes). Rank 0's copy decides; a ``stop`` (the
    job ends after it) counts on every rank."""
    class Comm:
        rank = 1
    path = tmp_path / "checkpoint.request"
    req = request.Requests(Comm(), 1, {envs.CHECKPOINT_REQUEST: str(path)})
    try:
        path.write_text("save fluidctl job checkpoint\n")
        assert req._file_kind() == request.NONE
        path.write_text("stop SIGUSR1\n")
        assert req._file_kind() == request.STOP
        Comm.rank = 0
        path.write_text("save fluidctl job checkpoint, again\n")
        assert request.Requests(Comm(), 1, {envs.CHECKPOINT_REQUEST: str(path)})._file_kind() \
            == request.SAVE
    finally:
        for sig in req.signals:
            signal.signal(sig, signal.SIG_DFL)
