"""``fluidctl report JOB``: one self-contained HTML page about a job, running or ended, made
from what its launcher already wrote to LOG_DIR: the timeline (launch.log, events.jsonl), each
rank's step time (steptimes.jsonl), the failure or hang report (failure.json, hang-*/), and
the plan (launch.log's first line, endpoints.log).

``locate`` finds the job's log dir, ``facts`` reads it, ``plots`` draws (matplotlib, imported
only here: ``fluidctl`` itself starts without it), ``page`` writes the HTML, ``make`` ties
them together.
"""
