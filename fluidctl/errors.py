"""One exception type for everything a user can cause.

The CLI prints it as one line, ``error: <what> (<how to fix>)``, and exits with its code; no
traceback. Exit 2 is a usage error (nothing was started), 1 a failed job.
"""


class FluidctlError(Exception):
    def __init__(self, message: str, hint: str = "", exit_code: int = 2):
        super().__init__(message)
        self.message = message
        self.hint = hint
        self.exit_code = exit_code

    def one_line(self) -> str:
        text = f"error: {self.message}"
        if self.hint:
            text += f" ({self.hint})"
        return text.replace("\n", " ")


class UsageError(FluidctlError):
    """Bad input from the command line or a file the user named: exit 2."""
