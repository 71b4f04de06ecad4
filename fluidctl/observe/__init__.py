"""Seeing a running job: ``fluidctl top`` and ``fluidctl train --metrics-port``.

The ranks do nothing new. The launcher already reads every rank's diagnostics page (the
straggler watcher: from its node's directory, the node agents' ``steps`` lines, or the shared
directory under mpirun and Slurm); ``live.Publisher`` keeps step times from those readings
and rewrites ``LOG_DIR/live.json`` once a second. ``snapshot.Reader`` joins that file with
the job's events (``events.jsonl``), failure.json and the last line of each rank's log into
one ``Snapshot``; ``top`` draws it, ``metrics`` serves it to Prometheus at scrape time.
"""
