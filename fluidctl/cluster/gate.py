"""Which of a hostfile's nodes a job runs on: the bad-node ledger's entries are left out
(unless ``--include-bad``), then, with ``--health-gate``, the outliers of a deep check
(cluster/health.py), each recorded in the ledger, as long as ``min_nodes`` still hold.

Every node left out is said in one line: which, why, and how to include it again.
"""
from __future__ import annotations

import sys
import time
from typing import Dict, List, Optional, Sequence

from fluidctl.cluster import ledger
from fluidctl.planning.hosts import Host


def _say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def skip_ledgered(hosts: Sequence[Host], min_nodes: int, include_bad: bool = False,
                  say=_say, ssh_config=None) -> List[Host]:
    """``hosts`` without the ledger's active entries (cluster/ledger.py ``usable``), each
    matched by the address its ssh config resolves it to, not by its alias."""
    if include_bad:
        return list(hosts)
    from fluidctl.remote.sshconfig import resolve_hosts
    resolved = resolve_hosts(list(hosts), ssh_config)[0]
    names = {h.name for h in ledger.usable(resolved, min_nodes, include_bad, say)}
    return [h for h in hosts if h.name in names]


def health_gate(hosts: Sequence[Host], min_nodes: int, *, ssh_config=None,
                accept_new_host_keys: bool = False, python: Optional[str] = None,
                venv: Optional[str] = None, workdirs: Optional[Dict[str, str]] = None,
                timeout: float = 10.0, job: str = "", say=_say) -> List[Host]:
    """Measure ``hosts`` (cluster/health.py) and leave the outliers out, recording each in the
    ledger (reason HEALTH), when at least ``min_nodes`` remain; else keep them, saying so."""
    from fluidctl.cluster import health
    from fluidctl.remote.sshconfig import resolve_hosts
    resolved, targets = resolve_hosts(list(hosts), ssh_config, accept_new_host_keys)
    started = time.monotonic()
    say(f"health gate: measuring {len(hosts)} node(s) (CPU, memory, disk, network, GPUs)")
    report = health.measure(resolved, targets, python=python, venv=venv, workdirs=workdirs,
                            timeout=timeout)
    bad = report.bad()
    if not bad:
        say(f"health gate: {len(hosts)} node(s) measured in {time.monotonic() - started:.1f} "
            "s, no outlier")
        return list(hosts)
    left = [h for h in hosts if h.name not in bad]
    lines = "; ".join(f"{h} ({why})" for h, why in bad.items())
    if len(left) < min_nodes:
        say(f"warning: health gate: {lines}; leaving them out would leave {len(left)} "
            f"node(s), {min_nodes} required: starting with them")
        return list(hosts)
    unmeasured = {n.host for n in report.nodes if n.reason}
    by_name = {h.name: h for h in resolved}
    for host, why in bad.items():       # unreachable: lost; measured and slow: health
        ledger.record(by_name.get(host, host), ledger.LOST if host in unmeasured else ledger.HEALTH, why,
                      job=job)
    say(f"health gate: leaving out {lines}; recorded in the bad-node ledger "
        "(fluidctl cluster ledger list)")
    return left


def choose(hosts: Sequence[Host], *, min_nodes: int, want: Optional[int] = None,
           include_bad: bool = False, gate: bool = False, say=_say, **gate_options
           ) -> List[Host]:
    """The nodes a job runs on: ledgered ones out (unless ``include_bad``), the health gate's
    outliers out (with ``gate``), then the first ``want`` (all without)."""
    chosen = skip_ledgered(hosts, min_nodes, include_bad, say,
                           ssh_config=gate_options.get("ssh_config"))
    if gate:
        chosen = health_gate(chosen, min_nodes, say=say, **gate_options)
    return chosen[:want] if want else chosen
