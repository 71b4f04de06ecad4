"""The jobs ``fluidctl train --backend slurm`` submitted from this machine: what ``fluidctl job``
lists, reports, follows and cancels (``submitted.py``), without click."""
