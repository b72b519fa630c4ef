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


class ConfigMismatchError(ConfigError):
    """A run folder holds a run of another config than the one given (the keys that differ are in
    the message); `--overwrite` retrains it."""

    def __init__(self, message: str, keys: list[str]):
        super().__init__(message)
        self.keys = keys  # the dotted config keys whose values differ


class DataError(TiedlmError):
    """The data cannot be had or used although the config is right: an offline hub, a full or
    unwritable cache, a damaged cache entry, text that is not UTF-8, a split too small. (A path,
    split, column or tokenizer that does not exist is the config's fault: a ConfigError.)"""

    exit_code = 1


class RunError(TiedlmError):
    """A run folder conflicts, is locked, corrupt, or from a newer tiedlm."""

    exit_code = 1


class DamagedRunError(RunError):
    """A run folder's file is damaged (a checkpoint that fails its manifest, a report or config that
    does not parse). The fix depends on the command: `train` can start afresh with --overwrite, a
    command that only reads the run cannot. The message is train's; `for_reader` is the other."""

    def __init__(self, problem: str, fix: str = "restore it, or use --overwrite to start afresh",
                 reader_fix: str = "restore it, or retrain the run"):
        super().__init__(f"{problem} — {fix}")
        self.problem, self.reader_fix = problem, reader_fix

    def for_reader(self) -> str:
        """The message for a command that reads runs and has no --overwrite of that meaning."""
        return f"{self.problem} — {self.reader_fix}"


class NotARunError(RunError):
    """A path given as a run is not one the command can use: missing, not a folder, not a tiedlm
    run, without a checkpoint, naming a checkpoint the run does not have, or without the kept best
    weights that --best asks for. The user chose the path, so it exits 2 like every other wrong
    argument."""

    exit_code = 2


class DivergedError(TiedlmError):
    """Training produced a non-finite loss or gradient norm."""

    exit_code = 1


class Interrupted(TiedlmError):
    """SIGINT (exit 130) or SIGTERM (exit 143) stopped a run after a checkpoint was written."""

    exit_code = 130
