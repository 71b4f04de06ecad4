"""``LaunchConfig``: everything ``fluidctl train`` was asked, checked once and frozen.

``commands/train.py`` builds it from the options (``LaunchConfig.from_options``); a launcher's
``prepare(config)`` turns it into a Plan and ``launch.execute`` runs that plan with the
config's supervision settings. Nothing downstream reads an option again or re-checks it.
"""
from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any, Iterable, Mapping, Optional, Sequence, Tuple

from fluidctl import envs
from fluidctl.errors import UsageError
from fluidctl.sigs import GRACE_PERIOD
from fluidctl.paths import DEFAULT_LOG_DIR, LogLayout
from fluidctl.planning import options as opts
from fluidctl.planning.hosts import Host, load_hosts
from fluidctl.planning.options import TEE_CHOICES  # noqa: F401 - checked here, declared there
from fluidctl.planning.plan import JobSpec, Node


@dataclass(frozen=True)
class LaunchConfig:
    """One ``fluidctl train`` request. ``hosts`` are the nodes of --hostfile/--hosts (empty:
    this machine); ``python`` is the interpreter on the nodes (None: this one)."""
    script: str                                 # checked; absolute for files
    script_args: Tuple[str, ...] = ()
    backend: str = "local"
    mode: str = "collective"                    # "collective" | "pserver"
    nproc: Optional[int] = None                 # trainers per node (None: one per GPU, else 1)
    gpus: Optional[str] = None                  # --gpus as given: a count or ids
    hosts: Tuple[Host, ...] = ()
    pservers: Optional[int] = None              # pservers to start (pserver mode; None: 1)
    pserver_endpoints: Tuple[str, ...] = ()     # pservers already running
    pserver_hosts: Tuple[str, ...] = ()         # nodes that run the started pservers
    pserver_args: Tuple[str, ...] = ()          # extra flags for the pserver processes
    sync: bool = True
    token: str = ""                             # the job's HMAC key
    user_env: Mapping[str, str] = field(default_factory=dict)
    python: Optional[str] = None
    venv: Optional[str] = None                  # the nodes' `cluster setup` venv (None: default)
    remote_dir: Optional[str] = None
    ssh_config: Optional[str] = None
    accept_new_host_keys: bool = False
    ssh_timeout: float = 10.0
    started_port: Optional[int] = None
    log_dir: str = DEFAULT_LOG_DIR
    grace_period: float = GRACE_PERIOD
    max_restarts: int = 0
    checkpoint_signal: str = "TERM"             # forwarded to the ranks on a checkpoint request
    tee: str = "rank0"
    tee_ranks: Optional[Tuple[int, ...]] = None     # --tee-ranks: echo these trainers only
    hang_timeout: Optional[float] = None            # --hang-timeout seconds (None: off)
    metrics_port: Optional[int] = None              # --metrics-port (None: no endpoint)
    metrics_host: str = "127.0.0.1"                 # --metrics-host: loopback unless told
    log_tail: int = 20
    # the backend's own options and its meaning of --nodes, parsed by it (its package's
    # options.py ``configure``): SlurmOptions, K8sOptions, a HostNodes ...; None: none given
    backend_options: Any = None
    include_bad: bool = False                   # --include-bad: use nodes in the bad-node ledger

    @property
    def layout(self) -> LogLayout:
        return LogLayout(Path(self.log_dir))

    @property
    def interpreter(self) -> str:
        return self.python or sys.executable

    @property
    def node_venv(self) -> Optional[str]:
        """The venv the nodes' processes use where it exists there; None with --python (an
        explicit interpreter wins)."""
        from fluidctl.paths import NODE_VENV
        return None if self.python else (self.venv or NODE_VENV)

    def job(self, nodes: Sequence[Node], script: Optional[str] = None,
            multi_node_logs: bool = False) -> JobSpec:
        """The planner's input for these nodes (``script``: as the nodes must name it)."""
        return JobSpec(script=script or self.script, script_args=list(self.script_args),
                       nodes=list(nodes), mode=self.mode,
                       pserver_endpoints=list(self.pserver_endpoints), sync=self.sync,
                       pserver_args=list(self.pserver_args), log_dir=self.log_dir,
                       user_env=self.user_env, python=self.interpreter, token=self.token,
                       multi_node_logs=multi_node_logs)

    @classmethod
    def from_options(cls, *, script: str, script_args: Sequence[str] = (),
                     backend: Optional[str] = None, hostfile: Optional[str] = None,
                     hosts_arg: Optional[str] = None, env_pairs: Iterable[str] = (),
                     env_file: Optional[str] = None, exports: Iterable[str] = (),
                     token_file: Optional[str] = None, pserver_endpoints: Optional[str] = None,
                     pserver_hosts: Optional[str] = None, checkpoint_dir: Optional[str] = None,
                     checkpoint_every: Optional[int] = None, mode: str = "collective",
                     pservers: Optional[int] = None, grace_period: float = GRACE_PERIOD,
                     log_dir: str = DEFAULT_LOG_DIR, tee_ranks: Optional[str] = None,
                     hang_timeout: Optional[float] = None, **settings) -> "LaunchConfig":
        """Check the options of ``fluidctl train`` (a UsageError for the first mistake, before
        anything is started or written) and freeze them; ``settings`` are taken as they are.
        Each value's type and range were checked where it was parsed (fluidctl/trainargs.py,
        the one declaration); what is checked here is what one option says about another."""
        if "checkpoint_signal" in settings:
            settings["checkpoint_signal"] = checkpoint_signal(settings["checkpoint_signal"])
        script_path = opts.check_script(script)
        user_env = opts.read_env_file(env_file)
        user_env.update(opts.parse_env_pairs(env_pairs))
        user_env = {**opts.exported(exports), **user_env}
        envs.check_knobs(user_env)          # --env FLUIDCTL_TIMEOUT=nan: refused here, once
        if not str(log_dir).strip():       # Path("") would be the current directory
            raise UsageError("--log-dir is empty", "pass a directory, e.g. --log-dir runs/exp3 "
                             "(--log-dir . for the current directory)")
        layout = LogLayout(Path(log_dir))
        if layout.root.exists() and not layout.root.is_dir():
            raise UsageError(f"log dir {log_dir} is a file", "pass --log-dir with a directory path")
        if mode != "pserver" and (pservers or pserver_endpoints or pserver_hosts):
            raise UsageError("--pservers/--pserver-endpoints/--pserver-hosts need --mode pserver",
                             "add --mode pserver")
        if mode != "pserver" and (checkpoint_dir or checkpoint_every
                                  or settings.get("sync") is False):
            flag = ("--checkpoint-dir" if checkpoint_dir else "--checkpoint-every"
                    if checkpoint_every else "--async")
            raise UsageError(f"{flag} is for the parameter servers, which need --mode pserver",
                             "add --mode pserver (collective scripts checkpoint with "
                             "fluidctl.runtime.checkpoint)")
        if pserver_endpoints and (checkpoint_dir or checkpoint_every):
            raise UsageError("--checkpoint-dir/--checkpoint-every configure the pservers "
                             "fluidctl starts, and --pserver-endpoints names running ones",
                             "give them to 'fluidctl pserver start' instead")
        if pservers and pserver_endpoints:
            raise UsageError("--pservers and --pserver-endpoints both given",
                             "start pservers here (--pservers N) or use running ones, not both")
        backend = backend or cls.backend
        ranks = parse_ranks(tee_ranks)
        if ranks is not None and settings.get("tee", "rank0") != "rank0":
            raise UsageError(f"--tee {settings['tee']} and --tee-ranks both given",
                             "--tee-ranks echoes only the ranks it names, instead of --tee: "
                             "give one of them")
        endpoints = split_endpoints(pserver_endpoints)
        token = job_token(token_file)
        hosts = tuple(load_hosts(hostfile, hosts_arg)) if hostfile or hosts_arg else ()
        return cls(
            script=script_path, script_args=tuple(script_args), backend=backend, mode=mode,
            hosts=hosts, pservers=pservers, pserver_endpoints=tuple(endpoints),
            pserver_hosts=tuple(h.strip() for h in (pserver_hosts or "").split(",")
                                if h.strip()),
            pserver_args=tuple(pserver_args(checkpoint_dir, checkpoint_every)),
            token=token, user_env=MappingProxyType(user_env), grace_period=grace_period,
            log_dir=log_dir, tee_ranks=ranks, hang_timeout=hang_timeout, **settings)

    def check_tee_ranks(self, trainers: int) -> None:
        """--tee-ranks names ranks the planned job has."""
        if self.tee_ranks and self.tee_ranks[-1] >= trainers:
            raise UsageError(f"--tee-ranks names rank {self.tee_ranks[-1]}, but the job has "
                             f"{trainers} trainer(s)", f"choose ranks 0..{trainers - 1}")


def checkpoint_signal(name: Optional[str]) -> str:
    """--checkpoint-signal's value as a name without SIG (TERM, USR1, INT, ...)."""
    from fluidctl.sigs import SIGKILL, by_name
    word = (name or "TERM").strip().upper()
    try:
        number = by_name(word)
    except ValueError:
        number = 0
    if number in (0, SIGKILL) or word.isdigit() or word.removeprefix("SIG") in ("STOP", "KILL"):
        raise UsageError(f"--checkpoint-signal {name}: not a signal a script can trap",
                         "name one, e.g. --checkpoint-signal TERM or --checkpoint-signal USR1")
    return word.removeprefix("SIG")


def parse_ranks(text: Optional[str]) -> Optional[Tuple[int, ...]]:
    """'0,3' -> (0, 3); None stays None."""
    if text is None:
        return None
    try:
        ranks = sorted({int(r) for r in text.split(",") if r.strip()})
    except ValueError:
        ranks = []
    if not ranks or ranks[0] < 0:
        raise UsageError(f"--tee-ranks {text!r} is not a list of ranks",
                         "write global trainer ranks, e.g. --tee-ranks 0,3")
    return tuple(ranks)


def job_token(token_file: Optional[str]) -> str:
    """--token-file, else $FLUIDCTL_JOB_TOKEN, else a fresh random token."""
    if token_file:
        return envs.read_token_file(token_file)
    # os.urandom is what secrets.token_hex reads; the secrets module is slow to import
    return os.environ.get(envs.JOB_TOKEN) or os.urandom(16).hex()


def split_endpoints(text: Optional[str]) -> Tuple[str, ...]:
    if not text:
        return ()
    eps = [e.strip() for e in text.split(",") if e.strip()]
    for ep in eps:
        host, _, port = ep.rpartition(":")
        if not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise UsageError(f"malformed pserver endpoint {ep!r}",
                             "write IP:PORT,IP:PORT, e.g. 127.0.0.1:7164")
    return tuple(eps)


def pserver_args(checkpoint_dir: Optional[str], checkpoint_every: Optional[int]) -> Tuple[str, ...]:
    args = []
    if checkpoint_dir:
        args += ["--checkpoint-dir", os.path.abspath(checkpoint_dir)]
    if checkpoint_every:
        args += ["--checkpoint-every", str(checkpoint_every)]
    return tuple(args)
