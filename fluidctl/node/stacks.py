"""The stacks of this node's ranks, taken on the node: what ``--hang-timeout`` and ``fluidctl
dump`` run on every node of a Slurm or mpirun job (an overlapping srun step, one task per node;
for mpirun, here and over ssh on each node), since the launcher cannot reach processes on
other nodes.

Each rank's ``fluidctl worker`` wrote DIAG_DIR/rank.N (``<node> <pid>``; DIAG_DIR is in the
shared LOG_DIR). This takes the stacks of the ranks on this node as the launcher does its own
(py-spy, else the faulthandler signal: ``diagnose.take_stacks``), signalling only those
processes -- not ``scancel --signal``, which would also reach their children (a data loader's
workers die of SIGUSR2) -- and writes DIAG_DIR/stacks.<node>.json for the launcher to merge.

    python -m fluidctl.node.stacks DIAG_DIR [--unless-node NAME]

``--unless-node``: do nothing where this node's name is NAME (the mpi backend's taker reached
over ssh, on a node whose ranks the launcher's own taker answers for).
"""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import List, Optional


def main(argv: Optional[List[str]] = None) -> int:
    from fluidctl.diagnostics.watch import StackDump, Target, take_stacks
    from fluidctl.paths import DiagDir, write_atomic
    args = sys.argv[1:] if argv is None else argv
    unless = None
    if len(args) == 3 and args[1] == "--unless-node":
        args, unless = args[:1], args[2]
    if len(args) != 1:
        print("usage: python -m fluidctl.node.stacks DIAG_DIR [--unless-node NAME]",
              file=sys.stderr)
        return 2
    diag = DiagDir(Path(args[0]))
    node = DiagDir.this_node(os.environ)
    if node == unless:
        return 0
    targets = [Target(rank, pid, node, f"trainer {rank}")
               for rank, (where, pid) in sorted(diag.ranks().items()) if where == node]
    dump = take_stacks(targets, diag) if targets else StackDump()
    write_atomic(diag.node_stacks(node), json.dumps(dump.to_json()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
