"""Errors that reach the user: one line naming the problem, and a hint saying what to do; the
exit codes (under `--json` an error is also `{"error": message, "hint": hint, "exit": code}`
on stdout: `infercc.cli.app.json_error`)."""

from __future__ import annotations

EXIT_OK = 0
EXIT_FAILED = 1  # infercc failed: a model it built does not validate, or a bug
EXIT_VALIDATION_FAILED = EXIT_FAILED
EXIT_BAD_INPUT = 2
EXIT_INTERRUPTED = 130  # Ctrl-C, as a shell reports it (128 + SIGINT)


class InferccError(Exception):
    """A problem with the user's input or environment. The CLI prints it on one line, exit 2."""

    exit_code = EXIT_BAD_INPUT

    def __init__(self, message: str, hint: str | None = None):
        super().__init__(message)
        self.message = message
        self.hint = hint

    def __str__(self) -> str:
        return f"{self.message} ({self.hint})" if self.hint else self.message


class InternalError(InferccError):
    """infercc failed on an input it accepted: a bug in infercc, not in the user's model or
    samples (exit 1, like a model infercc built that does not validate)."""

    exit_code = EXIT_FAILED


class PassError(InternalError):
    """A pass failed; the message names the pass. This is a bug in infercc, not in the model
    (exit 1); a model that lacks what a pass requires (`requires=`) is exit 2 (`bad_input`)."""

    def __init__(self, message: str, hint: str | None = None, bad_input: bool = False):
        super().__init__(message, hint)
        if bad_input:
            self.exit_code = EXIT_BAD_INPUT


class ValidationError(InferccError):
    """The optimized model's outputs differ from the original's beyond tolerance."""

    exit_code = EXIT_VALIDATION_FAILED
