"""The command line a new user meets (issue 39): options of the launchers they come from get a
hint that says what fluidctl does instead, and a bare `fluidctl` is its help."""
import pytest

from test_cli_inprocess import run_cli

PEER_HINTS = [
    (["--master-addr", "10.0.0.1"], "--master-addr is torchrun's", "--hosts"),
    (["--master_addr", "10.0.0.1"], "--master_addr is torchrun's", "--hosts"),
    (["--master-port", "29500"], "--master-port is torchrun's", "--started-port"),
    (["--master_port", "29500"], "--master_port is torchrun's", "--started-port"),
    (["--standalone"], "--standalone is torchrun's", "--nproc"),
    (["--rdzv-backend", "c10d"], "--rdzv-backend is torchrun's", "--nodes MIN:MAX"),
    (["--rdzv_endpoint", "h:1"], "--rdzv_endpoint is torchrun's", "--nodes MIN:MAX"),
    (["--devices", "0,1"], "--devices is paddle.distributed.launch's", "--gpus 0,1"),
    (["--ips", "10.0.0.1,10.0.0.2"], "--ips is paddle.distributed.launch's", "--hosts"),
    (["--log_dir", "logs"], "--log_dir is paddle.distributed.launch's", "--log-dir"),
    (["-n", "4"], "-n is mpirun's", "--nproc"),
    (["--np", "4"], "--np is mpirun's", "--nproc"),
    (["-np", "4"], "-np is mpirun's", "--nproc"),
]


@pytest.mark.parametrize("args,whose,instead", PEER_HINTS, ids=[a[0][0] for a in PEER_HINTS])
def test_a_peer_launchers_option_says_what_to_use_instead(capsys, args, whose, instead):
    code, out, err = run_cli(capsys, "train", *args, "train.py")
    assert code == 2, err
    assert err.count("\n") == 1 and err.startswith(f"error: {whose}: "), err
    assert instead in err and "No such option" not in err and "Did you mean" not in err, err


def test_bare_fluidctl_is_its_help_and_exit_0(capsys):
    code, out, err = run_cli(capsys)
    assert code == 0, err
    assert "Usage: fluidctl" in out and "train" in out and err == ""
