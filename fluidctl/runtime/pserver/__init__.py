"""Parameter-server mode: ``server`` (the pserver process), ``client`` (``PServerOptimizer``
and sparse tables for trainers), ``placement`` (which pserver holds which block), ``shard``
(a pserver's state and sync barrier), ``checkpoint`` (its shard on disk), ``protocol`` (the
requests). See docs/pserver.md."""
