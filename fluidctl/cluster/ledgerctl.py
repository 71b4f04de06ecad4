"""``fluidctl cluster ledger list | clear [HOST]``: the bad-node ledger (cluster/ledger.py)
shown and forgotten."""
from __future__ import annotations

import json
import time
from dataclasses import asdict
from typing import Optional

from fluidctl.cluster import ledger
from fluidctl.errors import UsageError


def _when(stamp: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(stamp))


def list_(as_json: bool = False) -> None:
    """Every active entry: host, why, since, until, detail (a table, or JSON)."""
    found = ledger.entries()
    if as_json:
        print(json.dumps([asdict(e) for e in found], indent=1), flush=True)
        return
    if not found:
        print(f"the bad-node ledger is empty ({ledger.paths.bad_nodes_ledger()})", flush=True)
        return
    from fluidctl.tables import print_table
    print_table(f"bad-node ledger: {len(found)} node(s) left out of later jobs",
                ("host", "why", "since", "left out until", "detail"),
                [[f"{e.host} ({e.node})" if e.node and e.node != e.host else e.host, e.why, _when(e.since), _when(e.until), e.detail] for e in found])


def clear(host: Optional[str] = None) -> None:
    """Forget ``host`` (every node without one)."""
    gone = ledger.clear(host)
    if host and not gone:
        raise UsageError(f"{host} is not in the bad-node ledger",
                         "see fluidctl cluster ledger list")
    print(f"forgot {len(gone)} node(s){': ' + ', '.join(gone) if gone else ''}", flush=True)
