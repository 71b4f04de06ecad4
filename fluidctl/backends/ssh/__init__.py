"""``--backend ssh`` and ``--backend fabric``: one node agent per host of --hostfile, over
paramiko or Fabric; elastic jobs (``--nodes MIN:MAX``) too."""
from fluidctl.backends import Backend

BACKEND = Backend("ssh", "fluidctl.backends.ssh.launcher:SSHLauncher",
                  configure="fluidctl.backends.ssh.plan:configure",
                  jobs="fluidctl.launch.jobs", hostfile=True)
FABRIC = Backend("fabric", "fluidctl.backends.ssh.fabric:FabricLauncher",
                 configure="fluidctl.backends.ssh.plan:configure",
                 jobs="fluidctl.launch.jobs", hostfile=True)
