"""Imports run one way. From the top: the entry points (cli, commands, node) -> launch ->
backends -> the wings (cluster, remote, procs, diagnostics) -> planning -> the ground floor
(envs, paths, net, lines, errors, agentproto), and the runtime sits on that floor: training
scripts import it, and it imports nothing of the launcher nor the CLI's heavy libraries.
A top-level module is a contract two processes share or a leaf utility; a feature is a package."""
import ast
from pathlib import Path

import fluidctl


def imported_names(package_dir, skip=()):
    """Every module named by an import statement in the package, at any depth (lazy imports
    inside functions included), as (file, module); files named in ``skip`` are left out."""
    for path in sorted(Path(package_dir).rglob("*.py")):
        if path.name in skip:
            continue
        yield from _imports_of(path)


def _imports_of(path):
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and not node.level:
            yield path.name, node.module
            for alias in node.names:
                yield path.name, f"{node.module}.{alias.name}"
        elif isinstance(node, ast.Import):
            for alias in node.names:
                yield path.name, alias.name


# package -> what it must never import, lazily or not (the layers above it, and side wings)
ENTRY = ("fluidctl.cli", "fluidctl.commands", "fluidctl.fastargs", "fluidctl.trainargs",
         "fluidctl.node")
NEVER = {
    "runtime": ENTRY + ("fluidctl.launch", "fluidctl.backends", "fluidctl.console",
                        "fluidctl.cluster", "fluidctl.remote", "fluidctl.sharding"),
    "planning": ENTRY + ("fluidctl.launch", "fluidctl.backends", "fluidctl.console",
                         "fluidctl.cluster", "fluidctl.remote", "fluidctl.procs",
                         "fluidctl.diagnostics", "fluidctl.runtime"),
    "diagnostics": ENTRY + ("fluidctl.launch", "fluidctl.backends", "fluidctl.console",
                            "fluidctl.cluster", "fluidctl.remote", "fluidctl.procs"),
    "procs": ENTRY + ("fluidctl.launch", "fluidctl.backends", "fluidctl.console",
                      "fluidctl.cluster", "fluidctl.remote"),
    "remote": ENTRY + ("fluidctl.launch", "fluidctl.backends", "fluidctl.cluster",
                       "fluidctl.procs", "fluidctl.diagnostics"),
    "cluster": ENTRY + ("fluidctl.launch", "fluidctl.backends"),
    # a backend's launcher side (its job verbs and node-side entry: BACKEND_ROOMS)
    "backends": ENTRY + ("fluidctl.launch", "fluidctl.cluster"),
    # fluidctl top and the metrics endpoint: read what the launcher and the ranks wrote
    "observe": ENTRY + ("fluidctl.launch", "fluidctl.backends", "fluidctl.cluster",
                        "fluidctl.remote", "fluidctl.procs", "fluidctl.runtime"),
    "launch": ENTRY,        # cluster's ledger and health gate choose a job's nodes first
    "pserverctl": ENTRY + ("fluidctl.launch", "fluidctl.backends", "fluidctl.cluster",
                           "fluidctl.remote", "fluidctl.sharding"),
    "node": ("fluidctl.cli", "fluidctl.commands", "fluidctl.cluster"),
}


# the ledger of bad nodes stands on paths alone: state that the health gate (cluster/), the Slurm
# launcher (a step failed on a node) and an elastic job's launcher (backends/ssh/elastic.py) share, so
# the layers above cluster/ may name it (``from fluidctl.cluster import ledger`` included)
SHARED_STATE = ("fluidctl.cluster.ledger",)
LEAVES = {"backends": ("fluidctl.cluster",)}

# A backend package is a slice of the house: besides its launcher and plan (the backends floor,
# where ``plan.configure`` parses its options) it holds its options' declarations
# (``options.py``: read by commands/train.py and trainargs.py), its job verbs (``jobs.py``:
# called by commands/job.py, above launch: they follow a job's logs and write its checkpoint
# request) and its node-side entry (``pod.py``: runs on a node, as node/ does). Each such file
# keeps its own floor's rule, and nothing below names it.
BACKEND_ROOMS = {
    # its options, declared as fastargs Options: the command line's floor
    "options.py": ("fluidctl.cli", "fluidctl.commands", "fluidctl.node", "fluidctl.launch",
                   "fluidctl.cluster"),
    "jobs.py": ENTRY + ("fluidctl.cluster",),
    "pod.py": ("fluidctl.cli", "fluidctl.commands", "fluidctl.cluster"),
}


def _within(module, names):
    return any(module == a or module.startswith(a + ".") for a in names)


def test_no_import_climbs_the_layers():
    root = Path(fluidctl.__file__).parent
    for package, never in NEVER.items():
        skip = tuple(BACKEND_ROOMS) if package == "backends" else ()
        wrong = [(f, m) for f, m in imported_names(root / package, skip)
                 if _within(m, never) and not _within(m, SHARED_STATE)
                 and m not in LEAVES.get(package, ())]
        assert wrong == [], f"fluidctl/{package} imports from above it: {wrong}"


def test_a_backends_rooms_keep_their_floors():
    """A backend's options, job verbs and node-side entry import what their floor may (that
    nothing below names them is tests/unit/test_house.py's arrows up: their floors are
    above)."""
    root = Path(fluidctl.__file__).parent
    for name, never in BACKEND_ROOMS.items():
        for path in sorted((root / "backends").rglob(name)):
            wrong = [m for _, m in _imports_of(path)
                     if _within(m, never) and not _within(m, SHARED_STATE)]
            assert wrong == [], f"{path.relative_to(root)} imports from above it: {wrong}"


def test_backends_are_packages():
    """backends/ holds the registry and the protocols; each backend is a package of its own."""
    root = Path(fluidctl.__file__).parent / "backends"
    assert sorted(p.stem for p in root.glob("*.py")) == ["__init__", "base"]
    assert sorted(p.name for p in root.iterdir() if (p / "__init__.py").exists()) == [
        "k8s", "local", "mpi", "slurm", "ssh"]


def test_top_level_modules_are_contracts_or_leaves():
    """A feature is a package: the top level keeps only shared contracts and leaf utilities,
    and none of them imports a package above the ground floor."""
    root = Path(fluidctl.__file__).parent
    top = sorted(p.stem for p in root.glob("*.py"))
    assert top == ["__init__", "__main__", "agentproto", "cli", "clicktypes", "console",
                   "digest", "errors", "fastargs", "lines", "net", "paths", "preload",
                   "shardlayout", "sigs", "statefiles", "tables", "trainargs", "units"]  # envs: a package
    above = ENTRY + ("fluidctl.launch", "fluidctl.backends", "fluidctl.cluster",
                     "fluidctl.remote", "fluidctl.procs", "fluidctl.planning", "fluidctl.node",
                     "fluidctl.sharding", "fluidctl.runtime")
    leaves = [p for p in root.glob("*.py") if p.stem not in ("__main__", "cli", "fastargs",
                                                               "trainargs", "console",
                                                               "tables")]
    for path in leaves:
        for node in ast.walk(ast.parse(path.read_text())):
            mods = ([node.module] if isinstance(node, ast.ImportFrom) and node.module else
                    [a.name for a in node.names] if isinstance(node, ast.Import) else [])
            for m in mods:
                assert not any(m == a or m.startswith(a + ".") for a in above), (path.name, m)

