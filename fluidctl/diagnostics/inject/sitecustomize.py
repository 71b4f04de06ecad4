"""Put first on a torch or Paddle rank's PYTHONPATH by fluidctl (``inject.rank_env``): Python
imports it at start, before the script. It installs fluidctl's step marks for the straggler
report (``fluidctl.diagnostics.stepmarks``) when the script imports ``torch.distributed`` or
``paddle``, and only in the rank itself: the first process to run it claims it (its pid in
FLUIDCTL_STEP_HOOKS_PID); its children (data-loader workers, subprocesses) see another pid and
install nothing. It then imports the sitecustomize it shadows (Debian's, a venv's), as Python
would have. Standard library only: a script that imports neither framework pays a few
microseconds.
"""
import os
import sys

# the names of fluidctl/envs/names.py (kept literal here: importing fluidctl at every start
# would cost)
_DIAG_DIR, _STEP_HOOKS, _STEP_HOOKS_PID = (
    "FLUIDCTL_DIAG_DIR", "FLUIDCTL_STEP_HOOKS", "FLUIDCTL_STEP_HOOKS_PID")
_HERE = os.path.dirname(os.path.abspath(__file__))
_TARGETS = {"torch.distributed": "install_torch", "paddle": "install_paddle"}


def _chain() -> None:
    """Import the next sitecustomize on the path (the one this file shadows), as site.py
    would: its errors are printed, not raised."""
    ours = sys.modules.pop("sitecustomize", None)
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != _HERE]
    try:
        __import__("sitecustomize")          # the next one
    except ImportError as exc:
        if exc.name != "sitecustomize":
            print(f"Error in sitecustomize; set PYTHONVERBOSE for traceback:\n"
                  f"{type(exc).__name__}: {exc}", file=sys.stderr)
    except Exception as exc:
        print(f"Error in sitecustomize; set PYTHONVERBOSE for traceback:\n"
              f"{type(exc).__name__}: {exc}", file=sys.stderr)
    finally:
        chained = sys.modules.get("sitecustomize")
        if ours is not None:
            ours.chained = chained if chained is not ours else None
            sys.modules["sitecustomize"] = ours


def _claim() -> bool:
    """True in the rank itself (the first process here with the diagnostics directory)."""
    env = os.environ
    if env.get(_STEP_HOOKS, "1") == "0" or not env.get(_DIAG_DIR):
        return False
    pid = str(os.getpid())
    if env.get(_STEP_HOOKS_PID, pid) != pid:
        return False
    env[_STEP_HOOKS_PID] = pid
    return True


def _install(what: str) -> None:
    try:
        from fluidctl.diagnostics import stepmarks
        getattr(stepmarks, what)()
    except Exception as exc:            # never into the script
        print(f"fluidctl: step marks off in this rank: {type(exc).__name__}: {exc}",
              file=sys.stderr, flush=True)


class _Loaded:
    """A module's loader that calls ``after`` once the module ran."""

    def __init__(self, inner, after):
        self._inner, self._after = inner, after

    def __getattr__(self, name):
        return getattr(self._inner, name)

    def create_module(self, spec):
        return self._inner.create_module(spec)

    def exec_module(self, module):
        self._inner.exec_module(module)
        self._after()


class StepHooks:
    """A ``sys.meta_path`` finder that finds nothing itself: it lets the other finders find
    ``torch.distributed`` and ``paddle`` and wraps their loaders; gone after both."""

    def find_spec(self, name, path=None, target=None):
        what = _TARGETS.get(name)
        if what is None:
            return None
        del _TARGETS[name]
        if not _TARGETS and self in sys.meta_path:
            sys.meta_path.remove(self)
        for finder in sys.meta_path:
            find = getattr(finder, "find_spec", None)
            if finder is self or find is None:
                continue
            spec = find(name, path, target)
            if spec is not None:
                if spec.loader is not None and hasattr(spec.loader, "exec_module"):
                    spec.loader = _Loaded(spec.loader, lambda: _install(what))
                return spec
        return None


def install() -> bool:
    """In the rank: the finder first on ``sys.meta_path`` (True); elsewhere nothing."""
    if not _claim():
        return False
    sys.meta_path.insert(0, StepHooks())
    return True


if __name__ == "sitecustomize":     # at start (``fluidctl worker`` imports it by its package name)
    _chain()
    install()
