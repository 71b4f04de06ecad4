"""The interpreter a node runs a job with: its ``cluster setup`` venv where that exists, else
the job's python. Pure transforms of argv and plans; nothing is run or connected here."""
from __future__ import annotations

from typing import List, Sequence

from fluidctl.paths import node_venv

PREFER = ('case "$1" in /*) v="$1";; *) v="$HOME/$1";; esac; '
          'if [ -x "$v/bin/python" ]; then p="$v/bin/python"; else p="$2"; fi; '
          'shift 2; exec "$p" "$@"')


def prefer_venv(argv: Sequence[str], venv: str, host: str) -> List[str]:
    """``argv`` (an interpreter, then its arguments) run by the node's venv python if the venv
    exists there, else as it is; decided by the node's shell, so no extra round trip."""
    return ["/bin/sh", "-c", PREFER, "sh", node_venv(venv, host), *argv]


def activate(command: str, venv: str, host: str) -> str:
    """``command`` (shell text) run with the node's venv's ``bin`` first on PATH (and
    VIRTUAL_ENV set) where that venv exists, as after ``source VENV/bin/activate``; else as
    it is. Relative venv paths are from the remote home, wherever the command runs."""
    import shlex
    v = shlex.quote(node_venv(venv, host))
    return (f'case {v} in /*) v={v};; *) v="$HOME"/{v};; esac; '
            'if [ -x "$v/bin/python" ]; then PATH="$v/bin:$PATH"; VIRTUAL_ENV="$v"; '
            f'export PATH VIRTUAL_ENV; fi; unset v; {command}')


def use_node_interpreters(plan, executables: Sequence[str]):
    """The plan with each node's processes started by the interpreter that node's agent runs
    with (``executables[i]`` for node i) where they would have used the job's python."""
    from dataclasses import replace
    python = plan.job.python
    procs = [replace(p, argv=[executables[p.node], *p.argv[1:]])
             if p.argv and p.argv[0] == python and executables[p.node] else p
             for p in plan.procs]
    return replace(plan, procs=procs)
