"""The walk of every ``fluidctl train`` option (tests/optionwalk.py) against ssh and fabric, on
two real sshd nodes: their plans come from the nodes' agents, so each dry run connects. Each
option is honoured (seen in the plan, or in what the job's supervision is given) or refused in
one line with exit 2."""
import sys

import pytest

import optionwalk as walk

BACKENDS = ("ssh", "fabric")
# what these backends do beyond the table's defaults ("*"): the nodes are theirs
NODES = {
    "--gpus": {"*": walk.refused("--gpus 2")},
    "--nodes": {"*": lambda o: len(o.plan["nodes"]) == 1},
    "--hostfile": {"*": lambda o: [n["name"] for n in o.plan["nodes"]] == ["node1"]},
    "--hosts": {"*": lambda o: [n["name"] for n in o.plan["nodes"]] == ["node2"]},
    # connecting at all goes through them (the walk's nodes need the ssh config)
    "--ssh-config": {"*": lambda o: len(o.plan["nodes"]) == 2},
    "--accept-new-host-keys": {"*": lambda o: len(o.plan["nodes"]) == 2},
    "--ssh-timeout": {"*": lambda o: len(o.plan["nodes"]) == 2},
    "--include-bad": {"*": lambda o: len(o.plan["nodes"]) == 2},
    "--health-gate": {"*": lambda o: len(o.plan["nodes"]) == 2},    # measures when it runs
    "--remote-dir": {"*": lambda o: {c["cwd"] for c in o.plan["commands"]} == {"/tmp"}},
    "--venv": {"*": lambda o: all("/venvx" in " ".join(c["argv"])
                                  for c in o.plan["commands"])},
    "--python": {"*": lambda o: all(a[0] == sys.executable for a in walk.argvs(o))},
    "--started-port": {"*": lambda o: all(p["endpoint"].endswith((":7000", ":7001"))
                                          for p in o.plan["procs"])},
}
VALUES = {"--hostfile": None, "--hosts": ["node2"], "--remote-dir": ["/tmp"],
          "--python": [sys.executable]}
CASES = [(name, backend) for name in walk.every_option() for backend in BACKENDS]


@pytest.mark.parametrize("name,backend", CASES, ids=[f"{b}{n}" for n, b in CASES])
def test_an_option_is_honoured_or_refused_on_nodes(name, backend, sshd_nodes, capsys,
                                                   tmp_path, monkeypatch):
    expect = walk.expectation(name, backend, NODES)
    if expect is None:
        pytest.skip("the backend's own option: its own tests")
    walk.prepare(tmp_path, monkeypatch)
    hostfile, one = tmp_path / "nodes", tmp_path / "one"
    hostfile.write_text("node1\nnode2\n")         # no slots=: --nproc says
    one.write_text("node1\n")
    base = ["--backend", backend, "--ssh-config", sshd_nodes.config]
    values = dict(VALUES, **{"--hostfile": [str(one)]})
    if name not in ("--hostfile", "--hosts"):
        base += ["--hostfile", hostfile]
    if name == "--ssh-config":
        base = base[:2] + base[4:]
        values["--ssh-config"] = [str(sshd_nodes.config)]
    walk.walk_one(name, backend, base, expect, capsys, tmp_path, monkeypatch, values)
