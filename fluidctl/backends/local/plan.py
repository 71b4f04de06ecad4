"""``--backend local``'s piece of the plan: its meaning of the shared ``--nodes`` (the job runs
on this one machine, so a count above 1 is a mistake said in one line; planning/elastic.py
``host_nodes``)."""
from __future__ import annotations

import dataclasses


def configure(config, values: dict):
    """``config`` with what its --nodes means (``config.backend_options``)."""
    from fluidctl.planning.elastic import host_nodes
    nodes = host_nodes(values.pop("nodes", None), len(config.hosts), config.mode)
    return dataclasses.replace(config, backend_options=nodes)
