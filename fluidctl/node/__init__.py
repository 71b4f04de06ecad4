"""What runs on a node: the node agent (ssh and fabric), the worker entry under mpirun and srun,
the stacks of a node's ranks, the GPU stack probe and the node half of the rendezvous doctor.
Each module here is started with `python -m` or by `fluidctl worker`, far from the launcher."""
