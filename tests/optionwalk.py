"""The walk of every ``fluidctl train`` option against a backend (issue 42: nothing silently
dropped): what each option is expected to do on each backend (``WALK``, and the backends' own
options, refused by the others), and ``walk_one``, which runs one pair and checks it.
tests/unit/test_every_option_every_backend.py walks local, mpi and k8s;
tests/cluster/test_every_option_nodes.py walks ssh and fabric on real sshd nodes, and
tests/cluster/test_every_option_slurm.py slurm's batch script on a real controller.

Where an option is seen:
- ``plan``: the ``--dry-run --json`` plan, or the rendered objects (k8s);
- ``run``: what the supervision of a job run from here is given (the RunOptions, the echoed
  logs, the diagnostics): the job is planned and its logs made ready for real, and
  ``run_supervised`` is recorded instead of starting processes.
"""
import json
import os
from types import SimpleNamespace

import yaml

from fluidctl import trainargs
from launchutil import BEHAVE


def run_cli(capsys, *args):
    """(exit code, stdout, stderr) of ``fluidctl ARGS`` in this process."""
    import pytest
    from fluidctl import cli
    with pytest.raises(SystemExit) as done:
        cli.main([str(a) for a in args])
    out, err = capsys.readouterr()
    return done.value.code or 0, out, err


HOSTS = ["--hosts", "127.0.0.1,127.0.0.2"]
# each backend's own start: what the walk adds an option to
BACKENDS = {
    "local": ["--backend", "local", "--nproc", 2],
    "mpi": ["--backend", "mpi", *HOSTS, "--nproc", 2],
    "k8s": ["--backend", "k8s", "--kind", "paddlejob", "--image", "img:1", "--nodes", 2,
            "--nproc", 2],
}
SEEN_BY_THE_WALK = ("--dry-run", "--json", "--backend")     # how the walk itself runs


def refused(*words):
    return ("refused", words)


def procs(obs):
    """Every process's record: the plan's, or the k8s pods' (the ConfigMap's plan)."""
    if obs.plan is not None:
        return obs.plan["procs"]
    from fluidctl.backends.k8s import layout       # what the pods derive from the layout
    maps = [o for o in obs.objects if o["kind"] == "ConfigMap"]
    plans = [layout.plan_of(json.loads(m["data"]["plan.json"])) for m in maps]
    return [p.to_json() for plan in plans for p in plan.procs]


def envs_of(obs):
    return [p["env"] for p in procs(obs)]


def argvs(obs):
    return [p["argv"] for p in procs(obs)]


def replicas(obs):
    """The pods of a Kubeflow job."""
    spec = obs.objects[-1]["spec"]
    sets = next(v for k, v in spec.items() if k.endswith("ReplicaSpecs"))
    return sum(int(s.get("replicas") or 1) for s in sets.values())


def pods(obs):
    from k8sutil import pod_templates
    return pod_templates(obs.objects[-1])


def pod_env(obs, name):
    return {e.get("value") for t in pods(obs) for e in t["spec"]["containers"][0]["env"]
            if e["name"] == name}


def pserver_argv(obs):
    return [a for argv in argvs(obs) for a in argv]


# option -> (its argv after the option, {backend: a check of what was seen, or refused(...)};
# "*" for every backend not named). A check gets the observation: .plan, .objects, .run
NO_NODES = refused("is for jobs on --hostfile/--hosts nodes")
PSERVER_ONLY = refused("need --mode pserver")
WALK = {
    "--nproc": (["3"], {"*": lambda o: len(envs_of(o)) in (3, 6)}),
    "--gpus": (["2"], {"local": refused("no GPUs found"),
                       "mpi": lambda o: {e["FLUIDCTL_GPUS"] for e in envs_of(o)} == {"2"},
                       "k8s": lambda o: {t["spec"]["containers"][0]["resources"]["limits"][
                           "nvidia.com/gpu"] for t in pods(o)} == {"2"}}),
    "--mode": (["pserver"], {"mpi": refused("runs collective jobs only"),
                             "*": lambda o: any(e.get("TRAINING_ROLE") == "PSERVER"
                                                for e in envs_of(o))}),
    "--pservers": (["2"], {"*": PSERVER_ONLY}),
    "--pserver-endpoints": (["10.0.0.1:7164"], {"*": PSERVER_ONLY}),
    "--token-file": (["tok"], {"*": lambda o: o.token == "from-the-file"}),
    "--sync": ([], {"*": lambda o: True}),          # the default, given again
    "--async": ([], {"*": PSERVER_ONLY}),
    "--checkpoint-dir": (["ck"], {"*": PSERVER_ONLY}),
    "--checkpoint-every": (["7"], {"*": PSERVER_ONLY}),
    "--hostfile": (["hosts"], {"local": refused("--backend local"),
                               "k8s": refused("Kubernetes places the pods"),
                               "mpi": lambda o: [n["address"] for n in o.plan["nodes"]]
                               == ["127.0.0.8"]}),
    "--hosts": (["127.0.0.9"], {"local": refused("--backend local"),
                                "k8s": refused("Kubernetes places the pods"),
                                "mpi": lambda o: o.plan["nodes"][0]["address"] == "127.0.0.9"}),
    "--nodes": (["1"], {"local": lambda o: len(o.plan["nodes"]) == 1,
                        "mpi": lambda o: len(o.plan["nodes"]) == 1,
                        "k8s": lambda o: len(pods(o)) == 1}),
    "--job-name": (["jn"], {"k8s": lambda o: o.objects[-1]["metadata"]["name"] == "jn",
                            "*": refused("--job-name is not an option of --backend")}),
    "--ssh-config": (["ssh.cfg"], {"mpi": lambda o: any(
        "ssh.cfg" in " ".join(c["argv"]) for c in o.plan.get("commands", [])),
        "*": NO_NODES}),
    "--accept-new-host-keys": ([], {"mpi": lambda o: any(
        "StrictHostKeyChecking=accept-new" in " ".join(c["argv"])
        for c in o.plan.get("commands", [])), "*": NO_NODES}),
    "--remote-dir": (["/rd"], {"k8s": lambda o: {t["spec"]["containers"][0]["workingDir"]
                                                 for t in pods(o)} == {"/rd"},
                               "mpi": refused("--remote-dir is not passed to mpirun"),
                               "*": NO_NODES}),
    "--python": (["/py/python3"], {"*": lambda o: any(a[0] == "/py/python3" or
                                                      "/py/python3" in a for a in argvs(o))}),
    "--venv": (["/venvx"], {"mpi": lambda o: any("/venvx" in " ".join(c["argv"])
                                                 for c in o.plan.get("commands", [])),
                            "*": NO_NODES}),
    "--export": (["WALK_EXPORTED"], {"*": lambda o: all(e.get("WALK_EXPORTED") == "yes"
                                                        for e in envs_of(o))}),
    "--pserver-hosts": (["127.0.0.1"], {"*": PSERVER_ONLY}),
    "--include-bad": ([], {"mpi": lambda o: True, "*": NO_NODES}),
    # with nodes the gate measures them when the job starts (tests/cluster/test_health_gate.py)
    "--health-gate": ([], {"mpi": lambda o: True, "local": refused("--health-gate"),
                           "k8s": refused("--health-gate")}),
    "--ssh-timeout": (["33"], {"*": NO_NODES, "mpi": lambda o: any(
        "ConnectTimeout=33" in " ".join(c["argv"]) for c in o.plan.get("commands", []))}),
    "--started-port": (["7000"], {"*": lambda o: any(
        v.endswith(":7000") for e in envs_of(o) for v in e.values()),
        "mpi": refused("--started-port")}),
    "--log-dir": (["ld"], {"*": lambda o: all(p["log"].startswith("ld/") for p in procs(o))}),
    "--env": (["WALK_ENV=1"], {"*": lambda o: all(e.get("WALK_ENV") == "1"
                                                  for e in envs_of(o))}),
    "--env-file": (["walk.env"], {"*": lambda o: all(e.get("WALK_FILE") == "2"
                                                     for e in envs_of(o))}),
    "--grace-period": (["17"], {"k8s": lambda o: {t["spec"]["terminationGracePeriodSeconds"]
                                                  for t in pods(o)} == {27},
                                "*": lambda o: o.run["options"].grace_period == 17}),
    "--checkpoint-signal": (["USR1"], {"k8s": lambda o: pod_env(o, "FLUIDCTL_CHECKPOINT_SIGNAL")
                                       == {"USR1"},
                                       "*": lambda o: o.run["options"].checkpoint.signal_name
                                       == "USR1"}),
    # k8s: the whole group restarts (a Kubeflow kind: each pod's container may, R x pods)
    "--max-restarts": (["3"], {"k8s": lambda o: o.objects[-1]["spec"]["runPolicy"][
        "backoffLimit"] == 3 * replicas(o), "*": lambda o: o.run["options"].max_restarts == 3}),
    "--metrics-port": (["0"], {"k8s": refused("--metrics-port"),
                               "*": lambda o: "fluidctl: metrics at http://127.0.0.1:" in o.err}),
    "--metrics-host": (["127.0.0.2"], {"*": refused("--metrics-host", "--metrics-port")}),
    "--tee": (["none"], {"k8s": refused("--tee"),
                         "*": lambda o: o.run["shown"].sources == []}),
    "--tee-ranks": (["1"], {"k8s": refused("--tee-ranks"), "mpi": refused("--tee-ranks"),
                            "*": lambda o: [os.path.basename(p) for p, *_ in
                                            o.run["shown"].sources] == ["workerlog.1"]}),
    "--hang-timeout": (["99"], {"k8s": lambda o: pod_env(o, "FLUIDCTL_HANG_TIMEOUT") == {"99"},
                                "*": lambda o: o.run["watchers"].diagnostics.hang_timeout
                                == 99}),
    "--log-tail": (["7"], {"k8s": refused("--log-tail"),
                           "*": lambda o: o.run["watchers"].diagnostics.tail_lines == 7}),
    "--node-rank": (["1"], {"*": refused("--node-rank is torchrun's")}),
    "--show-secrets": ([], {"*": lambda o: len(o.token) == 32 and o.token.isalnum()}),
}
# the backends' own options: honoured by their own backend (tests/unit/test_k8s_options.py,
# test_slurm_*, test_mpi_*), refused by every other with one line naming the owner
OWN = {"mpi": "an MPI option", "slurm": "a Slurm option", "k8s": "a Kubernetes option"}


def _own_options():
    from fluidctl import backends
    out = {}
    for name in ("mpi", "k8s"):
        for option in backends.backend(name).declared():
            out[option.names[0]] = name
    for option in backends.backend("slurm").declared():
        out[option.names[0]] = "slurm"
    return out


def _dry_run(capsys, argv, backend, unmasked):
    show = ["--show-secrets"] if unmasked else []
    code, out, err = run_cli(capsys, "train", *argv, "--dry-run",
                             *(["--json"] if backend != "k8s" else []), *show, BEHAVE)
    obs = SimpleNamespace(code=code, out=out, err=err, plan=None, objects=None, token=None,
                          run=None)
    if code:
        return obs
    if backend == "k8s":
        obs.objects = list(yaml.safe_load_all(out))
        obs.token = obs.objects[0]["stringData"]["token"]
    else:
        obs.plan = json.loads(out)
        obs.token = obs.plan["procs"][0]["env"]["FLUIDCTL_JOB_TOKEN"]
    return obs


def _run(capsys, monkeypatch, tmp_path, argv):
    """Run the job for real up to its supervision, which is recorded instead."""
    from fluidctl.launch import run
    from fluidctl.launch.supervisor import RunResult
    seen = {}

    def recorded(start, **kw):
        seen.update(kw)
        return RunResult(0)
    monkeypatch.setattr(run, "run_supervised", recorded)
    code, out, err = run_cli(capsys, "train", *argv, "--log-dir", tmp_path / "logs", BEHAVE)
    return SimpleNamespace(code=code, out=out, err=err, run=seen, plan=None, objects=None)


RUN_PHASE = ("--tee", "--tee-ranks", "--grace-period", "--checkpoint-signal", "--max-restarts",
             "--hang-timeout", "--log-tail", "--metrics-port", "--metrics-host")


def every_option():
    """Every option the walk takes one at a time (the rest is how it runs)."""
    names = {o.names[0] for o in trainargs.options()} - set(SEEN_BY_THE_WALK)
    return sorted(names)


def value(name, values=None):
    option = next(o for o in trainargs.options() if o.names[0] == name)
    if option.kind == "flag":
        return []
    if values and name in values:
        return values[name]
    if name in WALK:
        return WALK[name][0]
    return {"--time": ["10"], "--mpirun-arg": ["--bind-to=none"], "--kind": ["jobset"],
            "--image": ["img:2"], "--namespace": ["ns2"],
            "--checkpoint-warning": ["60"], "--restart-policy": ["pod"],
            "--api-version": ["v1"]}.get(name, ["x"])


def expectation(name, backend, checks=None):
    """None for a backend's own option (its own tests), else a check or refused(...)."""
    owner = _own_options().get(name)
    if owner is not None:
        return None if owner == backend else refused(OWN[owner])
    checks = {**WALK[name][1], **((checks or {}).get(name, {}))}
    expect = checks.get(backend, checks.get("*"))
    assert expect is not None, f"{name} has no expectation for {backend}"
    return expect


def prepare(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("WALK_EXPORTED", "yes")
    monkeypatch.delenv("FLUIDCTL_VENV", raising=False)
    (tmp_path / "tok").write_text("from-the-file\n")
    (tmp_path / "hosts").write_text("127.0.0.8\n")
    (tmp_path / "walk.env").write_text("WALK_FILE=2\n")
    (tmp_path / "ssh.cfg").write_text("Host *\n  User walker\n")


def walk_one(name, backend, base, expect, capsys, tmp_path, monkeypatch, values=None):
    """Run ``fluidctl train BASE NAME VALUE`` (dry run, or up to its supervision) and check
    it against ``expect``."""
    argv = [*base, name, *value(name, values)]
    if name == "--mode":
        argv.append("--pservers=1")
    if name in RUN_PHASE and backend != "k8s":
        obs = _run(capsys, monkeypatch, tmp_path, argv)
    else:
        obs = _dry_run(capsys, argv, backend, name in ("--token-file", "--show-secrets"))
    if isinstance(expect, tuple):
        assert obs.code == 2, (obs.code, obs.err, obs.out[:400])
        assert obs.err.startswith("error: ") and len(obs.err.strip().splitlines()) == 1, obs.err
        assert all(w in obs.err for w in expect[1]), obs.err
        return
    assert obs.code == 0, obs.err
    assert expect(obs), obs.out[:3000]
