"""The node agent's line protocol, both ends: the launcher (``backends/ssh.py``) and the agent
on each node (``node/agent.py``). One line each way; an agent line is MARK, a tag, "|", text.

Its own module, standard library only, so the agent can answer its first line (the probe)
before it imports the supervisor, the planner and the diagnostics it needs later: the launcher
plans while they load.
"""

MARK = "@@fluidctl "          # every agent line starts with it; the rest is "<tag>|<text>"
PROBE_TAG = "probe"
FAILURE_TAG = "failure"
SAY_TAG = "say"
BEAT_TAG = "beat"           # "beat|<collectives completed by this node's ranks>"
DOCTOR_TAG = "doctor"       # the answer to a {"doctor": ...} line: this node's problems
STACKS_TAG = "stacks"       # the answer to a "dump" line on stdin: this node's ranks' stacks
ENDS_TAG = "ends"           # the last record: every process's final state on this node
DUMP_COMMAND = "dump"       # a line the launcher writes to the agent's stdin
CR_MARK = "\x1f"            # a streamed line that ended with a lone \r (a progress bar)
AGENT_MODULE = "fluidctl.node.agent"
DOCTOR_CONNECT_TIMEOUT = 5.0  # seconds a node gives the master port in the rendezvous check


def tag_for(role: str, rank: int) -> str:
    return f"{role} {rank}"


def parse_line(line: str):
    """(tag, text) for an agent line, else None (an ordinary line, e.g. a Python traceback)."""
    if not line.startswith(MARK):
        return None
    tag, sep, text = line[len(MARK):].partition("|")
    return (tag, text) if sep else None
