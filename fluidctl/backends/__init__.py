"""Backends: how a planned job's processes are started (local, ssh, fabric, mpi, slurm, k8s).

A backend is one package, ``fluidctl/backends/<name>/``, whose ``__init__`` holds a
``Backend``: its Launcher, its options (declared once, parsed by it), and its job verbs, each
named as "module:attr" and imported only when used (so ``fluidctl train`` on one machine never
imports paramiko). ``BUILTIN`` is fluidctl's own; a site adds one without forking through the
``fluidctl.backends`` entry-point group of its own package (docs/architecture.md, "Adding a
backend")::

    [options.entry_points]
    fluidctl.backends =
        ray = fluidctl_ray:BACKEND
"""
from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:           # annotations only: typing stays off the start-up path
    from typing import Callable, Dict, List, Optional

GROUP = "fluidctl.backends"

# the options several backends share, each giving them its own meaning in its ``configure``
# (declared once, help included, in fluidctl/fastargs.py: NODES, JOB_NAME): dest -> flag
SHARED = {"nodes": "--nodes", "job_name": "--job-name"}

BUILTIN = {
    "local": "fluidctl.backends.local:BACKEND",
    "ssh": "fluidctl.backends.ssh:BACKEND",
    "fabric": "fluidctl.backends.ssh:FABRIC",
    "mpi": "fluidctl.backends.mpi:BACKEND",
    "slurm": "fluidctl.backends.slurm:BACKEND",
    "k8s": "fluidctl.backends.k8s:BACKEND",
}


def _load(spec: str, name: str = ""):
    """The object "module:attr" names; one that cannot be loaded (a site's broken package) is
    a UsageError naming the backend."""
    import importlib        # here: cluster sync imports this package and needs none of it
    module, _, attr = spec.partition(":")
    try:
        value = importlib.import_module(module)
        for part in attr.split(".") if attr else ():
            value = getattr(value, part)
    except (ImportError, AttributeError) as exc:
        from fluidctl.errors import UsageError
        raise UsageError(f"--backend {name or module} ({spec}) cannot be loaded: {exc}",
                         "fix or uninstall the package that declares it") from None
    return value


class Backend:
    """One backend's parts. ``launcher``: "module:Class" of its Launcher; ``options``: the
    module with its ``OPTIONS`` (fastargs Options: the one declaration of each, help
    included); ``configure``: "module:function" that parses them, and the meaning it gives
    the shared ``--nodes``, into ``config.backend_options`` (``configure(config, values)``,
    on the backends' floor: its piece of the plan); ``jobs``: the module with its job verbs
    (``owns(job_id)``, ``status``, ``logs``, ``cancel``, ``checkpoint``, ``list_jobs``);
    ``title``: how messages name it; ``hostfile``: its nodes are the lines of --hostfile."""
    __slots__ = ("name", "launcher", "options", "configure_with", "jobs", "title", "hostfile")

    def __init__(self, name: str, launcher: str, options: Optional[str] = None,
                 configure: Optional[str] = None, jobs: Optional[str] = None,
                 title: Optional[str] = None, hostfile: bool = False):
        self.name, self.launcher, self.options, self.jobs = name, launcher, options, jobs
        self.configure_with = configure
        self.title, self.hostfile = title or name, hostfile

    def __repr__(self) -> str:
        return f"Backend({self.name!r})"

    def launcher_class(self):
        return _load(self.launcher, self.name)

    def make_launcher(self, log: Optional[Callable[[str], None]] = None):
        return self.launcher_class()(log)

    def declared(self) -> tuple:
        """Its own options (fastargs.Option), as ``fluidctl train`` shows and parses them."""
        return tuple(_load(self.options, self.name).OPTIONS) if self.options else ()

    def configure(self, config, values: dict):
        """``config`` with this backend's options parsed from ``values`` (its own, and the
        shared --nodes) and checked against the rest of the config."""
        if not self.configure_with:
            return config
        return _load(self.configure_with, self.name)(config, values)

    def verbs(self):
        """Its job verbs' module, or None."""
        return _load(self.jobs, self.name) if self.jobs else None


_REGISTRY: Optional[Dict[str, str]] = None


def _registry() -> Dict[str, str]:
    """name -> "module:attr": the built-in backends, then the installed entry points of
    ``fluidctl.backends`` (read once; a name fluidctl has wins)."""
    global _REGISTRY
    if _REGISTRY is None:
        found = dict(BUILTIN)
        from importlib.metadata import entry_points
        for point in entry_points(group=GROUP):
            found.setdefault(point.name, point.value)
        _REGISTRY = found
    return _REGISTRY


# --backend unless given: without hosts, and with --hostfile/--hosts
DEFAULT, DEFAULT_WITH_HOSTS = "local", "ssh"


def default(hosts: bool) -> str:
    """The backend of a ``fluidctl train`` that names none."""
    return DEFAULT_WITH_HOSTS if hosts else DEFAULT


def names() -> List[str]:
    return list(_registry())


def backend(name: str) -> Backend:
    """The Backend of ``--backend name``. An entry point may name a Backend or a Launcher
    class (then it has no options and no job verbs of its own)."""
    from fluidctl.errors import UsageError
    spec = BUILTIN.get(name) or _registry().get(name)
    if spec is None:
        raise UsageError(f"--backend {name} is not installed",
                         f"choose one of {', '.join(names())}")
    value = _load(spec, name)
    if isinstance(value, Backend):
        return value
    return Backend(name, f"{value.__module__}:{value.__qualname__}")


def every() -> List[Backend]:
    """Every installed backend; a site's that cannot be loaded is left out, with one line on
    stderr (fluidctl's own commands still work)."""
    from fluidctl.errors import UsageError
    found = []
    for name in names():
        try:
            found.append(backend(name))
        except UsageError as exc:
            if name in BUILTIN:
                raise
            import sys
            print(f"warning: {exc.message} ({exc.hint})", file=sys.stderr, flush=True)
    return found


def launcher(name: str, log: Optional[Callable[[str], None]] = None):
    """A new Launcher for ``--backend name``; ``log`` receives its launch.log lines."""
    return backend(name).make_launcher(log)


def owner_of(job_id: str) -> Backend:
    """The backend whose job verbs know ``job_id`` (``fluidctl job``)."""
    from fluidctl.errors import UsageError
    for one in every():
        verbs = one.verbs()
        if verbs is not None and verbs.owns(job_id):
            return one
    raise UsageError(f"no backend knows the job {job_id!r}",
                     "give a Slurm job id (fluidctl job list), a Kubernetes KIND/NAME, or a "
                     "local, ssh or mpi job's --log-dir")
