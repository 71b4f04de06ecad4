"""paramiko, imported without invoke.

paramiko.config imports invoke (Fabric's task runner, slow to import) at import time only to run
``Match exec`` lines of an ssh config. Every multi-node launch pays for imports before its
first connection, so invoke is kept out while paramiko loads and brought in by
``enable_match_exec`` only for a config that has such a line.
"""
import sys

if "paramiko" not in sys.modules and "invoke" not in sys.modules:
    sys.modules["invoke"] = None          # makes `import invoke` fail inside paramiko.config
    try:
        import paramiko                   # noqa: F401
    finally:
        del sys.modules["invoke"]

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
