"""One exception type for everything a user can cause.

The CLI prints it as one line, ``error: <what> (<how to fix>)``, and exits with its code; no
traceback. Exit 2 is a usage error (nothing was started), 1 a failed job.
"""

# a job that checkpointed on request and stopped (EX_TEMPFAIL): run (requeue) it again to
# resume; the batch script fluidctl submits then runs `scontrol requeue`
REQUEUE_EXIT = 75


class FluidctlError(Exception):
    """``details``: one line each below the summary (several nodes' reasons, one a node)."""
    def __init__(self, message: str, hint: str = "", exit_code: int = 2, details=()):
        super().__init__(message)
        self.message = message
        self.hint = hint
        self.exit_code = exit_code
        self.details = tuple(details)

    def one_line(self) -> str:
        """The summary line, then each detail on its own indented line."""
        text = f"error: {self.message}"
        if self.hint:
            text += f" ({self.hint})"
        return "\n".join([text.replace("\n", " ")] +
                         ["  " + d.replace("\n", " ") for d in self.details])


def first_few(names, most: int = 4) -> str:
    """``names`` joined, the first ``most`` of them and then how many more: a console line
    stays one line on a job of any size."""
    names = list(names)
    return ", ".join(names[:most]) + (f" and {len(names) - most} more"
                                      if len(names) > most else "")


def node_failures(what: str, failures, total: int, hint: str = "", *, exit_code: int = 2,
                  error=None) -> "FluidctlError":
    """The one way any command reports nodes that failed. ``failures`` ((node, why), ...) or
    {node: why}: one node's on one line (``node N <what>: why``); several nodes' as a summary
    line (``N of M node(s) <what>``, the hint) and one line per node below it, never one line
    of every node's reasons."""
    failures = list(failures.items() if isinstance(failures, dict) else failures)
    error = error or FluidctlError
    if len(failures) == 1:
        name, why = failures[0]
        return error(f"node {name} {what}: {why}", hint, exit_code=exit_code)
    return error(f"{len(failures)} of {total} node(s) {what}", hint, exit_code=exit_code,
                 details=[f"node {name}: {why}" for name, why in failures])


class UsageError(FluidctlError):
    """Bad input from the command line or a file the user named: exit 2."""


def check_range(flag: str, value, low, high, hint: str, *, above: bool = False,
                unit: str = ""):
    """The one check of every numeric option: ``value`` is a finite number from ``low`` to
    ``high`` (above ``low`` with ``above``; ``high`` None: no upper bound), else a UsageError
    naming ``flag``. nan and inf are refused everywhere: a timeout of nan or inf waits
    forever, one of nan turns a check off. Here, beside UsageError, so the quick commands
    check numbers without importing planning."""
    import math
    finite = isinstance(value, int) or math.isfinite(value)
    if finite and (value > low if above else value >= low) and (high is None or value <= high):
        return value
    if finite and above and low == 0 and (high is None or value <= high):
        raise UsageError(f"{flag} {_show(value)} is not positive", hint)
    what = f"a number{unit}" if isinstance(value, float) else "a whole number"
    bounds = f"above {_show(low)}" if above else f"from {_show(low)}"
    bounds = f">= {_show(low)}" if high is None and not above else bounds
    if high is not None:
        bounds += f" {'up ' if above else ''}to {_show(high)}"
    raise UsageError(f"{flag} {value} is not {what} {bounds}", hint)


def _show(number) -> str:
    if isinstance(number, float) and number.is_integer():
        return str(int(number))
    return f"{number:g}" if isinstance(number, float) else str(number)
