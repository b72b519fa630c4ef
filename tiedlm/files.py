"""Writing files so that a kill, a full disk or a file-size limit never leaves half a file, and
says what went wrong in one line. Every file tiedlm writes (run folders, checkpoints, the
comparison, the token cache) is written through here.

Every write goes to a temporary name beside its target (`.NAME.HOST-PID-RAND.tmp`), is fsynced,
and is renamed into place: a reader sees the old file or the new one, never half of one. A failed
write removes its temporary file, so a full disk does not keep holding the space. The host and
pid in the name let a cleaner tell a file a live process is writing from one a killed process
left (a pid means something only on the host that wrote it).
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import math
import os
import re
import socket
import tempfile
import uuid
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator

from .errors import ConfigError, RunError

HOST = re.sub(r"[^A-Za-z0-9.]", "_", socket.gethostname())[:64] or "host"
NO_ROOM = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)  # full disk, quota, file-size limit (ulimit -f)


def _read_umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


_UMASK = _read_umask()


def tmp_tag() -> str:
    """host-pid-random: unique to this writer, and enough to tell later whether it is alive."""
    return f"{HOST}-{os.getpid()}-{uuid.uuid4().hex[:8]}"


def fsync_dir(path: Path) -> None:
    """Make a rename in `path` durable (best effort: some file systems refuse a directory fsync)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def replace_atomically(path: Path, write: Callable[[Path], Any]) -> None:
    """write(tmp), fsync it, then rename tmp onto path; a failed write removes tmp."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{tmp_tag()}.tmp")
    try:
        write(tmp)
        os.chmod(tmp, 0o666 & ~_UMASK)  # files are for everyone who may read the folder, as open() makes them
        with open(tmp, "rb") as f:
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise
    fsync_dir(path.parent)


def atomic_write_bytes(path: Path, data: bytes) -> None:
    replace_atomically(path, lambda tmp: tmp.write_bytes(data))


def atomic_write_text(path: Path, text: str) -> None:
    atomic_write_bytes(path, text.encode("utf-8"))


def json_default(obj: Any) -> Any:
    """JSON for numpy / torch scalars and paths."""
    if hasattr(obj, "item"):
        return obj.item()
    if isinstance(obj, Path):
        return str(obj)
    raise TypeError(f"not JSON serialisable: {type(obj).__name__}")


def strict_json(obj: Any) -> Any:
    """obj with every non-finite float (a perplexity that overflows to inf, the nan loss of a split
    too short to predict a token) as None, and numpy / torch scalars as Python numbers, so that
    json.dumps(..., allow_nan=False) writes strict JSON (null), never NaN or Infinity, which JSON
    parsers refuse."""
    if isinstance(obj, dict):
        return {k: strict_json(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [strict_json(v) for v in obj]
    if isinstance(obj, float):
        return float(obj) if math.isfinite(obj) else None
    if not isinstance(obj, (str, bytes, int)) and hasattr(obj, "item") and getattr(obj, "ndim", 0) == 0:
        return strict_json(obj.item())  # a numpy or torch scalar
    return obj


def json_text(data: Any, indent: int | None = None) -> str:
    """Strict JSON for data (strict_json's nulls; paths as strings): what every JSON file of
    tiedlm's holds."""
    return json.dumps(strict_json(data), indent=indent, default=json_default, allow_nan=False)


def atomic_write_json(path: Path, data: Any, indent: int = 2) -> None:
    atomic_write_text(path, json_text(data, indent) + "\n")


def read_json(path: Path) -> Any:
    """The JSON in path, or None when it is missing or unreadable."""
    try:
        return json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError, UnicodeDecodeError):
        return None


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


# ------------------------------------------------------------------------- why a write failed


def exception_chain(exc: BaseException) -> list[BaseException]:
    """exc and the exceptions it was raised from or while handling, outermost first."""
    chain: list[BaseException] = []
    e: BaseException | None = exc
    while e is not None and e not in chain:
        chain.append(e)
        e = e.__cause__ or e.__context__
    return chain


def first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


SHORT_WRITE = ("unexpected pos", "failed writing file")  # torch.save's words for a write that fell short
LOW_ROOM = 1 << 20  # bytes free below which a short write is taken for a full disk


def free_bytes(where: Path | str) -> int | None:
    """Bytes free to an unprivileged writer on the disk holding `where` (its nearest existing
    folder), or None when that cannot be told."""
    path = Path(where)
    while not path.exists() and path != path.parent:
        path = path.parent
    try:
        st = os.statvfs(path)
    except OSError:
        return None
    return st.f_bavail * st.f_frsize


def errno_of(exc: BaseException, where: Path | str | None = None) -> int | None:
    """The errno behind a failed write, wherever it hides: an OSError in the exception's chain, or
    the text of an exception that wraps one. safetensors reports a full disk as
    SafetensorError("No space left on device"), the Rust tokenizer as "File too large (os error
    27)", numpy as "N requested and M written". torch.save says only that its write fell short
    ("unexpected pos"), with no errno: given the path written (`where`), a disk with less than
    LOW_ROOM left is then taken as full (ENOSPC)."""
    chain = exception_chain(exc)
    for e in chain:
        if isinstance(e, OSError) and e.errno:
            return e.errno
    for e in chain:
        text = str(e)
        if m := re.search(r"os error (\d+)", text):
            return int(m.group(1))
        for code in NO_ROOM:
            if os.strerror(code) in text:
                return code
    if where is not None and any(w in str(e) for e in chain for w in SHORT_WRITE):
        free = free_bytes(where)
        if free is not None and free < LOW_ROOM:
            return errno.ENOSPC
    return None


def os_error_line(exc: OSError) -> str:
    """An OSError that no tiedlm check foresaw, as its one line: what and where, and where to look."""
    where = f" ({exc.filename})" if getattr(exc, "filename", None) else ""
    return f"{exc.strerror or exc}{where} — check the path, its permissions and the free disk space"


def check_writable(folder: Path) -> None:
    """A RunError (exit 1) unless files can be created in folder (made if missing): a read-only
    disk or a folder that is a file, said once before any run is trained into it."""
    try:
        Path(folder).mkdir(parents=True, exist_ok=True)
        fd, probe = tempfile.mkstemp(dir=folder, prefix=".tiedlm-probe-")
        os.close(fd)
        os.unlink(probe)
    except OSError as exc:
        raise RunError(f"cannot write into {folder} ({exc.strerror or exc}) — check the path and its permissions, "
                       "or write the runs somewhere else") from None


def describe_write_failure(exc: BaseException, where: Path | str | None = None) -> tuple[str, bool]:
    """(what went wrong in a few words, whether it is a lack of room: disk, quota or file size);
    `where`, the path written, lets a short write of torch's be told as a full disk (errno_of)."""
    code = errno_of(exc, where)
    if code is not None:
        return os.strerror(code), code in NO_ROOM
    return f"{type(exc).__name__}: {first_line(exc)}", False


# ------------------------------------------------------------------------- files tiedlm wrote among others'
#
# analyze and compare write files of fixed names into folders that may hold other people's files
# (an --out folder, a run folder). Each such folder gets a record, WRITTEN, of the files tiedlm
# wrote there and each one's SHA-256: a file is replaced silently only while it is what tiedlm
# wrote (re-running the command is the normal use); any other file of the same name, or one
# changed since, is refused unless the command's overwrite option says so. Before writing, the
# names about to be written are recorded as in progress (no hash), so that a kill between a
# write and the record still leaves them known as tiedlm's.

WRITTEN = ".tiedlm-written.json"
WRITTEN_LOCK = ".tiedlm-written.lock"  # held while the record is read and rewritten (_record_lock)


def _record(folder: Path) -> dict[str, str | None] | None:
    """name -> SHA-256 (None: being written) of what tiedlm wrote in folder; None with no record."""
    data = read_json(Path(folder) / WRITTEN)
    if not isinstance(data, dict) or not isinstance(data.get("files"), dict):
        return None
    return {k: v for k, v in data["files"].items() if isinstance(k, str) and (v is None or isinstance(v, str))}


def _write_record(folder: Path, record: dict[str, str | None]) -> None:
    atomic_write_json(Path(folder) / WRITTEN, {"format": 1, "files": dict(sorted(record.items()))}, indent=1)


def _is_plain_file(path: Path) -> bool:
    return path.is_file() and not path.is_symlink()


def _ours(path: Path, record: dict[str, str | None] | None) -> bool:
    """Whether path is a file tiedlm wrote there and nobody changed since: in the folder's record
    with its content (or as being written)."""
    if not _is_plain_file(path):  # a folder or a link is never one of tiedlm's files
        return False
    if record is None or path.name not in record:
        return False
    return record[path.name] is None or sha256_file(path) == record[path.name]


def written_here(folder: Path, name: str) -> bool:
    """Whether folder's record says tiedlm wrote `name` there (whatever has become of it since)."""
    return name in (_record(folder) or {})


def foreign_files(folder: Path, names: Iterable[str]) -> list[Path]:
    """The files among folder/names that exist and that tiedlm did not write there (_ours)."""
    folder = Path(folder)
    record = _record(folder)
    return [folder / n for n in names if os.path.lexists(folder / n) and not _ours(folder / n, record)]


def check_foreign(folder: Path, names: Iterable[str], option: str, overwrite: bool = False) -> None:
    """A ConfigError (exit 2) naming the first file among folder/names that tiedlm did not write
    and the option that replaces it, unless `overwrite`; nothing is written either way."""
    if overwrite:
        return
    found = foreign_files(folder, names)
    if found:
        more = f" (and {len(found) - 1} more of the files it would write)" if len(found) > 1 else ""
        it = "them" if more else "it"
        raise ConfigError(f"{found[0]}{more} was not written by tiedlm, or was changed since — move {it} away, or "
                          f"use {option} to replace {it}")


@contextlib.contextmanager
def _record_lock(folder: Path) -> Iterator[None]:
    """An exclusive flock(2) on folder/WRITTEN_LOCK around a read-modify-write of the record, so
    that two commands writing into one folder at once (two analyses of runs into one --out) do not
    lose each other's entries. The lock file stays: removing it would let a third process lock a
    new file while the second still holds the old one."""
    import fcntl

    fd = os.open(Path(folder) / WRITTEN_LOCK, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing releases the lock


def _settle(folder: Path, names: list[str]) -> None:
    """The record of names after writing them: each file that is there with its SHA-256 (whatever
    the block managed to write is tiedlm's), each name with no file dropped (never written, or
    removed), so that no name stays recorded as being written."""
    with _record_lock(folder):
        record = _record(folder) or {}  # as it is now: another writer may have added to it
        for n in names:
            if _is_plain_file(folder / n):
                record[n] = sha256_file(folder / n)
            else:
                record.pop(n, None)
        _write_record(folder, record)


@contextlib.contextmanager
def recording(folder: Path, names: Iterable[str], option: str, overwrite: bool = False) -> Iterator[None]:
    """Write folder/names in the block, recorded as tiedlm's. First check_foreign (nothing is
    written if it refuses), then record the names as being written, then, after the block (also
    when it fails), with the SHA-256 of what they hold, and without those it left unwritten. Only
    a process killed inside the block leaves names recorded as being written (their files, if
    any, are then tiedlm's)."""
    folder = Path(folder)
    names = list(dict.fromkeys(names))
    check_foreign(folder, names, option, overwrite)
    folder.mkdir(parents=True, exist_ok=True)
    with _record_lock(folder):
        record = _record(folder) or {}
        _write_record(folder, {**record, **{n: None for n in names}})
    failed = True
    try:
        yield
        failed = False
    finally:
        try:
            _settle(folder, names)
        except OSError:
            if not failed:  # a failure of the block itself is the one to report
                raise
