"""Standalone parameter servers on this machine, without click: ``fluidctl pserver start``
(``start.py``: foreground, or detached and waited for until it listens), ``status``
(``status.py``) and ``stop`` (``stop.py``), over the pid files, JSON state records and token
files every pserver leaves in the state directory (``records.py``; the paths are
``fluidctl.paths``'s)."""
