"""``--backend slurm``: one srun step inside an allocation, else an sbatch submission
(docs/slurm.md); its job verbs follow the jobs it submitted."""
from fluidctl.backends import Backend

BACKEND = Backend("slurm", "fluidctl.backends.slurm.launcher:SlurmLauncher",
                  options="fluidctl.backends.slurm.options",
                  configure="fluidctl.backends.slurm.plan:configure",
                  jobs="fluidctl.backends.slurm.jobs", title="Slurm")
