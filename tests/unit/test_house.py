"""The house's measures, read from the source (every import statement, lazy ones included;
``if TYPE_CHECKING:`` blocks left out: they never run):

- no import circle among fluidctl's modules;
- no arrow back up the house (DESIGN.md's layering, ``FLOORS`` below, ground floor first: a
  module imports only from its own floor or below);
- no file over ``MAX_LINES`` lines.

``python tests/unit/test_house.py`` prints the measures (circles, arrows up, largest files).
"""
import ast
import sys
from functools import lru_cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2] / "fluidctl"
MAX_LINES = 600
TOO_LONG_FOR_NOW = set()          # files over MAX_LINES that a split is under way for

# ground floor first. A module belongs to the floor of its longest prefix listed.
FLOORS = [
    ("ground: contracts and leaves", (
        "fluidctl", "fluidctl.envs", "fluidctl.paths", "fluidctl.net", "fluidctl.lines",
        "fluidctl.units", "fluidctl.errors", "fluidctl.digest", "fluidctl.sigs",
        "fluidctl.agentproto", "fluidctl.shardlayout", "fluidctl.clicktypes",
        # the ranks' half of a contract, kept in the feature it belongs to: the pages a rank
        # writes and the launcher reads, a pserver's checkpoint lines, the lifeline
        "fluidctl.diagnostics.progress", "fluidctl.diagnostics.pages",
        "fluidctl.diagnostics.stragglers", "fluidctl.diagnostics.checkpoints",
        "fluidctl.procs.lifeline")),
    ("runtime: what training scripts import", ("fluidctl.runtime",)),
    ("planning: pure", ("fluidctl.planning",)),
    ("the wings", (
        "fluidctl.cluster", "fluidctl.remote", "fluidctl.procs", "fluidctl.diagnostics",
        "fluidctl.pserverctl", "fluidctl.sharding", "fluidctl.telemetry",
        "fluidctl.console", "fluidctl.tables", "fluidctl.observe")),
    ("backends", ("fluidctl.backends",)),
    ("launch", ("fluidctl.launch",)),
    # fluidctl report reads a job's log dir, found as the job verbs find a job
    ("job verbs", ("fluidctl.report",)),
    ("the option tables (one declaration per option)", ("fluidctl.fastargs",
                                                        "fluidctl.trainargs")),
    ("entry points", ("fluidctl.cli", "fluidctl.commands", "fluidctl.node", "fluidctl.__main__")),
]
# A backend is a package with a room on several floors: its launcher and plan on the backends
# floor, and these, named by their module, on the floor of their kind (tests/unit/
# test_layering.py holds the same rooms).
BACKEND_ROOMS = {"options": "the option tables (one declaration per option)",
                 "jobs": "job verbs", "pod": "entry points"}


def modules():
    """{dotted name: path} of every module and package under fluidctl/."""
    out = {}
    for path in ROOT.rglob("*.py"):
        parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


def _resolve(name, mods):
    while name and name not in mods:
        name = name.rpartition(".")[0]
    return name or None


def _type_checking_only(tree):
    skip = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and isinstance(node.test, ast.Name) \
                and node.test.id == "TYPE_CHECKING":
            for sub in node.body:
                skip.update(id(n) for n in ast.walk(sub))
    return skip


@lru_cache(maxsize=1)
def import_graph():
    """{module: {fluidctl modules it imports}}."""
    mods = modules()
    graph = {}
    for name, path in mods.items():
        tree = ast.parse(path.read_text())
        skip = _type_checking_only(tree)
        out = set()
        for node in ast.walk(tree):
            if id(node) in skip:
                continue
            if isinstance(node, ast.Import):
                out.update(_resolve(a.name, mods) for a in node.names
                           if a.name.split(".")[0] == "fluidctl")
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = name.split(".") if path.name == "__init__.py" else \
                        name.split(".")[:-1]
                    base = base[:len(base) - node.level + 1]
                    module = ".".join(base + ([node.module] if node.module else []))
                else:
                    module = node.module or ""
                if module.split(".")[0] != "fluidctl":
                    continue
                for alias in node.names:
                    full = f"{module}.{alias.name}"
                    out.add(full if full in mods else _resolve(module, mods))
        out.discard(None)
        out.discard(name)
        graph[name] = out
    return graph


def circles(graph):
    """The strongly connected components of more than one module (Tarjan's)."""
    index, low, stack, on, found = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(max(limit, 10 * len(graph)))
    try:
        for v in sorted(graph):
            if v not in index:
                visit(v)
    finally:
        sys.setrecursionlimit(limit)
    return found


def floor_of(module):
    room = BACKEND_ROOMS.get(module.rpartition(".")[2])
    if room is not None and module.startswith("fluidctl.backends."):
        return next(i for i, (name, _) in enumerate(FLOORS) if name == room)
    best = None
    for i, (_, prefixes) in enumerate(FLOORS):
        for prefix in prefixes:
            if (module == prefix or module.startswith(prefix + ".")) and \
                    (best is None or len(prefix) > best[1]):
                best = (i, len(prefix))
    return None if best is None else best[0]


def arrows_up(graph):
    """(importer, imported) where the imported module stands on a higher floor."""
    return sorted((a, b) for a, out in graph.items() for b in out
                  if floor_of(b) > floor_of(a))


def sizes():
    """[(lines, path relative to the repository)], largest first."""
    return sorted(((len(p.read_text().splitlines()),
                    str(p.relative_to(ROOT.parent))) for p in ROOT.rglob("*.py")),
                  reverse=True)


def footprints():
    """{backend: {file outside its package: why}}: the fluidctl modules that import a built-in
    backend's package, name one of its modules in a string (the registry), or compare or
    choose on its ``--backend`` name (``== "slurm"``, ``"k8s" if ... else``, ``backend("k8s")``);
    docstrings aside.
    fluidctl.runtime's own transports are not backends ("mpi" there is MPI, not mpirun)."""
    from fluidctl import backends
    names = {}
    for name, spec in backends.BUILTIN.items():
        names.setdefault(spec.partition(":")[0].rsplit(".", 1)[-1], set()).add(name)
    trees = {}
    for path in sorted(ROOT.rglob("*.py")):
        rel = str(path.relative_to(ROOT.parent))
        if not rel.startswith("fluidctl/runtime/"):
            tree = ast.parse(path.read_text())
            prose = {id(n.value) for n in ast.walk(tree) if isinstance(n, ast.Expr)}
            trees[rel] = [n for n in ast.walk(tree) if id(n) not in prose]
    out = {}
    for package, words in sorted(names.items()):
        prefix, hits = f"fluidctl.backends.{package}", {}
        for rel, nodes in trees.items():
            if rel.startswith(f"fluidctl/backends/{package}/"):
                continue
            why = set()
            for node in nodes:
                if isinstance(node, (ast.Import, ast.ImportFrom)):
                    mods = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                            [node.module or ""])
                    if any(m == prefix or m.startswith(prefix + ".") for m in mods):
                        why.add("imports it")
                elif isinstance(node, ast.Constant) and isinstance(node.value, str) \
                        and prefix in node.value:
                    why.add("names it")
                elif isinstance(node, (ast.Compare, ast.IfExp)) or (
                        isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                        and node.func.attr == "backend"):
                    if any(isinstance(c, ast.Constant) and c.value in words
                           for c in ast.walk(node)):
                        why.add("chooses on its name")
            if why:
                hits[rel] = ", ".join(sorted(why))
        out[package] = hits
    return out


def measures() -> str:
    graph = import_graph()
    found, up, largest = circles(graph), arrows_up(graph), sizes()
    prints = [f"  {package}: {len(hits)} file(s): " + "; ".join(f"{f} ({w})"
                                                          for f, w in hits.items())
              for package, hits in footprints().items()]
    return "\n".join(["a backend's footprint outside its package (docs aside):"] + prints + 
        [f"modules: {len(graph)}, import arrows: {sum(map(len, graph.values()))}",
         f"circles: {len(found)}"] + [f"  {' <-> '.join(c)}" for c in found]
        + [f"arrows up: {len(up)}"] + [f"  {a} -> {b}" for a, b in up]
        + [f"files over {MAX_LINES} lines: {sum(n > MAX_LINES for n, _ in largest)}",
           "largest files:"] + [f"  {n:5d} {p}" for n, p in largest[:8]])


def test_every_module_stands_on_a_floor():
    assert [m for m in import_graph() if floor_of(m) is None] == []


def test_no_import_circle():
    print("\n" + measures())
    assert circles(import_graph()) == []


def test_no_arrow_back_up_the_house():
    assert arrows_up(import_graph()) == []


def test_the_floors_find_a_circle_and_an_arrow_up():
    """The measures can fail: a made-up graph with one of each is caught."""
    graph = {"fluidctl.console": {"fluidctl.tables"}, "fluidctl.tables": {"fluidctl.console"},
             "fluidctl.fastargs": {"fluidctl.commands.numbers"},
             "fluidctl.commands.numbers": set()}
    assert circles(graph) == [["fluidctl.console", "fluidctl.tables"]]
    assert arrows_up(graph) == [("fluidctl.fastargs", "fluidctl.commands.numbers")]


def test_no_file_over_600_lines():
    over = {p for n, p in sizes() if n > MAX_LINES}
    assert over - TOO_LONG_FOR_NOW == set(), over
    assert TOO_LONG_FOR_NOW <= over, "split: take it off TOO_LONG_FOR_NOW"



def test_a_backends_footprint_is_the_registry_and_at_most_one_more_file():
    """Adding a backend is its package, the registry line (and docs); what else names a
    built-in one today: ``fluidctl job list`` (Slurm's records, or --k8s) and the k8s MPIJob,
    which builds mpirun's command as the mpi backend does."""
    for package, hits in footprints().items():
        assert "fluidctl/backends/__init__.py" in hits and len(hits) <= 2, (package, hits)

if __name__ == "__main__":
    print(measures())


def test_test_modules_have_unique_names():
    """pytest imports test modules by basename (no packages under tests/): two files of one
    name in two tiers make the whole run's collection fail ("import file mismatch")."""
    root = Path(__file__).resolve().parents[1]
    seen = {}
    for path in sorted(root.rglob("test_*.py")):
        if "crds" in path.parts or "__pycache__" in path.parts:
            continue
        seen.setdefault(path.name, []).append(str(path.relative_to(root)))
    assert {n: p for n, p in seen.items() if len(p) > 1} == {}
