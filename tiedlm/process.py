"""The process a run lives in: output that survives its reader going away, SIGINT and SIGTERM
turned into a stop at a step boundary, and the facts recorded about the process (versions,
the git commit, the time)."""

from __future__ import annotations

import os
import platform
import signal
import subprocess
import sys
import threading
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from . import __version__
from .distributed import is_main_process

if TYPE_CHECKING:
    from types import FrameType


class _Stderr:
    """stderr that survives its reader going away (`tiedlm train ... 2>&1 | head -1`): once a write
    fails because the pipe is closed, output is dropped and training carries on, since a progress
    line nobody reads is no reason to lose a run. Progress bars write through it too."""

    closed_pipe = False

    def write(self, text: str) -> int:
        if not self.closed_pipe:
            try:
                sys.stderr.write(text)
            except (BrokenPipeError, ValueError):  # ValueError: the stream was closed
                self.closed_pipe = True
        return len(text)

    def flush(self) -> None:
        if not self.closed_pipe:
            try:
                sys.stderr.flush()
            except (BrokenPipeError, ValueError):
                self.closed_pipe = True

    def isatty(self) -> bool:
        return not self.closed_pipe and sys.stderr.isatty()

    def __getattr__(self, name: str) -> Any:  # encoding, fileno, ... as the real stderr has them
        return getattr(sys.stderr, name)


STDERR = _Stderr()


def log(msg: str) -> None:

    if not is_main_process():  # the ranks of a distributed run other than 0 do not log
        return
    STDERR.write(msg + "\n")
    STDERR.flush()


# ------------------------------------------------------------------------- signals


class Terminated(KeyboardInterrupt):
    """SIGTERM before training started (data preparation): handled exactly like Ctrl-C there,
    unwinding so that nothing half-made is left, but ending with SIGTERM's exit code."""


class StopSignals:
    """SIGINT / SIGTERM set a flag that the loop reads at the next step boundary, where it writes
    a checkpoint and stops. A second signal gets the default action: the process ends at once,
    and the previous checkpoint (written atomically) stays intact.

    Before install() (the lock, the data preparation) there is nothing to save: SIGINT raises
    KeyboardInterrupt as Python does by default, and SIGTERM raises Terminated, so both unwind the
    same way (the lock released, a new run folder removed) instead of SIGTERM killing the process
    on the spot and leaving a folder holding only `.lock`."""

    def __init__(self):
        self.received: int | None = None
        self._old: dict = {}
        self._early: Callable[[int, FrameType | None], Any] | int | None = None

    @staticmethod
    def _terminate(signum, frame):
        raise Terminated()

    def _handler(self, signum, frame):
        self.received = signum
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, signal.SIG_DFL)
        log(f"\n{signal.Signals(signum).name} received: stopping at the end of this step (with train.grad_accum, at the next micro-batch) and writing a checkpoint "
            "(send it again to stop at once)")

    def install(self) -> None:
        """From here on a signal stops the run at the next step boundary (or between the final
        evaluation's splits). Before it (data preparation) Ctrl-C stops at once: nothing to save."""
        if threading.current_thread() is threading.main_thread() and not self._old:
            for sig in (signal.SIGINT, signal.SIGTERM):
                self._old[sig] = signal.signal(sig, self._handler)

    def __enter__(self) -> "StopSignals":
        if threading.current_thread() is threading.main_thread():
            self._early = signal.signal(signal.SIGTERM, self._terminate)
        return self

    def __exit__(self, *exc: Any) -> None:
        for sig, old in self._old.items():
            signal.signal(sig, old)
        if self._early is not None:  # SIGTERM's handler from before __enter__
            signal.signal(signal.SIGTERM, self._early)


# ------------------------------------------------------------------------- a child that ends with its parent

PARENT_ENV = "TIEDLM_JOBS_PARENT"  # the pid of the --jobs process that started this one (parallel.py)
_PR_SET_PDEATHSIG = 1  # prctl(2) option, from <linux/prctl.h>
_WATCH_S = 0.5


def _parent_death_signal(signum: int) -> bool:
    """Ask Linux to send signum to this process when its parent dies; False where it cannot
    (another system, no libc). The kernel sends it when the parent's *thread* that started this
    process ends: parallel.py starts its children from the thread that waits for them."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(_PR_SET_PDEATHSIG, signum, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def alive(pid: int) -> bool:
    """Whether process pid (of this host) is alive; a zombie (dead, not yet reaped) is not."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # another user's process: alive
        return True
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):  # no /proc (not Linux): kill(0) said it exists
        return True


def _watch_parent(parent: int, signum: int) -> None:
    """The portable fallback: poll the parent's pid, and once this process has another parent
    (the first one died, and it was handed to init or a subreaper), send ourselves signum."""

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(_WATCH_S)
        os.kill(os.getpid(), signum)

    threading.Thread(target=watch, name="tiedlm-parent-watch", daemon=True).start()


def die_with_parent(use_prctl: bool = True) -> None:
    """In a process started by `--jobs` (PARENT_ENV holds the starting process's pid): end when that
    process ends, however it ends (kill -9 included), instead of training on as an orphan that holds
    its run's lock. The signal is SIGTERM, as a forwarded Ctrl-C or SIGTERM is: a training run
    writes a checkpoint at its next step boundary and exits 143, so the next run of the command
    continues from there. Outside such a process, nothing happens."""
    value = os.environ.pop(PARENT_ENV, None)  # popped: a process this one starts is not a --jobs child
    if not value or not value.isdigit():
        return
    armed = use_prctl and _parent_death_signal(signal.SIGTERM)
    watched = os.getppid()  # the parent itself, or a launcher it started us through (a shim that forks)
    if watched != int(value) and not alive(int(value)):  # it died before the signal was armed: none will come
        os._exit(143)
    if not armed:
        _watch_parent(watched, signal.SIGTERM)


# ------------------------------------------------------------------------- facts about the process


def versions() -> dict:
    import numpy as np
    import torch

    out = {"tiedlm": __version__, "torch": torch.__version__, "python": platform.python_version(),
           "numpy": np.__version__}
    for mod in ("datasets", "tokenizers"):
        m = sys.modules.get(mod)
        if m is not None:
            out[mod] = getattr(m, "__version__", "?")
    return out


def git_commit() -> str | None:
    """The commit of the repository the experiment is run from (with '-dirty' for local changes)."""
    try:
        sha = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5)
        if sha.returncode != 0:
            return None
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=5)
        return sha.stdout.strip() + ("-dirty" if dirty.stdout.strip() else "")
    except (OSError, subprocess.SubprocessError):
        return None


def now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


