"""Import a list of modules in a fresh interpreter whose import system refuses a list of
packages (tests/e2e/test_layering_imports.py, tests/e2e/test_stacks.py)."""
import subprocess
import sys
import textwrap

BLOCKED = ["fluidctl.launch", "fluidctl.backends", "fluidctl.commands", "fluidctl.cli",
           "fluidctl.console", "click", "rich", "paramiko", "fabric", "invoke"]


def run_blocked(modules, blocked, calls=""):
    code = textwrap.dedent(f"""
        import importlib, importlib.abc, sys
        BLOCKED = {blocked!r}

        class Block(importlib.abc.MetaPathFinder):
            def find_spec(self, name, path=None, target=None):
                if any(name == b or name.startswith(b + ".") for b in BLOCKED):
                    raise ImportError(f"layering: {{name}} imported")
                return None

        sys.meta_path.insert(0, Block())
        for name in {modules!r}:
            importlib.import_module(name)
        {calls}
        print("ok")
    """)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120)
