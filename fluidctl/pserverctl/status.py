"""``fluidctl pserver status``: the pservers started on this machine, from their records."""
from __future__ import annotations

import json

from fluidctl import paths
from fluidctl.pserverctl.records import records


def run(as_json: bool = False) -> None:
    """A table of every record (``as_json``: the records themselves)."""
    found = records()
    if as_json:
        print(json.dumps(found, indent=1), flush=True)
        return
    from fluidctl.console import console
    out = console()
    if not found:
        out.print(f"no pservers (state directory {paths.state_dir()})", markup=False)
        return
    from fluidctl.tables import print_table      # plain columns into a pipe or a file
    from fluidctl.units import human_bytes
    rows = []
    for r in found:
        connected = r.get("trainers_connected") or []
        rows.append((
            str(r.get("endpoint")), str(r["pid"]), r["state"],
            str(r.get("pserver_id", "")), "sync" if r.get("sync", True) else "async",
            f"{len(connected)}/{r.get('trainers', '?')}", str(r.get("params", 0)),
            str(r.get("sparse_rows", 0)), human_bytes(int(r.get("bytes", 0))),
            str(r.get("step", 0)), str(r.get("applied", 0)), str(r.get("checkpoint_dir") or "-")))
    print_table("fluidctl pservers", ("endpoint", "pid", "state", "id", "mode", "trainers",
                                      "params", "rows", "held", "step", "applied",
                                      "checkpoint dir"), rows)
