"""Every file name fluidctl writes, decided in one place.

``LogLayout`` owns a job's log directory (workerlog.N, serverlog.N, endpoints.log, launch.log,
one sub-directory per remote host, the Slurm batch script and outputs); ``state_dir`` owns where
daemons (standalone pservers) leave their pid files and state records, ``jobs_dir`` where
submitted Slurm jobs are recorded. No other module assembles these paths.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Dict, List, Mapping, NamedTuple, Optional, Tuple

from fluidctl.errors import UsageError
from fluidctl.statefiles import (  # noqa: F401 (also imported from here)
    StateFileError, open_state_file, read_state_file, write_atomic)

DEFAULT_LOG_DIR = "mylog"
STATE_ENV = "FLUIDCTL_STATE_DIR"
LOCK_NAME = ".fluidctl.lock"
SHARED_MARKER = ".fluidctl.shared."


def _rank_logs(where: Path) -> list:
    """workerlog.N and serverlog.N directly in ``where``."""
    return [p for p in sorted(where.glob("workerlog.*")) + sorted(where.glob("serverlog.*"))
            if p.suffix[1:].isdigit()]


class LogLayout(NamedTuple):
    """Where a job's logs are: LOG_DIR (``root``), or a remote node's part of it. (NamedTuples
    here, not dataclasses: every rank's ``fluidctl worker`` imports this module, and importing
    dataclasses (and inspect) would add to each rank's start-up.)"""
    root: Path
    host: Optional[str] = None          # a remote node's logs live in LOG_DIR/<host>/

    @property
    def dir(self) -> Path:
        return self.root / self.host if self.host else self.root

    def for_host(self, host: str) -> "LogLayout":
        return LogLayout(self.root, host)

    def worker(self, rank: int) -> Path:
        return self.dir / f"workerlog.{rank}"

    def server(self, index: int) -> Path:
        return self.dir / f"serverlog.{index}"

    def for_role(self, role: str, index: int) -> Path:
        return self.server(index) if role.upper() == "PSERVER" else self.worker(index)

    @property
    def endpoints(self) -> Path:
        return self.root / "endpoints.log"

    @property
    def launch(self) -> Path:
        return self.root / "launch.log"

    @property
    def lock(self) -> Path:
        """Held (flock) by the job using this log dir: a second job is refused."""
        return self.root / LOCK_NAME

    def shared_marker(self, nonce: str) -> Path:
        """The empty file a multi-node launcher makes here, named with a fresh random
        ``nonce`` per job: a node agent that finds it at its own LOG_DIR writes into the
        launcher's very directory (a shared file system), so the ranks' log files there are
        the logs and nothing is streamed back or written twice. Comparing paths cannot tell:
        the same path can be two disks and two paths one; a fresh name per job is also never
        in an NFS client's lookup cache."""
        return self.root / f"{SHARED_MARKER}{nonce}"

    def stale_logs(self, keep) -> list:
        """Files here that this job does not write but that would pass for its own:
        workerlog.N / serverlog.N of an earlier, larger job, in LOG_DIR and in its host
        sub-directories (LOG_DIR/<host>/; a sub-directory holding its own ``.fluidctl.lock``
        is another job's log dir and is left alone), and a killed launcher's shared markers.
        For a host's layout (a node agent), only that host's sub-directory."""
        keep = {os.path.abspath(k) for k in keep}
        if self.host:
            dirs = [self.dir]
        else:
            dirs = [self.root] + [d for d in sorted(self.root.iterdir())
                                  if d.is_dir() and not (d / LOCK_NAME).exists()]
        found = [p for d in dirs for p in _rank_logs(d) if os.path.abspath(p) not in keep]
        if not self.host:
            found += sorted(self.root.glob(f"{SHARED_MARKER}*"))
        return found

    def node_launch(self, host: str) -> Path:
        """The launch log a remote node's agent keeps on that node."""
        return self.root / f"launch.{host}.log"

    @property
    def failure_json(self) -> Path:
        """The failure report for tooling (first failure, triage, every rank's end)."""
        return self.root / "failure.json"

    @property
    def stragglers_log(self) -> Path:
        """Every straggler report said while the job ran, one line each."""
        return self.root / "stragglers.log"

    @property
    def stragglers_json(self) -> Path:
        """The latest straggler report, for tools."""
        return self.root / "stragglers.json"

    @property
    def events(self) -> Path:
        """The job's events (fluidctl/telemetry: stragglers, hangs, restarts, elastic worlds,
        lost nodes, checkpoint commits), one JSON object a line, appended while it runs."""
        return self.root / "events.jsonl"

    @property
    def live(self) -> Path:
        """What the running launcher sees of its ranks, rewritten every second (fluidctl/observe:
        per-rank progress, step times, state): read by ``fluidctl top`` and the metrics
        endpoint, so neither asks the ranks anything."""
        return self.root / "live.json"

    @property
    def step_history(self) -> Path:
        """Every rank's step time over the job's life (fluidctl/telemetry/steptimes.py):
        one JSON object a line, written by the launcher from the pages it already reads,
        downsampled so that a long job's file stays small; read by ``fluidctl report``."""
        return self.root / "steptimes.jsonl"

    @property
    def job_state(self) -> Path:
        """The running launcher's pid and job, for ``fluidctl dump``."""
        return self.root / "job.json"

    @property
    def mpirun(self) -> Path:
        """mpirun's own output under ``--backend mpi`` (ranks still get workerlog.N)."""
        return self.root / "mpirun.log"

    @property
    def mpirun_stderr(self) -> Path:
        """mpirun's stderr (its own messages and what the ranks write to stderr), apart from
        its stdout, so the echo keeps the ranks' stderr on fluidctl's stderr."""
        return self.root / "mpirun.stderr.log"

    def stream_copy(self, rank: int, stream: str) -> Path:
        """What rank ``rank`` wrote to ``stream`` ('stdout' or 'stderr') alone (its
        workerlog.N has both): the console echo of --backend mpi's rank 0 follows these."""
        return self.dir / f".workerlog.{rank}.{stream}"

    @property
    def mpi_hostfile(self) -> Path:
        """The hostfile handed to mpirun under ``--backend mpi``."""
        return self.root / "mpi.hostfile"

    def sbatch_pending(self) -> Path:
        """The batch script as written before ``sbatch`` names the job (renamed to
        ``sbatch_script_of(JOBID)`` once it has)."""
        return self.root / f".slurm-pending.{os.getpid()}.{os.urandom(3).hex()}.sbatch"

    def sbatch_script_of(self, job_id: str) -> Path:
        """The batch script of submitted job ``job_id``, as it was submitted."""
        return self.root / f"slurm-{job_id}.sbatch"

    def slurm_job(self, job_id: str) -> "LogLayout":
        """A submitted job's own log dir, LOG_DIR/slurm-JOBID (its workerlog.N, srun.log,
        launch.log, failure.json, job.json): two jobs submitted from one directory never share
        or overwrite logs. ``slurm_job("%j")`` is the pattern the batch script is written
        with; its output and exit file stay beside it (slurm-JOBID.out, .exitcode)."""
        return LogLayout(self.root / f"slurm-{job_id}")

    @property
    def slurm_output(self) -> Path:
        """The batch script's own stdout/stderr (sbatch --output; %j is the job id)."""
        return self.root / "slurm-%j.out"

    def slurm_output_of(self, job_id: str) -> Path:
        return self.root / f"slurm-{job_id}.out"

    @property
    def srun(self) -> Path:
        """srun's own messages under ``--backend slurm`` (ranks still get workerlog.N)."""
        return self.root / "srun.log"

    @property
    def srun_pserver(self) -> Path:
        """srun's own messages for the pservers' step (pserver mode under --backend slurm)."""
        return self.root / "srun.pserver.log"

    def job_exit(self, job_id: str) -> Path:
        """The exit code the batch script of job ``job_id`` leaves when it ends (read without
        sacct); ``job_exit("%j")`` is the pattern the script is written with."""
        return self.root / f"slurm-{job_id}.exitcode"

    @property
    def checkpoint_request(self) -> Path:
        """The checkpoint request: created by the launcher (SIGTERM, SIGUSR1, Slurm's warning
        signal, a time limit near) or ``fluidctl job checkpoint``; every rank polls it
        (FLUIDCTL_CHECKPOINT_REQUEST). Its one line: ``stop`` or ``save`` and why."""
        return self.root / "checkpoint.request"

    @property
    def checkpoint_state(self) -> Path:
        """The last committed checkpoint of the job (step, directory, whether the ranks
        stopped after it), written by rank 0 of ``fluidctl.runtime.checkpoint``; read by the
        launcher (exit for requeue) and ``fluidctl job status``."""
        return self.root / "checkpoint.json"

    def create(self) -> None:
        """Make the directory; a path that exists as a file is the user's mistake."""
        for path in (self.root, self.dir):
            if path.exists() and not path.is_dir():
                raise UsageError(f"log dir {path} is a file",
                                 "pass --log-dir with a directory path")
        try:
            self.dir.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise UsageError(f"cannot create log dir {self.dir}: {exc.strerror}",
                             "pass --log-dir with a writable directory") from None
        if not os.access(self.dir, os.W_OK):
            raise UsageError(f"log dir {self.dir} is not writable",
                             "pass --log-dir with a writable directory")


class DiagDir(NamedTuple):
    """A node's diagnostics directory for one job (FLUIDCTL_DIAG_DIR): the runtime's progress
    counters and faulthandler stack files (see fluidctl/diagnostics/progress.py). Made by the process that
    supervises the node's ranks (``create``), in /dev/shm when it can, removed at the end."""
    root: Path

    def env(self) -> Dict[str, str]:
        """What the ranks need to report here."""
        from fluidctl import envs
        return {envs.DIAG_DIR: str(self.root)}

    def progress(self, rank: int) -> Path:
        return self.root / f"progress.{rank}"

    def stack(self, rank: int) -> Path:
        return self.root / f"stack.{rank}"

    def steps(self, rank: int) -> Path:
        """The rank's straggler sums (fluidctl/diagnostics/stragglers.py)."""
        return self.root / f"steps.{rank}"

    @property
    def collectives_request(self) -> Path:
        """Touched by the launcher at a hang: torch ranks answer with their collective records
        (fluidctl/diagnostics/collective_records.py)."""
        return self.root / "collectives.request"

    def collectives(self, rank: int) -> Path:
        """The rank's last collective records from torch's Flight Recorder (JSON)."""
        return self.root / f"collectives.{rank}"

    def endpoints(self, node: int) -> Path:
        """Node ``node``'s ranks' endpoints (FLUIDCTL_ENDPOINTS_FILE), written where the world's
        list is too long for an environment; named by node, as under Slurm every node's
        ranks share one directory."""
        return self.root / f"endpoints.{node}"

    def join_socket(self, attempt: int) -> Path:
        """The node agent's Unix socket the node's ranks join through (runtime/nodejoin.py),
        one per attempt (FLUIDCTL_NODE_JOIN)."""
        return self.root / f"join.{attempt}"

    def rank_file(self, rank: int) -> Path:
        """``<node> <pid>`` of a rank whose launcher cannot see its process (Slurm: the rank's
        ``fluidctl worker`` writes it), for the node-side stack taker."""
        return self.root / f"rank.{rank}"

    @staticmethod
    def this_node(environ: Mapping[str, str]) -> str:
        """This node's name in rank files, computed alike by a rank and by the stack taker
        started on its node: Slurm's node name (several slurmd may share a host), else the
        address ssh reached the node at (mpirun's daemons; several test nodes share a host
        too), else the host name."""
        from fluidctl import envs
        return (environ.get(envs.SLURMD_NODENAME) or envs.ssh_server_address(environ)
                or os.uname().nodename)

    def node_stacks(self, node: str) -> Path:
        """The stacks of one node's ranks, as that node's stack taker wrote them (JSON)."""
        return self.root / f"stacks.{node}.json"

    def ranks(self) -> Dict[int, Tuple[str, int]]:
        """rank -> (node, pid) from the rank files; unreadable ones are left out."""
        found = {}
        for path in self.root.glob("rank.*"):
            rank = path.name.partition(".")[2]
            try:
                node, pid = path.read_text().split()
                if rank.isdigit():
                    found[int(rank)] = (node, int(pid))
            except (OSError, ValueError):
                continue
        return found

    @staticmethod
    def rank_of_progress(name: str, kind: str = "progress") -> Optional[int]:
        prefix, _, rank = name.partition(".")
        return int(rank) if prefix == kind and rank.isdigit() else None

    def read_ranks(self, kind: str, size: int) -> Dict[int, bytes]:
        """The first ``size`` bytes of every rank's ``<kind>.<rank>`` file here (``progress``,
        ``steps``); files that cannot be read or are shorter are left out."""
        found: Dict[int, bytes] = {}
        try:
            names = os.listdir(self.root)
        except OSError:
            return found
        for name in names:
            rank = self.rank_of_progress(name, kind)
            if rank is None:
                continue
            try:
                fd = os.open(self.root / name, os.O_RDONLY)
            except OSError:
                continue
            try:
                data = os.pread(fd, size, 0)
            except OSError:
                continue
            finally:
                os.close(fd)
            if len(data) == size:
                found[rank] = data
        return found

    @classmethod
    def create(cls, base: Optional[Path] = None) -> "DiagDir":
        """A new directory in /dev/shm when it can (this node's ranks only), or hidden inside
        ``base`` (a directory every node sees: LOG_DIR under Slurm)."""
        import tempfile
        if base is not None:
            return cls(Path(tempfile.mkdtemp(prefix=".fluidctl_diag.", dir=str(base))))
        shm = "/dev/shm" if os.access("/dev/shm", os.W_OK) else None
        made = cls(Path(tempfile.mkdtemp(prefix="fluidctl_diag.", dir=shm)))
        try:
            write_atomic(made.root / made.OWNER, _owner_line(os.getpid()))
        except OSError:
            pass
        made.sweep_dead(Path(shm or tempfile.gettempdir()))
        return made

    OWNER = "owner"             # "<pid> <start time> <pid namespace>" of the creator

    @classmethod
    def sweep_dead(cls, where: Path) -> List[str]:
        """Remove the directories in ``where`` whose creator is gone (an agent or launcher
        killed with SIGKILL along with its watchdog leaves its directory in /dev/shm, in
        memory until reboot). Only directories of this user whose owner record names a
        process of this pid namespace that no longer runs (or whose pid was reused); one
        without an owner record is being made, or not ours to judge, and stays."""
        import shutil
        gone = []
        try:
            names = [n for n in os.listdir(where) if n.startswith("fluidctl_diag.")]
        except OSError:
            return gone
        uid = os.geteuid()
        for name in names:
            path = Path(where) / name
            try:
                if os.lstat(path).st_uid != uid:
                    continue
                pid, start, ns = read_state_file(path / cls.OWNER, 4096).decode().split()
            except (OSError, ValueError, UnicodeDecodeError):
                continue
            if ns == _pid_namespace() and _owner_line(int(pid)).split()[:2] != [pid, start]:
                shutil.rmtree(path, ignore_errors=True)
                gone.append(str(path))
        return gone

    def remove(self) -> None:
        import shutil
        shutil.rmtree(self.root, ignore_errors=True)


def _pid_namespace() -> str:
    try:
        return os.readlink("/proc/self/ns/pid")
    except OSError:
        return "-"


def _owner_line(pid: int) -> str:
    """``pid``'s owner record: its start time (clock ticks since boot, /proc/PID/stat field
    22) tells a reused pid from the creator; "gone" once it no longer runs."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
        start = fields[19].decode()
    except (OSError, IndexError):
        start = "gone"
    return f"{pid} {start} {_pid_namespace()}\n"


class CheckpointLayout(NamedTuple):
    """A checkpoint directory: one ``step-NNNNNNNNN/`` per committed checkpoint (a manifest
    and one part per rank), staged as ``.partial-step-NNNNNNNNN/`` until every part is there."""
    root: Path

    MANIFEST = "manifest.json"

    def committed(self, step: int) -> Path:
        return self.root / f"step-{step:09d}"

    def staging(self, step: int) -> Path:
        return self.root / f".partial-step-{step:09d}"

    def trash(self, step: int) -> Path:
        """Where an older commit of the same step goes before it is removed."""
        return self.root / f".old-step-{step:09d}.{os.getpid()}"

    @staticmethod
    def part(where: Path, rank: int) -> Path:
        return where / f"part-{rank:05d}.bin"

    @staticmethod
    def part_record(where: Path, rank: int) -> Path:
        """A part's size and digest, written by its rank for rank 0's manifest."""
        return where / f"part-{rank:05d}.json"

    @staticmethod
    def step_of(name: str) -> Optional[int]:
        """The step of a committed ``step-N`` directory name, else None."""
        if name.startswith("step-") and name[5:].isdigit():
            return int(name[5:])
        return None

    def steps(self) -> list:
        """Committed steps, newest first (a directory that only looks committed is checked
        by its manifest when loaded)."""
        try:
            names = os.listdir(self.root)
        except FileNotFoundError:
            return []
        return sorted((s for s in map(self.step_of, names) if s is not None), reverse=True)


def hang_dir(root: Path, when: float, kind: str = "hang") -> Path:
    """LOG_DIR/hang-<time>/ (``--hang-timeout``) or LOG_DIR/dump-<time>/ (``fluidctl dump``):
    one file per rank with its full stack, and summary.txt."""
    import time
    return root / (f"{kind}-" + time.strftime("%Y%m%d-%H%M%S", time.localtime(when)))


def state_dir() -> Path:
    """Where standalone daemons keep pid files and state: $FLUIDCTL_STATE_DIR, else
    $XDG_RUNTIME_DIR/fluidctl, else ~/.fluidctl/run."""
    if os.environ.get(STATE_ENV):
        return Path(os.environ[STATE_ENV])
    if os.environ.get("XDG_RUNTIME_DIR"):
        return Path(os.environ["XDG_RUNTIME_DIR"]) / "fluidctl"
    return Path.home() / ".fluidctl" / "run"


# the environment ``fluidctl cluster setup`` makes on every node (relative paths are from the
# remote home; '{host}' becomes the node's name); ``--venv`` or $FLUIDCTL_VENV change it
NODE_VENV = "~/.fluidctl/venv"
NODE_WHEELHOUSE = "wheelhouse"                 # inside the node's venv
NODE_ENV_RECORD = "fluidctl-env.json"          # inside the node's venv: what setup installed


def node_venv(venv: str, host: str) -> str:
    """The node's venv path as given ('{host}' replaced); '~/' and relative paths are from the
    remote home, which is where SFTP and a command without a working directory start."""
    path = venv.replace("{host}", host)
    return path[2:] if path.startswith("~/") else path


def wheelhouse_dir() -> Path:
    """Where ``cluster setup`` builds its wheelhouse here: $XDG_CACHE_HOME/fluidctl/wheelhouse,
    else ~/.cache/fluidctl/wheelhouse."""
    cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(cache) / "fluidctl" / "wheelhouse"


def pserver_pid_file(port: int) -> Path:
    return state_dir() / f"pserver-{port}.pid"


def pserver_state_file(port: int) -> Path:
    return state_dir() / f"pserver-{port}.json"


def pserver_log_file(port: int) -> Path:
    return state_dir() / f"pserver-{port}.log"


def pserver_token_file(port: int) -> Path:
    """The job token `fluidctl pserver start --daemon` generates when none is given."""
    return state_dir() / f"pserver-{port}.token"


def user_secret_file() -> Path:
    """The per-user secret that job tokens of plain ``srun`` steps are derived from
    (runtime/usersecret.py): $FLUIDCTL_STATE_DIR/secret, else ~/.fluidctl/secret. In the home
    directory, not $XDG_RUNTIME_DIR: every node of a job must read the same file."""
    if os.environ.get(STATE_ENV):
        return Path(os.environ[STATE_ENV]) / "secret"
    return Path.home() / ".fluidctl" / "secret"


def jobs_dir() -> Path:
    """Records of submitted Slurm jobs (one JSON file per job id): $FLUIDCTL_STATE_DIR/jobs,
    else ~/.fluidctl/jobs (kept across logins, unlike $XDG_RUNTIME_DIR)."""
    if os.environ.get(STATE_ENV):
        return Path(os.environ[STATE_ENV]) / "jobs"
    return Path.home() / ".fluidctl" / "jobs"


def job_record(job_id: str) -> Path:
    return jobs_dir() / f"slurm-{job_id}.json"


def bad_nodes_ledger() -> Path:
    """The ledger of bad nodes (cluster/ledger.py): $FLUIDCTL_STATE_DIR/bad-nodes.json, else
    ~/.fluidctl/bad-nodes.json (kept across jobs and logins)."""
    if os.environ.get(STATE_ENV):
        return Path(os.environ[STATE_ENV]) / "bad-nodes.json"
    return Path.home() / ".fluidctl" / "bad-nodes.json"


UNIX_PATH_MAX = 100       # bytes of a Unix socket's path we use (AF_UNIX stops at 108)


def node_join_socket(key: str) -> str:
    """The node's join socket where srun starts the ranks (runtime/nodejoin.py): named by
    ``key`` (job, step, requeue count and node: the same for every task of the node, which
    computes it without talking to the others) in a directory of this user on the node's own
    disk; "" when no such directory can be had or the path is too long (then every rank joins
    the store itself)."""
    import stat
    import tempfile
    where = os.path.join(tempfile.gettempdir(), f"fluidctl-join-{os.geteuid()}")
    try:
        os.mkdir(where, 0o700)
    except FileExistsError:
        pass
    except OSError:
        return ""
    try:
        st = os.lstat(where)
    except OSError:
        return ""
    # another user's directory (or a link) in a shared /tmp could catch the ranks' records
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o077:
        return ""
    path = os.path.join(where, "".join(c if c.isalnum() or c in "._-" else "_" for c in key))
    return path if len(os.fsencode(path)) <= UNIX_PATH_MAX else ""
