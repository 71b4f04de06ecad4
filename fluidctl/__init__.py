"""fluidctl: launch distributed training jobs (collective or parameter-server) on one or many nodes.

Kept import-light on purpose: ``import fluidctl.runtime`` inside every training process goes
through here, so nothing heavy (click, rich, paramiko) may be imported at package level.
"""

__version__ = "0.1.0"
