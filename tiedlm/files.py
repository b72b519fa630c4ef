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
import os
import re
import socket
import uuid
from pathlib import Path
from typing import Any, Callable

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


def atomic_write_json(path: Path, data: Any, indent: int = 2) -> None:
    atomic_write_text(path, json.dumps(data, indent=indent, default=json_default) + "\n")


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


def errno_of(exc: BaseException) -> int | None:
    """The errno behind a failed write, wherever it hides: an OSError in the exception's chain, or
    the text of an exception that wraps one. torch.save reports a full disk as a RuntimeError
    ("unexpected pos"), safetensors as SafetensorError("No space left on device"), the Rust
    tokenizer as "File too large (os error 27)", numpy as "N requested and M written"."""
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
    return None


def describe_write_failure(exc: BaseException) -> tuple[str, bool]:
    """(what went wrong in a few words, whether it is a lack of room: disk, quota or file size)."""
    code = errno_of(exc)
    if code is not None:
        return os.strerror(code), code in NO_ROOM
    return f"{type(exc).__name__}: {first_line(exc)}", False
