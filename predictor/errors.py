"""The predictor's error types (the bottom floor: imports nothing).

`SpecError` is a job description value that cannot be accepted (`predictor.spec` re-exports it).
`UsageError` is bad input from the user: `deepres` prints it as one line and exits with code 2.
`extender.cli` re-exports it, so `extender.cli.UsageError is predictor.errors.UsageError`."""

from __future__ import annotations


class UsageError(Exception):
    """Bad input from the user: printed as one line, exit code 2."""


class SpecError(ValueError):
    """A job description value that cannot be accepted; names the key, the value and what is accepted."""

    def __init__(self, key: str, value: object, accepted: str) -> None:
        self.key = key
        self.value = value
        self.accepted = accepted
        super().__init__(f"{key}={value!r} is not valid: expected {accepted}")

    def with_prefix(self, prefix: str) -> SpecError:
        """The same error with the key as the user wrote it (e.g. with `deepres.io/`)."""
        return SpecError(prefix + self.key, self.value, self.accepted)
