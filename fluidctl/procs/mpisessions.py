"""Open MPI's session directories, left behind.

PRRTE (the runtime of Open MPI 5) gives each mpirun and each of its daemons a directory named
after the tool and its pid, ``$TMPDIR/ompi.PID`` or ``$TMPDIR/prted.PID``, holding the PMIx
rendezvous files of that process. It removes it when it ends, but not when it is killed with
SIGKILL (a launcher's deadline, the launcher's own death, a node's OOM killer). Pids wrap (at
32,768 on many Linux machines), and the next mpirun or daemon given that pid finds the old
rendezvous file in its way: it stops at once with "The PMIx server's listener thread failed
to start" and exit code 213 (PMIx's own help text: "a conflicting stale named pipe from a
prior failed job").

``sweep`` removes the directories of processes that no longer exist, before fluidctl starts an
mpirun and after one ended; a directory whose process is alive is never touched."""
from __future__ import annotations

import os
import re
import shutil
from pathlib import Path
from typing import List, Mapping, Optional

# the tools' names PRRTE puts in front of the pid (argv[0] of mpirun, prterun, prte, prted)
NAME = re.compile(r"^(?:ompi|mpirun|mpiexec|prterun|prte|prted)\.(\d+)$")


def root(env: Optional[Mapping[str, str]] = None) -> Path:
    """Where PRRTE puts them, in its own order: the ``prte_top_session_dir`` MCA parameter,
    then TMPDIR, TEMP, TMP, then /tmp."""
    env = os.environ if env is None else env
    for name in ("PRTE_MCA_prte_top_session_dir", "TMPDIR", "TEMP", "TMP"):
        if env.get(name):
            return Path(env[name])
    return Path("/tmp")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:             # another user's process: alive
        return True
    return True


def stale(base: Path) -> List[Path]:
    """This user's session directories under ``base`` whose process is gone."""
    found = []
    try:
        entries = list(os.scandir(base))
    except OSError:
        return found
    uid = os.getuid()
    for entry in entries:
        match = NAME.match(entry.name)
        if not match:
            continue
        try:
            if not entry.is_dir(follow_symlinks=False) or \
                    entry.stat(follow_symlinks=False).st_uid != uid:
                continue
        except OSError:
            continue
        if not _alive(int(match.group(1))):
            found.append(Path(entry.path))
    return found


def sweep(env: Optional[Mapping[str, str]] = None) -> List[Path]:
    """Remove the stale session directories (see the module's text); returns them."""
    removed = []
    for path in stale(root(env)):
        shutil.rmtree(path, ignore_errors=True)
        if not path.exists():
            removed.append(path)
    return removed
