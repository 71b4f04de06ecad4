"""Parameter-server mode: ``server`` (the pserver process), ``client`` (``PServerOptimizer``
and sparse tables for trainers), ``placement`` (which pserver holds which block), ``shard``
(a pserver's state and sync barrier), ``checkpoint`` (its shard on disk), ``protocol`` (the
requests). See docs/pserver.md."""

# upper bounds of `pserver start`'s counts (here, light, for the CLI and the server alike): a
# typo such as --trainers 1e20 is refused in one line instead of a server that waits for ever
MAX_TRAINERS = 1 << 20
MAX_FRAME_MB = 1 << 20                  # 1 TiB
