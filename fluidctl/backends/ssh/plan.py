"""``--backend ssh|fabric``'s piece of the plan: ``--nodes N`` uses the first N nodes of
--hostfile that are not in the bad-node ledger (the rest are spares); ``--nodes MIN:MAX`` makes
an elastic job (planning/elastic.py ``host_nodes``)."""
from __future__ import annotations

import dataclasses


def configure(config, values: dict):
    """``config`` with what its --nodes means (``config.backend_options``)."""
    from fluidctl.planning.elastic import host_nodes
    nodes = host_nodes(values.pop("nodes", None), len(config.hosts),
                       config.mode, elastic=True)
    return dataclasses.replace(config, backend_options=nodes)
