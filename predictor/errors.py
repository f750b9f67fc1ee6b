"""Errors shared by the predictor's command-line paths (the bottom floor: imports nothing).

`UsageError` is bad input from the user: `deepres` prints it as one line and exits with code 2.
`extender.cli` re-exports it, so `extender.cli.UsageError is predictor.errors.UsageError`."""
from __future__ import annotations


class UsageError(Exception):
    """Bad input from the user: printed as one line, exit code 2."""
