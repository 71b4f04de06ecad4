"""paramiko, imported without invoke and without importlib.metadata.

Every multi-node launch pays for its imports before its first connection, and two of
paramiko's are heavy for what they do here:

- paramiko.config imports invoke (Fabric's task runner) only to run ``Match exec`` lines of an
  ssh config: kept out while paramiko loads, and brought in by ``enable_match_exec`` for a
  config that has such a line;
- paramiko's ``__init__`` sets ``__version__ = importlib.metadata.version("paramiko")``, and
  importing importlib.metadata (with the email parser it loads) costs 10 ms: while paramiko
  loads, ``importlib.metadata`` is ``_VersionOnly``, which reads that one version from the
  distribution's METADATA as importlib.metadata would (the first ``NAME-*.dist-info`` on
  sys.path); anything else it is asked for comes from the real module.
"""
import os
import sys


class _VersionOnly:
    """importlib.metadata while paramiko loads: ``version`` read directly, the rest real."""

    def version(self, name: str) -> str:
        prefix = name.replace("-", "_").lower() + "-"
        for entry in sys.path:
            try:
                names = os.listdir(entry or ".")
            except OSError:
                continue
            for dist in names:
                if dist.lower().startswith(prefix) and dist.endswith(".dist-info"):
                    found = _metadata_version(os.path.join(entry or ".", dist, "METADATA"))
                    if found:
                        return found
        return self._real().version(name)

    def __getattr__(self, attr):
        if attr.startswith("__"):       # the import system's own questions (__spec__, ...)
            raise AttributeError(attr)
        return getattr(self._real(), attr)

    def _real(self):
        if sys.modules.get("importlib.metadata") is self:
            del sys.modules["importlib.metadata"]
        import importlib.metadata
        return importlib.metadata


def _metadata_version(path: str) -> str:
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.startswith("Version:"):
                    return line.split(":", 1)[1].strip()
                if not line.strip():        # the headers end at the first blank line
                    break
    except OSError:
        pass
    return ""


if "paramiko" not in sys.modules and "invoke" not in sys.modules:
    sys.modules["invoke"] = None          # makes `import invoke` fail inside paramiko.config
    shim = None
    if "importlib.metadata" not in sys.modules:
        shim = sys.modules["importlib.metadata"] = _VersionOnly()
    try:
        import paramiko                   # noqa: F401
    finally:
        del sys.modules["invoke"]
        if shim is not None and sys.modules.get("importlib.metadata") is shim:
            del sys.modules["importlib.metadata"]

import paramiko  # noqa: E402,F811


def enable_match_exec(config_text: str) -> None:
    """Give paramiko.config its invoke back when the config uses ``Match exec``."""
    if "exec" in config_text and paramiko.config.invoke is None:
        try:
            import invoke
        except ImportError:
            return                         # paramiko reports the missing invoke itself
        paramiko.config.invoke = invoke
        paramiko.config.invoke_import_error = None
