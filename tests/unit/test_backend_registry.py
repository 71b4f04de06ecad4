"""A backend is one package with a Backend (its Launcher, options, job verbs) and one line in
fluidctl.backends.BUILTIN (or an entry point of the fluidctl.backends group: tests/unit/
test_backend_entry_point.py): a launcher defined here, registered by that one line, plans
through launch.execute like the built-in ones (and each built-in one is a Launcher)."""
import json

from fluidctl import backends
from fluidctl.backends.base import BaseLauncher
from fluidctl.launch.execute import launch
from fluidctl.planning import plan as planner
from fluidctl.planning.config import LaunchConfig

CLOSED = []


class OneNodeLauncher(BaseLauncher):
    name = "one-node"

    def prepare(self, config):
        self.log("prepared")
        node = planner.local_node(config.nproc, None, config.mode, None, (), [])
        return planner.make_plan(config.job([node]), {0: [7000, 7001, 7002]}, backend=self.name)

    def close(self):
        CLOSED.append(self.name)


def test_a_registered_launcher_plans_like_the_others(monkeypatch, capsys):
    monkeypatch.setitem(backends.BUILTIN, "one-node", f"{__name__}:OneNodeLauncher")
    config = LaunchConfig(script="train.py", backend="one-node", nproc=2, token="t")
    assert launch(config, dry_run=True, as_json=True) == 0
    plan = json.loads(capsys.readouterr().out)
    assert plan["backend"] == "one-node"
    assert plan["trainer_endpoints"] == ["127.0.0.1:7000", "127.0.0.1:7001"]
    assert CLOSED == ["one-node"]                     # close() always runs


def test_every_registered_backend_is_a_launcher():
    for name in backends.names():
        launcher = backends.launcher(name)
        assert launcher.name == name
        for method in ("prepare", "start", "submit", "describe", "logs", "echo_sources",
                       "diagnostics", "close"):
            assert callable(getattr(launcher, method))
        assert isinstance(launcher.dry_run_table, bool) and isinstance(launcher.submits, bool)
        assert launcher.request_at is None          # known after prepare, if ever
        launcher.close()


def test_launch_asks_the_protocol_and_probes_nothing():
    """launch/execute.py reads the Launcher protocol's attributes; it never probes a launcher
    with getattr (a half-written backend fails in its own tests, not at a user's launch)."""
    import inspect
    from fluidctl.launch import execute
    assert "getattr(launcher" not in inspect.getsource(execute)
