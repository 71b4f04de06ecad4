"""``--backend mpi``: one ``mpirun`` that starts ``fluidctl worker`` on every slot."""
from fluidctl.backends import Backend

BACKEND = Backend("mpi", "fluidctl.backends.mpi.launcher:MPILauncher",
                  options="fluidctl.backends.mpi.options",
                  configure="fluidctl.backends.mpi.plan:configure",
                  jobs="fluidctl.launch.jobs", title="MPI", hostfile=True)
