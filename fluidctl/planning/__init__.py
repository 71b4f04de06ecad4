"""Planning: everything that decides what runs where, pure and below every backend.

``hosts`` (hostfiles), ``options`` (--env, --env-file, SCRIPT), ``devices`` (GPUs) and ``plan``
(ranks, roles, endpoints, devices, environment, log paths). The backends import this package;
it imports no backend, nothing of ``fluidctl.launch`` and nothing of the commands.
"""
