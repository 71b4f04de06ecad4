"""``--backend local``: every process of the job on this machine."""
from fluidctl.backends import Backend

BACKEND = Backend("local", "fluidctl.backends.local.launcher:LocalLauncher",
                  configure="fluidctl.backends.local.plan:configure",
                  jobs="fluidctl.launch.jobs", hostfile=True)
