"""Expected failures. Each carries a one-line message that says what is wrong and what to do,
and the exit code the CLI returns for it (2: usage/config, 1: runtime, 130/143: interrupted)."""

from __future__ import annotations


class TiedlmError(Exception):
    """Base class: an expected failure with a one-line, user-facing message."""

    exit_code = 1

    def __init__(self, message: str, exit_code: int | None = None):
        super().__init__(message)
        if exit_code is not None:
            self.exit_code = exit_code


class ConfigError(TiedlmError):
    """A config file, override or command-line value is wrong."""

    exit_code = 2


class DataError(TiedlmError):
    """A dataset, file, split, column or tokenizer cannot be used."""

    exit_code = 1


class RunError(TiedlmError):
    """A run folder conflicts, is locked, corrupt, or from a newer tiedlm."""

    exit_code = 1


class DivergedError(TiedlmError):
    """Training produced a non-finite loss or gradient norm."""

    exit_code = 1


class Interrupted(TiedlmError):
    """SIGINT (exit 130) or SIGTERM (exit 143) stopped a run after a checkpoint was written."""

    exit_code = 130
