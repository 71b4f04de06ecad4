"""``--backend k8s``: the plan as a Kubernetes job (PyTorchJob, MPIJob, PaddleJob, JobSet or
TrainJob), printed for --dry-run, submitted with --apply (docs/kubernetes.md); its job verbs go
through the API; each pod runs ``python3 -m fluidctl.backends.k8s.pod``."""
from fluidctl.backends import Backend

BACKEND = Backend("k8s", "fluidctl.backends.k8s.launcher:K8sLauncher",
                  options="fluidctl.backends.k8s.options",
                  configure="fluidctl.backends.k8s.plan:configure",
                  jobs="fluidctl.backends.k8s.jobs", title="Kubernetes")
