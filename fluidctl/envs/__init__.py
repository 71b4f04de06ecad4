"""THE environment contract between the launcher and training processes.

Its names are ``fluidctl.envs.names`` (nothing else in the project spells a ``PADDLE_*`` name:
import the constant from there, or from here). The planner writes the contract
(``fluidctl.envs.write``: ``collective_env``, ``pserver_env``), the runtime reads it
(``fluidctl.envs.read``: ``read``), and ``fluidctl worker`` translates OpenMPI's variables
(``from_ompi``) or Slurm's (``fluidctl.envs.slurm``: ``from_slurm``) into it. This package holds
them all under one name: ``from fluidctl import envs; envs.RANK_IN_NODE, envs.read()``.

The names are PaddlePaddle's, so unmodified Paddle scripts run; torch's (RANK, WORLD_SIZE,
MASTER_ADDR, ...) are written beside them, so torch DDP scripts run too.
"""
from fluidctl.envs.names import *  # noqa: F401,F403  (every name of the contract)
from fluidctl.envs.write import (  # noqa: F401
    split_endpoint, threads_per_process, is_mig, device_view, world_device_list, shared_gpu_allowed,
    WorldStrings, world_strings, bounded, endpoints_file_text,
    refuse_shared_gpus, collective_env, pserver_env)
from fluidctl.envs.read import (  # noqa: F401
    MAKE_TOKEN, read_token_file, torch_port_taken, DistEnv, _int, KNOBS, _knob, _default, knob,
    check_knobs, gpu_of_local_rank, read, read_endpoints_file, from_ompi, ssh_server_address,
    strict_collectives)
from fluidctl.envs.slurm import (  # noqa: F401
    SLURM_PORT_LOW, SLURM_PORT_SPAN,
    in_slurm_step, slurm_node_endpoints, expand_nodelist, parse_tasks_per_node, SlurmLayout,
    slurm_layout, slurm_ports,
    slurm_pserver_port, _endpoint_of, slurm_visible_gpus, _refuse_shared_slurm_gpus, from_slurm)
