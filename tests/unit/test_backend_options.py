"""Each backend parses its own options: --nodes means one thing per backend (a count of hosts
to use over SSH, MIN:MAX for an elastic job there, a node count under Slurm, a pod count under
Kubernetes), and a mistake says what is wrong for *that* backend in one line."""
import pytest

from fluidctl import cli


def _train_error(tmp_path, capsys, *argv) -> str:
    script = tmp_path / "t.py"
    script.write_text("pass\n")
    with pytest.raises(SystemExit) as done:
        cli.main(["train", *argv, "--dry-run", str(script)])
    assert done.value.code == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    return err.strip()


def test_more_nodes_than_hosts_over_ssh_names_the_hostfile_not_slurm(tmp_path, capsys):
    """issue 39.8: --nodes 3 with two hosts over ssh is about the hostfile."""
    err = _train_error(tmp_path, capsys, "--hosts", "a,b", "--nodes", "3")
    assert err == ("error: --nodes 3, but --hostfile/--hosts name 2 node(s) (name at least 3 "
                   "nodes, or lower --nodes)"), err
    assert "Slurm" not in err


def test_nodes_without_hosts_says_where_nodes_come_from(tmp_path, capsys):
    err = _train_error(tmp_path, capsys, "--nodes", "2")
    assert "--nodes 2, but without --hostfile or --hosts the job runs on this machine alone" \
        in err, err
    assert "are Slurm options" not in err


@pytest.mark.parametrize("argv, words", [
    (["--partition", "gpu"], "error: --partition is a Slurm option (add --backend slurm)"),
    (["--kind", "jobset"], "error: --kind is a Kubernetes option (add --backend k8s)"),
    (["--mpirun-arg=--oversubscribe"], "error: --mpirun-arg is an MPI option (add --backend mpi)"),
    (["--hosts", "a,b", "--nodes", "1:2", "--backend", "k8s"],
     "--nodes 1:2 (an elastic job) needs --kind pytorchjob"),
    (["--hosts", "a,b", "--nodes", "1:2", "--backend", "mpi"],
     "--nodes 1:2 (an elastic job) needs --backend ssh or fabric"),
])
def test_an_option_is_refused_by_the_backend_that_owns_its_meaning(tmp_path, capsys, argv,
                                                                   words):
    assert words in _train_error(tmp_path, capsys, *argv)


def test_the_shared_options_are_the_ones_fastargs_declares():
    from fluidctl import backends, trainargs
    assert {o.dest: o.names[0] for o in trainargs.SHARED} == backends.SHARED
