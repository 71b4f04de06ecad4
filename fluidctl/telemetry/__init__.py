"""One sink for what happens to a running job: stragglers, hang verdicts, restarts, elastic
worlds, lost nodes and checkpoint commits are each written once, as a typed event
(``fluidctl.telemetry.events``), to the job's ``Sink`` (``fluidctl.telemetry.sink``), whose
handlers put it where it is read: the console, launch.log, the append-only events file
``LOG_DIR/events.jsonl`` (one JSON object a line, for ``fluidctl top``, reports and metrics
exporters, on a running or a finished job), the straggler reports, failure.json's hang.

The shape is torch elastic's (``put_metric`` with pluggable ``MetricHandler``s, and its
agent's events): the code that finds something only emits it; where it goes is the handlers'
business. Only the launcher (and a node agent) import this package: the ranks pay nothing
new, the launcher reads what the diagnostics pages already hold.
"""
from fluidctl.telemetry.events import (CheckpointCommit, Event, Hang, NodeLost, Restart,
                                       Straggler, World, from_record)
from fluidctl.telemetry.sink import (ConsoleLines, EventsFile, LaunchLogLines, Sink, emit,
                                     for_job, install, read_events, using)

__all__ = ["CheckpointCommit", "ConsoleLines", "Event", "EventsFile", "Hang", "LaunchLogLines",
           "NodeLost", "Restart", "Sink", "Straggler", "World", "emit", "for_job",
           "from_record", "install", "read_events", "using"]
