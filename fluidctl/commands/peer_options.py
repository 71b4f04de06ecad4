"""Options of the launchers people come from (torchrun, paddle.distributed.launch, mpirun)
that fluidctl does not take: one line saying whose option it is and what fluidctl does instead,
in place of click's "No such option" and a guess by spelling."""
from typing import Optional

_TORCHRUN = "torchrun's"
_PADDLE = "paddle.distributed.launch's"
_MPIRUN = "mpirun's"

# option -> (whose, what to do instead)
_HINTS = {
    "--master-addr": (_TORCHRUN, "fluidctl makes the first node of --hosts/--hostfile the "
                                 "master; drop it and name the nodes, e.g. --hosts node1,node2"),
    "--master-port": (_TORCHRUN, "fluidctl reserves a free port on the first node; drop it, or "
                                 "choose where ports start with --started-port 29500"),
    "--standalone": (_TORCHRUN, "one machine needs nothing more: drop it, e.g. fluidctl train "
                                "--nproc 4 train.py"),
    "--rdzv": (_TORCHRUN, "fluidctl runs the rendezvous itself: drop it; for an elastic job "
                          "give --nodes MIN:MAX"),
    "--devices": (_PADDLE, "use --gpus with the same ids, e.g. --gpus 0,1"),
    "--gpus-per-node": (_PADDLE, "use --gpus N (one process per GPU on every node)"),
    "--ips": (_PADDLE, "name the nodes with --hosts, e.g. --hosts 10.0.0.1,10.0.0.2, or "
                       "--hostfile"),
    "--log_dir": (_PADDLE, "use --log-dir DIR"),
    "-n": (_MPIRUN, "give the processes per node with --nproc N and the nodes with --hosts or "
                    "--hostfile"),
    "--np": (_MPIRUN, "give the processes per node with --nproc N and the nodes with --hosts or "
                      "--hostfile"),
    "-np": (_MPIRUN, "give the processes per node with --nproc N and the nodes with --hosts or "
                     "--hostfile"),
}


def _key(option: str) -> str:
    if option.startswith(("--rdzv-", "--rdzv_")):
        return "--rdzv"
    if option in _HINTS:
        return option
    return option.replace("_", "-") if option.startswith("--master_") else option


def hint(option: str) -> Optional[str]:
    """``"--devices is paddle.distributed.launch's: use --gpus ..."``, or None for an option
    of no launcher we know."""
    found = _HINTS.get(_key(option))
    if found is None:
        return None
    whose, instead = found
    return f"{option} is {whose}: {instead}"
