"""Kubernetes: a Plan rendered as PyTorchJob, MPIJob, PaddleJob or JobSet (render.py), and
the API calls that submit and follow them (api.py)."""
