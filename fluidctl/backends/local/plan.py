"""``--backend local``'s piece of the plan: its meaning of the shared ``--nodes`` (the job runs
on this one machine, so a count above 1 is a mistake said in one line; planning/elastic.py
``host_nodes``)."""
from __future__ import annotations

import dataclasses


def configure(config, values: dict):
    """``config`` with what its --nodes means (``config.backend_options``)."""
    from fluidctl.planning.elastic import host_nodes
    from fluidctl.planning.nodeopts import refuse_without_nodes
    nodes = host_nodes(values.pop("nodes", None), len(config.hosts), config.mode)
    refuse_without_nodes(config, bool(values.get("include_bad")),
                         "--backend local runs the job on this machine")
    return dataclasses.replace(config, backend_options=nodes)
