"""Imports run one way, checked in fresh interpreters: the runtime, backends and planning import
nothing above them (an import blocker refuses it)."""
import pkgutil

RUNTIME_MODULES = [
    "fluidctl.runtime", "fluidctl.runtime.store", "fluidctl.runtime.wire",
    "fluidctl.runtime.data", "fluidctl.runtime.optim", "fluidctl.runtime.distributed_optimizer",
    "fluidctl.runtime.collective", "fluidctl.runtime.collective.bootstrap",
    "fluidctl.runtime.collective.ring", "fluidctl.runtime.collective.shm",
    "fluidctl.runtime.collective.mpi", "fluidctl.runtime.collective.nccl",
    "fluidctl.runtime.pserver.client", "fluidctl.runtime.pserver.server",
    "fluidctl.runtime.pserver.__main__",
]
from importguard import BLOCKED, run_blocked  # noqa: E402


def test_runtime_imports_nothing_from_the_launcher():
    # the store binds its listening socket through fluidctl.net, shared with the launcher
    calls = ("from fluidctl.runtime.store import listen; "
             "s = listen('127.0.0.1', 0); s.close()")
    result = run_blocked(RUNTIME_MODULES, BLOCKED, calls)
    assert result.returncode == 0 and result.stdout.strip() == "ok", result.stderr


def modules_of(package):
    import importlib
    path = importlib.import_module(package).__path__
    return [package] + [f"{package}.{m.name}" for m in pkgutil.iter_modules(path)]


def test_backends_import_nothing_from_launch_or_commands():
    result = run_blocked(modules_of("fluidctl.backends"),
                         ["fluidctl.launch", "fluidctl.commands", "fluidctl.cli"])
    assert result.returncode == 0 and result.stdout.strip() == "ok", result.stderr


def test_planning_imports_no_backend_nor_launch():
    result = run_blocked(modules_of("fluidctl.planning"),
                         ["fluidctl.launch", "fluidctl.backends", "fluidctl.commands",
                          "fluidctl.cli", "click", "rich", "paramiko"])
    assert result.returncode == 0 and result.stdout.strip() == "ok", result.stderr


def test_the_blocker_really_blocks():
    result = run_blocked(["fluidctl.runtime", "fluidctl.launch.supervisor"], BLOCKED)
    assert result.returncode != 0 and "layering: fluidctl.launch imported" in result.stderr


def test_the_ranks_pay_nothing_for_the_launchers_telemetry():
    """What a rank imports (the runtime, the straggler recorder, the torch/Paddle step marks)
    imports neither the launcher's straggler watcher nor the telemetry sink."""
    result = run_blocked(RUNTIME_MODULES + ["fluidctl.diagnostics.stragglers",
                                            "fluidctl.diagnostics.stepmarks"],
                         BLOCKED + ["fluidctl.telemetry", "fluidctl.diagnostics.stragglerwatch"])
    assert result.returncode == 0 and result.stdout.strip() == "ok", result.stderr
