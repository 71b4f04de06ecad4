"""MPIJob ``kubeflow.org/v2beta1``, mpi-operator v0.8's (the default ``--kind mpijob``).

The Launcher runs the plan's mpirun (every rank is ``fluidctl worker``, which writes the contract
from OMPI_*, as under ``--backend mpi``) over the operator's hostfile ``/etc/mpi/hostfile``; it
reaches the Workers over SSH, with the key pair the operator mounts at ``sshAuthMountPath``. So
each Worker runs ``/usr/sbin/sshd -De``: the image needs OpenSSH's server and client, a host key,
and ``StrictHostKeyChecking no`` for the Workers' names (docs/kubernetes.md). The Launcher is
created once every Worker is ready (sshd listening). A failed rank ends mpirun, so the job
restarts as a whole: the Launcher's Job starts mpirun again (runPolicy.backoffLimit).
"""
from __future__ import annotations

from typing import List

from fluidctl.backends.k8s import plan as kplan
from fluidctl.planning.plan import Plan

SSH_DIR = "/root/.ssh"              # the images run as root (mpirun --allow-run-as-root)
SSHD = ["/usr/sbin/sshd", "-De"]


def mpijob(spec, plan: Plan, meta: dict, launcher: dict, worker: dict) -> dict:
    """The MPIJob of ``plan``, its Launcher's and Workers' pod templates made by
    ``render.pod_template`` (mpirun's command; ``SSHD``)."""
    return {"apiVersion": kplan.MPI_V2, "kind": "MPIJob", "metadata": meta,
            "spec": {"slotsPerWorker": plan.job.nodes[0].nproc,
                     "sshAuthMountPath": SSH_DIR,
                     "mpiImplementation": "OpenMPI",
                     "launcherCreationPolicy": "WaitForWorkersReady",
                     "runPolicy": {"backoffLimit": spec.max_restarts,
                                   "cleanPodPolicy": "Running"},
                     "mpiReplicaSpecs": {
                         "Launcher": {"replicas": 1, "restartPolicy": "OnFailure",
                                      "template": launcher},
                         "Worker": {"replicas": len(plan.job.nodes),
                                    "restartPolicy": "OnFailure", "template": worker}}}}


def worker_names(name: str, namespace: str, workers: int) -> List[str]:
    """The hostfile's names, as mpi-operator v0.8 writes them."""
    return [f"{name}-worker-{i}.{name}.{namespace}.svc" for i in range(workers)]
