"""Locks on folders: a run's own `.lock` (RunLock), and FolderLock on the folders compare and
analyze write into. Both flock(2), released by the kernel however their process dies."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import time
from pathlib import Path
from typing import Any

from ..errors import ConfigError, RunError
from ..files import describe_write_failure
from ..process import log
from .layout import LOCK


class RunLock:
    """An exclusive lock on a run folder: `.lock`, held with flock(2) and holding the owner's pid
    and host for messages.

    The kernel releases a flock when its process dies, however it dies (kill -9 included), so a
    lock left by a dead process is simply taken over; the pid in the file is only information.
    (flock is not reliable on some network file systems; there, do not share a run folder
    between hosts.)"""

    def __init__(self, run_dir: Path):
        self.path = Path(run_dir) / LOCK
        self.fd: int | None = None
        self.took_over: dict | None = None  # the dead owner whose lock was taken over, if any

    def acquire(self) -> None:
        busy, owner = self.try_acquire()
        if busy:
            raise RunError(f"run folder {self.path.parent} is in use by {_who(owner)} — wait for it to "
                           "finish or stop it, then start again")

    def try_acquire(self) -> tuple[bool, dict | None]:
        """(False, None) with the lock taken, or (True, the owner recorded, if any) when another
        process holds it."""
        import fcntl

        while True:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                owner = _read_owner(fd)
                os.close(fd)
                return True, owner
            # The file may have been unlinked by its previous owner between our open and flock:
            # then we hold a lock on a dead inode and must try again on the new file.
            try:
                same = os.stat(self.path).st_ino == os.fstat(fd).st_ino
            except FileNotFoundError:
                same = False
            if not same:
                os.close(fd)
                continue
            self.took_over = _read_owner(fd)  # an owner recorded here died without releasing
            os.ftruncate(fd, 0)
            os.pwrite(fd, json.dumps({"pid": os.getpid(), "host": socket.gethostname()}).encode(), 0)
            os.fsync(fd)
            self.fd = fd
            return False, None

    def release(self) -> None:
        if self.fd is not None:
            with contextlib.suppress(OSError):
                os.unlink(self.path)  # unlink while still holding the lock, then let go
            os.close(self.fd)
            self.fd = None

    def __enter__(self) -> "RunLock":
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.acquire()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.release()


def _who(owner: dict | None) -> str:
    who = f"process {owner.get('pid')}" if owner else "another process"
    if owner and owner.get("host") not in (None, socket.gethostname()):
        who += f" on host {owner.get('host')}"
    return who


OUTPUT_LOCK = ".tiedlm-output.lock"  # FolderLock's file, beside the outputs it guards
_WAIT_S = 0.25
_held_folders: set[str] = set()  # the folders this process holds a FolderLock on


class FolderLock(RunLock):
    """An exclusive lock on a folder that compare or analyze writes its outputs into, so that two
    commands writing there at once take turns instead of mixing their files (a comparison.md of one
    set of runs beside the comparison.json of another). The same flock(2) as RunLock, on
    OUTPUT_LOCK, which is not the run's own `.lock`: an analysis is written into a run folder while
    the run may still be training.

    Taking it waits while another process holds it, saying once on stderr who holds it. It is taken
    again freely by the process that holds it (compare --config holds its comparison folder while
    training and writing, and may analyse into a folder it holds). Folders it had to create are
    removed on release when they are still empty (a refusal leaves no empty --out behind)."""

    def __init__(self, folder: Path, what: str = "a tiedlm compare or analyze writing there"):
        super().__init__(folder)
        self.path = Path(folder) / OUTPUT_LOCK
        self.what = what
        self._key = os.path.realpath(folder)
        self._created: list[Path] = []
        self._nested = False

    def _make_folder(self) -> None:
        missing = []
        for d in [self.path.parent, *self.path.parent.parents]:
            if d.exists():
                break
            missing.append(d)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._created = missing or self._created  # innermost first, as they are removed

    def acquire(self) -> None:
        if self._key in _held_folders:
            self._nested = True
            return
        told = False
        while True:
            try:
                self._make_folder()  # again each time: a previous owner removes a folder it created
                busy, owner = self.try_acquire()
            except FileNotFoundError:  # removed between the mkdir and the open
                continue
            except (FileExistsError, NotADirectoryError):
                raise ConfigError(f"{self.path.parent} cannot be a folder: it or a folder above it is a file — "
                                  "move the file away, or write somewhere else") from None
            except OSError as exc:
                why, _ = describe_write_failure(exc)
                raise RunError(f"cannot write into {self.path.parent} ({why}) — check the path and its "
                               "permissions") from None
            if not busy:
                _held_folders.add(self._key)
                return
            if not told:
                log(f"{self.path.parent} is in use by {_who(owner)} ({self.what}) — waiting for it to finish "
                    "(Ctrl-C to stop waiting)")
                told = True
            time.sleep(_WAIT_S)

    def release(self) -> None:
        if self._nested:
            self._nested = False
            return
        if self.fd is None:
            return
        _held_folders.discard(self._key)
        super().release()
        for d in self._created:  # only while empty: another writer may have started meanwhile
            try:
                d.rmdir()
            except OSError:
                break
        self._created = []

    def __enter__(self) -> "FolderLock":
        self.acquire()
        return self


def _read_owner(fd: int) -> dict | None:
    try:
        data = json.loads(os.pread(fd, 4096, 0).decode() or "null")
    except (OSError, ValueError, UnicodeDecodeError):
        return None
    return data if isinstance(data, dict) and "pid" in data else None
