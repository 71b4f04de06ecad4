"""THE environment contract's names: every variable the launcher writes for a training process,
and every one it reads (OpenMPI's, Slurm's, ssh's). Nothing else in the project spells a
``PADDLE_*`` name: import the constant from here (or from ``fluidctl.envs``, which holds them
all). Strings only: every rank imports this module.
"""

# --- rank and size -------------------------------------------------------------------------
TRAINER_ID = "PADDLE_TRAINER_ID"
GLOBAL_RANK = "PADDLE_GLOBAL_RANK"
TORCH_RANK = "RANK"
TRAINERS_NUM = "PADDLE_TRAINERS_NUM"
NUM_TRAINERS = "PADDLE_NUM_TRAINERS"
GLOBAL_SIZE = "PADDLE_GLOBAL_SIZE"
TORCH_WORLD_SIZE = "WORLD_SIZE"
RANK_IN_NODE = "PADDLE_RANK_IN_NODE"
LOCAL_RANK = "PADDLE_LOCAL_RANK"
TORCH_LOCAL_RANK = "LOCAL_RANK"
LOCAL_SIZE = "PADDLE_LOCAL_SIZE"
TORCH_LOCAL_WORLD_SIZE = "LOCAL_WORLD_SIZE"
NNODES = "PADDLE_NNODES"
# DeepSpeed's launcher names (DeepSpeed reads LOCAL_SIZE to count devices and to enable its CPU
# shared-memory allreduce; CROSS_* are horovod's and DeepSpeed's node rank and node count)
DS_LOCAL_SIZE = "LOCAL_SIZE"
CROSS_RANK = "CROSS_RANK"
CROSS_SIZE = "CROSS_SIZE"
# --- endpoints ------------------------------------------------------------------------------
CURRENT_ENDPOINT = "PADDLE_CURRENT_ENDPOINT"
TRAINER_ENDPOINTS = "PADDLE_TRAINER_ENDPOINTS"
MASTER = "PADDLE_MASTER"
TORCH_MASTER_ADDR = "MASTER_ADDR"
TORCH_MASTER_PORT = "MASTER_PORT"
# --- devices --------------------------------------------------------------------------------
SELECTED_GPUS = "FLAGS_selected_gpus"
CUDA_VISIBLE_DEVICES = "CUDA_VISIBLE_DEVICES"
CUDA_DEVICE_ORDER = "CUDA_DEVICE_ORDER"   # PCI_BUS_ID: CUDA numbers GPUs as nvidia-smi does
LOCAL_DEVICE_IDS = "PADDLE_LOCAL_DEVICE_IDS"
WORLD_DEVICE_IDS = "PADDLE_WORLD_DEVICE_IDS"
DISTRI_BACKEND = "PADDLE_DISTRI_BACKEND"
# --- role -----------------------------------------------------------------------------------
TRAINING_ROLE = "TRAINING_ROLE"
ROLE = "PADDLE_ROLE"
ROLE_TRAINER = "TRAINER"
ROLE_PSERVER = "PSERVER"
# --- threads --------------------------------------------------------------------------------
CPU_NUM = "CPU_NUM"
OMP_NUM_THREADS = "OMP_NUM_THREADS"
PYTHONUNBUFFERED = "PYTHONUNBUFFERED"
# --- supervision ----------------------------------------------------------------------------
RESTART_COUNT = "PADDLE_RESTART_COUNT"
TORCH_RESTART_COUNT = "TORCHELASTIC_RESTART_COUNT"     # torchrun's name for the same count
# --- parameter-server mode ------------------------------------------------------------------
PSERVERS_IP_PORT_LIST = "PADDLE_PSERVERS_IP_PORT_LIST"
PORT = "PADDLE_PORT"
POD_IP = "POD_IP"
INIT_PORT = "PADDLE_INIT_PORT"
INIT_PSERVERS = "PADDLE_INIT_PSERVERS"
INIT_TRAINER_ID = "PADDLE_INIT_TRAINER_ID"
INIT_NUM_GRADIENT_SERVERS = "PADDLE_INIT_NUM_GRADIENT_SERVERS"
INIT_PORTS_NUM = "PADDLE_INIT_PORTS_NUM"
INIT_PORTS_NUM_FOR_SPARSE = "PADDLE_INIT_PORTS_NUM_FOR_SPARSE"
INIT_USE_GPU = "PADDLE_INIT_USE_GPU"
INIT_TRAINER_COUNT = "PADDLE_INIT_TRAINER_COUNT"
PSERVER_ID = "PADDLE_PSERVER_ID"
# --- fluidctl's own -------------------------------------------------------------------------
K8S_NODE_BASE = "FLUIDCTL_K8S_NODE_BASE"  # a Kubernetes pod's first node in the plan (render)
K8S_NODE_INDEX = "FLUIDCTL_K8S_INDEX"     # its index in its replica set (downward API)
K8S_REQUESTS = "FLUIDCTL_K8S_REQUESTS"    # the pod's own annotations file (downward API):
                                          # fluidctl job checkpoint's requests (podspec.py)
K8S_MESSAGE = "FLUIDCTL_K8S_MESSAGE"      # the pod's terminationMessagePath: its hang report
JOB_TOKEN = "FLUIDCTL_JOB_TOKEN"        # per-job secret for HMAC authentication on the wire
# Above ENV_BOUND bytes a job-wide list (PADDLE_TRAINER_ENDPOINTS, PADDLE_WORLD_DEVICE_IDS) is
# left out of every rank's environment (execve refuses one string over 128 KiB, E2BIG), and
# ENDPOINTS_FILE names a file on the rank's node with that node's ranks' endpoints
# ("<rank> <endpoint>" lines), which fluidctl.runtime reads instead
ENV_BOUND = 64 << 10
ENDPOINTS_FILE = "FLUIDCTL_ENDPOINTS_FILE"
# the node agent's Unix socket a rank joins the rendezvous through (runtime/nodejoin.py): set
# where an agent (or the local launcher) starts the node's ranks; without it a rank joins rank
# 0's store itself
NODE_JOIN = "FLUIDCTL_NODE_JOIN"
# set for the node's first task under srun ("2,3": the node's ranks): its runtime.init() serves
# their join on NODE_JOIN, as an agent would
NODE_JOIN_RANKS = "FLUIDCTL_NODE_JOIN_RANKS"
# the token --dry-run prints in place of the real one: a pod given it refuses to start
MASKED_TOKEN = "masked-by-fluidctl-dry-run"
SYNC_MODE = "FLUIDCTL_SYNC_MODE"        # "sync" | "async" (parameter-server mode)
TIMEOUT = "FLUIDCTL_TIMEOUT"            # seconds a collective or rendezvous may wait
LOG_DIR = "FLUIDCTL_LOG_DIR"
GPUS = "FLUIDCTL_GPUS"                  # "all" or a --gpus value: ranks started by mpirun or
                                        # torchrun take the node's GPUs by local rank
VENV = "FLUIDCTL_VENV"                  # the nodes' environment (cluster setup, train, check)
DIAG_DIR = "FLUIDCTL_DIAG_DIR"          # the node's progress counters / stack files (diagnostics/progress.py)
DIAG_WRITE = "FLUIDCTL_DIAG_WRITE"      # "mmap" | "pwrite": how a rank's pages reach DIAG_DIR (diagnostics/pages.py)
STEP_HOOKS = "FLUIDCTL_STEP_HOOKS"      # "0": no straggler marks in torch/Paddle ranks (inject/);
                                        # "backward": torch's backward calls, not its Flight Recorder
STEP_HOOKS_PID = "FLUIDCTL_STEP_HOOKS_PID"  # set by the rank that installed them: its children skip
TORCH_FR_BUFFER_SIZE = "TORCH_FR_BUFFER_SIZE"  # torch's Flight Recorder entries (set unless given)
HANG_TIMEOUT = "FLUIDCTL_HANG_TIMEOUT"  # default of fluidctl train --hang-timeout
PYSPY = "FLUIDCTL_PYSPY"                # py-spy to use for stack dumps; empty: never py-spy
SHM_DIRECT = "FLUIDCTL_SHM_DIRECT"      # "0": never read peers' memory (process_vm_readv); "1": from 4 MiB
SHM_NATIVE = "FLUIDCTL_SHM_NATIVE"      # "0": same-node collectives in Python, not the native module
PURE_WHEEL = "FLUIDCTL_PURE_WHEEL"      # "1" while building: no native module (setup.py)
WORKER_ECHO = "FLUIDCTL_WORKER_ECHO"    # "0": fluidctl worker writes its log only, not stdout
HANDSHAKE_TIMEOUT = "FLUIDCTL_HANDSHAKE_TIMEOUT"  # seconds a new peer has to authenticate (10)
DROP_LOG_INTERVAL = "FLUIDCTL_DROP_LOG_INTERVAL"  # seconds per summary of dropped peers (10)
MAX_FRAME = "FLUIDCTL_MAX_FRAME"        # bytes a wire frame's payload may have (4 GiB)
STRICT_COLLECTIVES = "FLUIDCTL_STRICT_COLLECTIVES"  # "1": agree on every collective's metadata
                                        # in full, not once per signature then a hash (GPU) or
                                        # the ring neighbours' headers (CPU, between nodes)
HEARTBEAT_TIMEOUT = "FLUIDCTL_HEARTBEAT_TIMEOUT"  # seconds without heartbeats before an elastic
                                        # job's node (or its launcher, for the node) is gone (3)
GPU_INFLIGHT = "FLUIDCTL_GPU_INFLIGHT"  # GPU collectives queued before a call waits (64)
# checkpoint requests (runtime/request.py): the file the launcher (or `fluidctl job checkpoint`)
# creates to ask for a checkpoint, and the signal it forwards to the ranks (a name: TERM, USR1)
CHECKPOINT_REQUEST = "FLUIDCTL_CHECKPOINT_REQUEST"
CHECKPOINT_SIGNAL = "FLUIDCTL_CHECKPOINT_SIGNAL"
CHECKPOINT_STATE = "FLUIDCTL_CHECKPOINT_STATE"  # where rank 0 records the last commit
SLURM_RESTART_COUNT = "SLURM_RESTART_COUNT"     # read only: how often Slurm requeued the job
# set by the batch script fluidctl submits: the launcher creates this file when it stopped the
# job on a checkpoint request (exit 75); only then does the script requeue the job
REQUEUE_FILE = "FLUIDCTL_REQUEUE_FILE"

# --- NCCL (read only) -----------------------------------------------------------------------
NCCL_MULTI_RANK_GPU = "NCCL_MULTI_RANK_GPU_ENABLE"  # "1": NCCL >= 2.30 lets ranks share a GPU

# --- OpenMPI (read only) --------------------------------------------------------------------
OMPI_RANK = "OMPI_COMM_WORLD_RANK"
OMPI_SIZE = "OMPI_COMM_WORLD_SIZE"
OMPI_LOCAL_RANK = "OMPI_COMM_WORLD_LOCAL_RANK"
OMPI_LOCAL_SIZE = "OMPI_COMM_WORLD_LOCAL_SIZE"

DEFAULT_TIMEOUT = 300.0


# --- ssh (read only): where mpirun's daemons, and so their ranks, were reached ---------------
SSH_CONNECTION = "SSH_CONNECTION"   # 'client_ip client_port server_ip server_port' (sshd's)


# --- Slurm (read only) ----------------------------------------------------------------------
# Under plain ``srun`` each task knows its place from these; ``from_slurm`` turns them into the
# whole contract (``fluidctl worker`` and ``fluidctl.runtime.init()`` use it; the Slurm backend
# plans with the same ``slurm_layout`` and ``slurm_ports``).
SLURM_JOB_ID = "SLURM_JOB_ID"
SLURM_STEP_ID = "SLURM_STEP_ID"
SLURM_PROCID = "SLURM_PROCID"
SLURM_LOCALID = "SLURM_LOCALID"
SLURM_NODEID = "SLURM_NODEID"
SLURM_NTASKS = "SLURM_NTASKS"
SLURM_STEP_NUM_TASKS = "SLURM_STEP_NUM_TASKS"   # in an srun step's tasks, not in a batch script
SLURM_JOB_NUM_NODES = "SLURM_JOB_NUM_NODES"
SLURM_STEP_NODELIST = "SLURM_STEP_NODELIST"
SLURM_JOB_NODELIST = "SLURM_JOB_NODELIST"
SLURM_STEP_TASKS_PER_NODE = "SLURM_STEP_TASKS_PER_NODE"
SLURM_TASKS_PER_NODE = "SLURM_TASKS_PER_NODE"
SLURM_DISTRIBUTION = "SLURM_DISTRIBUTION"
SLURM_CPUS_ON_NODE = "SLURM_CPUS_ON_NODE"
SLURM_JOB_CPUS_PER_NODE = "SLURM_JOB_CPUS_PER_NODE"   # the allocation's CPUs, '2(x3),1'
SLURM_CPUS_PER_TASK = "SLURM_CPUS_PER_TASK"           # salloc -c: what each srun task takes
SLURM_OVERCOMMIT = "SLURM_OVERCOMMIT"                 # srun --overcommit from the environment
SLURM_RESTART_COUNT = "SLURM_RESTART_COUNT"
SLURMD_NODENAME = "SLURMD_NODENAME"             # the task's node, as Slurm names it
SLURM_STEP_GPUS = "SLURM_STEP_GPUS"     # the step's GPUs on this node (global ids)
SLURM_GPUS_ON_NODE = "SLURM_GPUS_ON_NODE"   # how many GPUs the job has on this node


# what a pserver-mode trainer takes from the collective contract (its place on the node)
NODE_LOCAL_NAMES = (RANK_IN_NODE, LOCAL_RANK, TORCH_LOCAL_RANK, LOCAL_SIZE,
                    TORCH_LOCAL_WORLD_SIZE, NNODES, DS_LOCAL_SIZE, CROSS_RANK, CROSS_SIZE, MASTER,
                    TORCH_MASTER_ADDR, TORCH_MASTER_PORT, SELECTED_GPUS, CUDA_VISIBLE_DEVICES,
                    LOCAL_DEVICE_IDS, WORLD_DEVICE_IDS, CUDA_DEVICE_ORDER)

