"""A real Slurm cluster on this machine, for the Slurm tests: one munged, one slurmctld and two
slurmd from Debian's packages (Slurm 22.05), each started in the foreground by the fixture.

``SlurmCluster.start(workdir)`` writes its own munge key, slurm.conf and state directories
under ``workdir``, starts munged on its own socket, slurmctld on a free port of 127.0.0.1 and
one ``slurmd -N NAME`` per node (each NodeName with its own Port and NodeAddr), and waits until
``sinfo`` shows every node idle. ``stop()`` ends each daemon it started by pid (slurmd's job
steps are stopped by cancelling every job first).

Node names. Ranks reach each other by their node's name (MASTER_ADDR is the job's first node,
as on a real cluster, where node names resolve through DNS or /etc/hosts). So that they resolve
here without touching /etc/hosts, the test nodes are *named* by their loopback addresses:
``NodeName=127.0.0.2`` and ``NodeName=127.0.0.3``. Slurm's hostlist syntax handles them
(``127.0.0.[2-3]``), and so does fluidctl's parser.

Job ids start at a random FirstJobId, so that two test clusters on one machine (several
suites at once) do not derive the same rank ports from the same job ids.

Every client call goes through ``env()``: the caller's environment without any inherited
SLURM_* variable (a test itself may run inside an allocation), plus SLURM_CONF.
"""
from __future__ import annotations

import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Mapping, Optional

DAEMONS = {"munged": "/usr/sbin/munged", "slurmctld": "/usr/sbin/slurmctld",
           "slurmd": "/usr/sbin/slurmd"}
CLIENTS = ("srun", "sbatch", "salloc", "squeue", "scontrol", "scancel", "sinfo")
NODES = ("127.0.0.2", "127.0.0.3")
CPUS_PER_NODE = 4            # claimed (config_overrides): 2 nodes x 4 ranks on a 2-core machine
PARTITION = "debug"


def _above_ephemeral() -> range:
    """Ports the kernel never hands out as a connection's own (its ephemeral range is
    /proc/sys/net/ipv4/ip_local_port_range): a daemon's port taken from the ephemeral range
    can be some connection's source port by the time the daemon binds it (seen: slurmd's
    "Unable to bind listen port (43169): Address already in use" in a full run)."""
    try:
        high = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[1])
    except (OSError, ValueError, IndexError):
        high = 60999
    return range(high + 1, 65536)


def distinct_ports(addresses: List[str]) -> List[int]:
    """A free port for each daemon, above the ephemeral range, no number twice (slurmctld
    refuses a slurmd port equal to its own: "slurmctld is talking with itself"), free on
    every address (slurmd listens on all of them); each pytest worker draws from its own
    share of the range, so two workers' clusters never pick the same port."""
    ports: List[int] = []
    span = _above_ephemeral()
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0")
    index = int(worker[2:]) if worker[2:].isdigit() else 0
    share = max(len(addresses), len(span) // 16)
    start = span.start + (index % 16) * share
    candidates = list(range(start, min(start + share, span.stop)))
    secrets.SystemRandom().shuffle(candidates)
    for port in candidates:
        if len(ports) == len(addresses):
            break
        try:
            with socket.socket() as sock:
                sock.bind(("", port))
        except OSError:
            continue
        ports.append(port)
    if len(ports) < len(addresses):
        raise RuntimeError(f"no {len(addresses)} free ports in {span.start}-{span.stop - 1}")
    return ports


def clean_env(base: Optional[Mapping[str, str]] = None, conf: Optional[Path] = None
              ) -> Dict[str, str]:
    """``base`` (default os.environ) without SLURM_*/SLURMD_* names, plus SLURM_CONF."""
    env = {k: v for k, v in (os.environ if base is None else base).items()
           if not k.startswith(("SLURM_", "SLURMD_", "SBATCH_", "SALLOC_", "SRUN_"))}
    if conf is not None:
        env["SLURM_CONF"] = str(conf)
    return env


SLURM_CONF = """\
ClusterName=fluidtest
FirstJobId={first_job_id}
SlurmctldHost={hostname}(127.0.0.1)
SlurmctldPort={ctld_port}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={munge_socket},cred_expire=5
StateSaveLocation={state}
SlurmdSpoolDir={spool}/%n
SlurmctldPidFile={run}/slurmctld.pid
SlurmdPidFile={run}/slurmd.%n.pid
SlurmctldLogFile={log}/slurmctld.log
SlurmdLogFile={log}/slurmd.%n.log
SlurmctldDebug=info
SlurmdDebug=info
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SlurmdParameters=config_overrides
SchedulerParameters=batch_sched_delay=0,sched_interval=1
SchedulerType=sched/builtin
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
MpiDefault=none
ReturnToService=2
SlurmctldTimeout=30
SlurmdTimeout=30
InactiveLimit=0
KillWait=5
MinJobAge=300
PlugStackConfig={etc}/plugstack.conf
{nodes}
PartitionName={partition} Nodes={nodelist} Default=YES MaxTime=INFINITE State=UP OverSubscribe=NO
"""


def cpus_per_node(detail: str) -> str:
    """SLURM_JOB_CPUS_PER_NODE as salloc sets it ('2(x2)'), from ``scontrol show job -d``'s
    per-node groups ('Nodes=127.0.0.[2-3] CPU_IDs=0-1'): CPUs counted, equal runs folded."""
    import hostlist
    counts = []
    for nodes, ids in re.findall(r"\bNodes=(\S+) CPU_IDs=(\S+)", detail):
        cpus = sum(int(b) - int(a) + 1 if b else 1 for a, _, b in
                   (part.partition("-") for part in ids.split(",")))
        counts += [cpus] * len(hostlist.expand_hostlist(nodes))
    runs = []
    for n in counts:
        if runs and runs[-1][0] == n:
            runs[-1][1] += 1
        else:
            runs.append([n, 1])
    return ",".join(f"{n}(x{k})" if k > 1 else str(n) for n, k in runs)


@dataclass
class SlurmCluster:
    workdir: Path
    conf: Path
    nodes: List[str] = field(default_factory=lambda: list(NODES))
    procs: Dict[str, subprocess.Popen] = field(default_factory=dict)
    partition: str = PARTITION

    @staticmethod
    def available() -> str:
        """'' when the daemons and clients are installed, else a one-line reason to skip."""
        missing = [p for p in DAEMONS.values() if not os.access(p, os.X_OK)]
        missing += [c for c in CLIENTS if shutil.which(c) is None]
        if missing:
            return ("Slurm/munge not installed (missing " + ", ".join(missing) +
                    "; README command 2 installs slurmctld slurmd slurm-client munge)")
        if os.geteuid() != 0:
            return "the test Slurm cluster runs its daemons as root"
        return ""

    # --- clients --------------------------------------------------------------------------
    def env(self, base: Optional[Mapping[str, str]] = None, **extra: str) -> Dict[str, str]:
        env = clean_env(base, self.conf)
        env.update(extra)
        return env

    def run(self, *argv: str, check: bool = True, timeout: float = 60, **kw
            ) -> subprocess.CompletedProcess:
        kw.setdefault("env", self.env())
        return subprocess.run(list(argv), capture_output=True, text=True, check=check,
                              timeout=timeout, **kw)

    def allocate(self, nodes: int = 2, ntasks_per_node: int = 2, *extra: str) -> Dict[str, str]:
        """``salloc --no-shell``: a granted allocation, as the variables salloc's shell would
        have (add them to an environment to be "inside" it). Cancelled by ``cancel_all``.
        ``extra``: more salloc options (e.g. ``--time=1``)."""
        res = self.run("salloc", "--no-shell", "-J", "alloc", f"--nodes={nodes}",
                       f"--ntasks-per-node={ntasks_per_node}", *extra, check=False)
        found = re.search(r"Granted job allocation (\d+)", res.stderr)
        if not found:
            raise RuntimeError(f"salloc failed: {res.stderr}\n{self.logs()}")
        job_id = found.group(1)
        info = self.run("scontrol", "show", "job", "-d", "-o", job_id).stdout
        nodelist = re.search(r"\bNodeList=(\S+)", info).group(1)
        return {"SLURM_JOB_ID": job_id, "SLURM_JOBID": job_id, "SLURM_JOB_NODELIST": nodelist,
                "SLURM_NODELIST": nodelist, "SLURM_JOB_NUM_NODES": str(nodes),
                "SLURM_NNODES": str(nodes), "SLURM_NTASKS_PER_NODE": str(ntasks_per_node),
                "SLURM_NTASKS": str(nodes * ntasks_per_node),
                "SLURM_JOB_CPUS_PER_NODE": cpus_per_node(info)}

    def steps(self, job_id: str) -> List[str]:
        """The steps Slurm still lists for a job."""
        out = self.run("squeue", "-h", "-s", "-j", job_id, "-o", "%i", check=False).stdout
        return out.split()

    def cancel_all(self) -> None:
        self.run("scancel", "--full", "--user", "root", check=False)

    def wait_gone(self, job_id: str, timeout: float = 60) -> None:
        """Until squeue no longer lists the job (polled: no sleep-based synchronisation)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            out = self.run("squeue", "-h", "-j", job_id, "-o", "%T", check=False)
            if out.returncode != 0 or not out.stdout.strip() or out.stdout.strip() in (
                    "COMPLETED", "FAILED", "CANCELLED", "TIMEOUT"):
                return
            time.sleep(0.1)
        raise TimeoutError(f"slurm job {job_id} still queued after {timeout}s")

    def wait_idle(self, timeout: float = 60) -> None:
        """Until every node is idle (no job running anywhere)."""
        deadline = time.monotonic() + timeout
        states = ""
        while time.monotonic() < deadline:
            out = self.run("sinfo", "-h", "-N", "-o", "%N %t", check=False)
            states = out.stdout.strip()
            lines = states.splitlines()
            if out.returncode == 0 and len(lines) == len(self.nodes) and all(
                    line.split()[1] == "idle" for line in lines):
                return
            time.sleep(0.05)
        raise TimeoutError(f"slurm nodes not idle after {timeout}s: {states!r}\n{self.logs()}")

    def logs(self) -> str:
        text = []
        for path in sorted((self.workdir / "log").glob("*.log")):
            text.append(f"--- {path.name}\n" + "\n".join(path.read_text(errors="replace")
                                                       .splitlines()[-20:]))
        return "\n".join(text)

    # --- daemons --------------------------------------------------------------------------
    @classmethod
    def start(cls, workdir: Path, timeout: float = 30) -> "SlurmCluster":
        workdir = Path(workdir)
        dirs = {name: workdir / name for name in ("etc", "state", "spool", "run", "log", "munge")}
        for path in dirs.values():
            path.mkdir(parents=True, exist_ok=True)
        os.chmod(dirs["munge"], 0o700)
        key = dirs["munge"] / "munge.key"
        key.write_bytes(secrets.token_bytes(1024))
        os.chmod(key, 0o400)
        munge_socket = dirs["munge"] / "munge.socket"
        ctld_port, *node_ports = distinct_ports(["127.0.0.1", *NODES])
        nodes = []
        for name, port in zip(NODES, node_ports):
            nodes.append(f"NodeName={name} NodeAddr={name} NodeHostname={name} "
                         f"Port={port} CPUs={CPUS_PER_NODE} State=UNKNOWN")
        conf = dirs["etc"] / "slurm.conf"
        (dirs["etc"] / "plugstack.conf").write_text("")
        conf.write_text(SLURM_CONF.format(
            hostname=socket.gethostname(), ctld_port=ctld_port,
            first_job_id=1000 + secrets.randbelow(1_000_000), munge_socket=munge_socket,
            state=dirs["state"], spool=dirs["spool"], run=dirs["run"], log=dirs["log"],
            etc=dirs["etc"], nodes="\n".join(nodes), partition=PARTITION,
            nodelist=",".join(NODES)))
        cluster = cls(workdir, conf)
        env = cluster.env()
        try:
            cluster._spawn("munged", [DAEMONS["munged"], "-F", "--force", f"--key-file={key}",
                                      f"--socket={munge_socket}",
                                      f"--pid-file={dirs['run'] / 'munged.pid'}",
                                      f"--log-file={dirs['log'] / 'munged.log'}",
                                      f"--seed-file={dirs['munge'] / 'munged.seed'}"], env)
            cluster._wait_path(munge_socket, timeout)
            cluster._spawn("slurmctld", [DAEMONS["slurmctld"], "-D", "-i", "-f", str(conf)], env)
            for name in NODES:
                cluster._spawn(f"slurmd-{name}", [DAEMONS["slurmd"], "-D", "-N", name,
                                                  "-f", str(conf)], env)
            cluster.wait_idle(timeout)
        except BaseException:
            cluster.stop()
            raise
        return cluster

    def _spawn(self, name: str, argv: List[str], env: Mapping[str, str]) -> None:
        out = open(self.workdir / "log" / f"{name}.out", "wb")
        try:
            self.procs[name] = subprocess.Popen(argv, env=dict(env), stdout=out,
                                                stderr=subprocess.STDOUT,
                                                stdin=subprocess.DEVNULL, start_new_session=True)
        finally:
            out.close()

    def _wait_path(self, path: Path, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while not path.exists():
            for name, proc in self.procs.items():
                if proc.poll() is not None:
                    raise RuntimeError(f"{name} exited with {proc.returncode}:\n{self.logs()}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"{path} did not appear within {timeout}s")
            time.sleep(0.02)

    def stop(self) -> None:
        """Cancel every job, then stop slurmd, slurmctld and munged (in that order) by pid."""
        if "slurmctld" in self.procs and self.procs["slurmctld"].poll() is None:
            try:
                self.cancel_all()
            except (OSError, subprocess.SubprocessError):
                pass
        order = [n for n in self.procs if n.startswith("slurmd-")] + ["slurmctld", "munged"]
        for name in order:
            proc = self.procs.get(name)
            if proc is None or proc.poll() is not None:
                continue
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        self.procs.clear()
