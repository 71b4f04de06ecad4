"""``--backend k8s``: the job as a PyTorchJob, MPIJob, PaddleJob, JobSet or TrainJob
(docs/kubernetes.md).

``prepare`` plans as every backend does (``make_plan``, or ``plan_mpi`` for an MPIJob) with one
node per pod, addressed by the name the operator gives that pod (``plan.py``); ``render.py``
turns the plan into the objects. ``--dry-run`` prints them as YAML (and ``--dry-run --json``
the plan); ``--apply`` submits them through the ``kubernetes`` client (``api.py``) and
returns: the cluster runs the job, ``fluidctl job`` follows it (``jobs.py``).
"""
from __future__ import annotations

import os
import sys
from typing import List

from fluidctl import envs
from fluidctl.backends.base import BaseLauncher
from fluidctl.errors import UsageError
from fluidctl.backends.k8s import plan as kplan

MPI_HOSTFILE = "/etc/mpi/hostfile"      # where Kubeflow's MPIJob puts the Workers' names
# what renders each kind: the kubernetes client always, and the kind's own models
NEEDS = {"kubernetes": "kubernetes", "kubeflow.training": "kubeflow-training",
         "kubeflow_trainer_api": "kubeflow-trainer-api"}


def check_libraries(kind: str) -> None:
    """The rendering libraries are the k8s extra's: one line when one is missing."""
    import importlib.util
    wanted = ["kubernetes", "kubeflow_trainer_api" if kind in kplan.JOBSET_LIKE
              else "kubeflow.training"]
    for module in wanted:
        try:
            found = importlib.util.find_spec(module) is not None
        except ImportError:         # kubeflow itself missing
            found = False
        if not found:
            raise UsageError(f"--backend k8s needs the {NEEDS[module]} package",
                             "pip install 'fluidctl[k8s]'")


def gpu_count(gpus) -> int:
    """--gpus as GPUs per pod: a count or ids (each pod sees its own from 0)."""
    if gpus is None:
        return 0
    if gpus == "all":
        raise UsageError("--gpus all is not known before the pods are scheduled",
                         "give a count per pod, e.g. --gpus 4")
    ids = [g for g in gpus.split(",") if g.strip()]
    if "," in gpus or not gpus.strip().isdigit():
        return len(ids)
    return int(gpus)


def k8s_options(config) -> "kplan.K8sOptions":
    """``--backend k8s``'s parsed options (its options.py ``configure``), or none given."""
    return config.backend_options or kplan.K8sOptions()


class K8sLauncher(BaseLauncher):
    name = "k8s"
    dry_run_table = False           # --dry-run prints the YAML alone: pipe it to kubectl
    submits = True                  # the cluster runs the job; submit() instead of start()

    def prepare(self, config):
        from fluidctl.planning import plan as planner
        opts = k8s_options(config)
        opts.check()
        check_libraries(opts.kind)
        gpus = gpu_count(config.gpus)
        if gpus and config.nproc is not None and config.nproc != gpus:
            raise UsageError(f"--nproc {config.nproc} and --gpus {config.gpus} disagree",
                             "give only one of them: --gpus starts one process per GPU")
        if config.hosts:
            raise UsageError("--hostfile/--hosts name machines; Kubernetes places the pods",
                             "drop them and give the pod count: --nodes N")
        nproc = gpus or config.nproc or 1
        name = kplan.job_name(opts.name, config.script)
        script = planner.relative_script(config.script, os.getcwd())
        python = config.python or kplan.POD_PYTHON
        ids = tuple(str(i) for i in range(gpus))
        pods = kplan.trainer_pods(opts.kind, name, opts.nodes, opts.namespace, opts.version)
        nodes = [planner.Node(a, nproc, ids, a.split(".")[0]) for a in pods]
        if config.mode == "pserver" and not config.pserver_endpoints:
            for a in kplan.pserver_pods(opts.kind, name, config.pservers or 1, opts.namespace):
                nodes.append(planner.Node(a, 0, (), a.split(".")[0], pservers=1))
        job = config.job(nodes, script=script, multi_node_logs=True)
        # a pserver pod ends once every trainer has left: a PaddleJob succeeds when its
        # Masters (the pservers) do, and no pserver pod outlives the job
        job.pserver_args = [*job.pserver_args, "--exit-when-done"]
        job.python = python
        job.cores = nproc       # the pods' cores are unknown here: one thread per process
                                # (CPU_NUM, OMP_NUM_THREADS) unless --env sets them
        self.spec_args = dict(kind=opts.kind, name=name, namespace=opts.namespace,
                              image=opts.image, python=python, token=config.token,
                              max_restarts=config.max_restarts, gpus_per_pod=gpus,
                              workdir=config.remote_dir, grace=config.grace_period,
                              api_version=opts.version, restart=opts.restart)
        if opts.kind == kplan.MPIJOB:
            from fluidctl.backends.mpi import launcher as mpi
            rank_argv = mpi.worker_argv(script, config.script_args, python)
            plan = planner.plan_mpi(job, rank_argv, backend=self.name)
            for proc in plan.procs:         # in the pod's working directory, not this one
                proc.env[envs.LOG_DIR] = config.log_dir
            env = plan.procs[0].env
            if gpus:
                for proc in plan.procs:
                    proc.env[envs.GPUS] = str(gpus)
            argv = mpi.command(rank_argv, len(plan.procs), hostfile=MPI_HOSTFILE,
                               env_names=sorted(env), mpirun="mpirun", prefix="",
                               as_root=True, oversubscribe=False,   # images run as root
                               extra=[])
            plan.commands = [planner.LaunchCommand(pods[0].split(".")[0] + "-launcher", argv)]
            self.spec_args["mpirun"] = argv
            return plan
        port = config.started_port or kplan.DEFAULT_PORT
        self.spec_args["port"] = port
        return planner.make_plan(job, kplan.pod_ports(job, port), backend=self.name)

    def objects(self, plan) -> List[dict]:
        from fluidctl.backends.k8s import render
        return render.render(render.Spec(**self.spec_args), plan)

    def describe(self, plan, show_secrets: bool = False) -> str:
        """The objects as YAML, the token masked unless ``show_secrets``."""
        from fluidctl.backends.k8s import render
        objects = self.objects(plan)
        return render.to_yaml(objects if show_secrets else render.masked(objects))

    def submit(self, plan, config) -> int:
        """--apply: create the objects through the API (a kubeconfig is needed); without
        --apply, say how to get the YAML or submit it."""
        if not k8s_options(config).apply:
            raise UsageError("--backend k8s renders the job for a cluster; it does not run "
                             "it here", "add --dry-run to print the YAML, or --apply to "
                             "submit it with your kubeconfig")
        from fluidctl.backends.k8s import api
        created = api.apply(self.objects(plan), k8s_options(config).namespace)
        kind = self.spec_args["kind"]
        print(f"submitted {kind} {k8s_options(config).namespace}/{self.spec_args['name']} "
              f"({', '.join(created)}); follow it: fluidctl job status "
              f"{kind}/{self.spec_args['name']}", file=sys.stderr, flush=True)
        return 0
