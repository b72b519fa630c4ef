"""The token cache under cache_root(): its entries, how they are published, and `tiedlm cache
list/clear`.

    tokenizers/<key>/   a tokenizer and its manifest (which also records how the splits were chosen)
    tokens/<key>/       one split's token ids (tokens.npy, memory-mapped; counts.npy for train)
    datasets/           `datasets`' arrow copies of local files (what tiedlm's loads made is marked)
    hub-revisions.json  the last commit seen of each hub dataset, for offline runs

Every entry is a folder written under a temporary name and renamed into place, so two processes
preparing the same data at once never see a half-written entry; a write that fails (a full disk)
removes the temporary folder and says so in one line. Single files are written with
files.replace_atomically.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import hashlib
import json
import os
import re
import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import numpy as np

from ..errors import DataError, TiedlmError
from ..files import HOST, atomic_write_json, describe_write_failure, errno_of, first_line, read_json, tmp_tag
from .tokenizers import Tokenizer, load_tokenizer

CACHE_FORMAT = 1  # bump when the layout of cache entries changes; old entries are then ignored
HUB_MEMO = "hub-revisions.json"
DIGEST_MEMO = "file-digests.json"  # a data file's content digest, by its path, size, mtime, ctime, inode and device
MANIFEST = "manifest.json"
_KINDS = {"tokenizers": "tokenizer", "tokens": "tokens"}  # cache folder → the kind its manifests name


def cache_root() -> Path:
    """$TIEDLM_CACHE, or ~/.cache/tiedlm."""
    return Path(os.environ.get("TIEDLM_CACHE") or "~/.cache/tiedlm").expanduser()


def key_of(obj: Any) -> str:
    """A cache key: the hash of obj as canonical JSON."""
    blob = json.dumps(obj, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:20]


def write_manifest(folder: Path, manifest: dict) -> None:
    atomic_write_json(folder / MANIFEST, manifest, indent=1)


def save_npy(path: Path, array: np.ndarray) -> None:
    """np.save, except that a failed write keeps its errno: np.save writes through C stdio and
    reports a full disk as "N requested and M written", which says neither why nor what to do."""
    array = np.ascontiguousarray(array)
    with open(path, "wb") as fh:
        np.lib.format.write_array_header_1_0(fh, np.lib.format.header_data_from_array_1_0(array))
        fh.write(array.data)


def _size(path: Path) -> int:
    """Bytes of a file, or of every file in a folder (one removed meanwhile counts 0)."""
    files = [path] if not path.is_dir() or path.is_symlink() else [p for p in path.rglob("*") if p.is_file()]
    total = 0
    for f in files:
        with contextlib.suppress(OSError):
            total += f.lstat().st_size
    return total


# --------------------------------------------------------------------------------------------
# Writing entries


def cache_write_failure(exc: BaseException, where: Path | str, what: str = "the token cache",
                        elsewhere: str = "TIEDLM_CACHE") -> DataError:
    """Any failed write into a cache as one line: what is wrong and what to do. `elsewhere` is the
    variable that moves the cache to another disk."""
    why, no_room = describe_write_failure(exc, where)
    if no_room:
        limit = ", or raise the file-size limit: ulimit -f" if errno_of(exc) == errno.EFBIG else ""
        return DataError(f"{why} while writing {what} ({where}) — free some disk space "
                         f"(or set {elsewhere} to a disk with room{limit}), then run the same command again")
    known = errno_of(exc) is not None
    space = "" if known else ", and the free disk space"
    return DataError(f"cannot write {what} ({where}): {why if known else first_line(exc)} — check the path and its "
                     f"permissions{space} (or set {elsewhere} to a folder you can write), then run the same command "
                     "again")


@contextlib.contextmanager
def _writing(where: Path, cleanup: Path) -> Iterator[None]:
    """Writes into the cache: on any failure (an interrupt too) remove `cleanup`, the half-written
    temporary folder, and turn the error into cache_write_failure's one line."""
    try:
        yield
    except BaseException as exc:
        drop(cleanup)
        if isinstance(exc, Exception) and not isinstance(exc, TiedlmError):
            raise cache_write_failure(exc, where) from exc
        raise


# Temporary names carry host, pid and a random part (files.tmp_tag), so that `cache clear` can
# tell a folder a live process is filling from one a killed process left: the pid means something
# only on the host that wrote it (a cache on a network disk is shared by several machines).
_TMP_TAG = r"(?:(?P<host>[A-Za-z0-9._]+)-)?(?P<pid>\d+)-[0-9a-f]{8}"  # host is absent in older names
_TMP_ENTRY = re.compile(rf"\.tmp-[0-9a-f]{{20}}-{_TMP_TAG}")
_MEMOS = (HUB_MEMO, DIGEST_MEMO)
_MEMO_TMP = re.compile(rf"\.(?:{'|'.join(map(re.escape, _MEMOS))})\.{_TMP_TAG}\.tmp")  # see files.replace_atomically
_STALE_S = 6 * 3600  # a writer touches its files all along: untouched this long, nobody is writing


@contextlib.contextmanager
def _new_entry(kind: str, key: str) -> Iterator[Path]:
    """A fresh temporary folder to fill, renamed to <kind>/<key> when the block ends. Any failure
    removes it and becomes one line (see cache_write_failure): a full disk leaves nothing behind."""
    final = cache_root() / kind / key
    tmp = final.parent / f".tmp-{key}-{tmp_tag()}"
    if not cache_root().exists():  # its first use (rank 0 alone fills it): say where it is, once
        sys.stderr.write(f"the token cache is {cache_root()} (set TIEDLM_CACHE to put it elsewhere; tiedlm cache "
                         "list and tiedlm cache clear show and empty it)\n")
    with _writing(final.parent, cleanup=tmp):
        tmp.mkdir(parents=True)
        yield tmp
        _publish(tmp, final)


def _publish(tmp: Path, final: Path) -> None:
    """Rename a complete entry into place. If another process got there first, keep theirs."""
    try:
        os.replace(tmp, final)
    except OSError:
        if not (final / MANIFEST).exists():
            raise
        shutil.rmtree(tmp, ignore_errors=True)


def drop(folder: Path) -> None:
    """Remove a broken entry so it can be rebuilt (another process may be doing the same)."""
    shutil.rmtree(folder, ignore_errors=True)


def _manifest(kind: str, key: str, manifest: dict) -> dict:
    return {**manifest, "format": CACHE_FORMAT, "kind": kind, "key": key}


def _created() -> dict:
    return {"created": time.strftime("%Y-%m-%dT%H:%M:%S")}


def _read_manifest(folder: Path) -> dict | None:
    """The manifest of an entry of this CACHE_FORMAT, or None."""
    m = read_json(folder / MANIFEST)
    return m if isinstance(m, dict) and m.get("format") == CACHE_FORMAT else None


# --------------------------------------------------------------------------------------------
# The two kinds of entry


def store_tokens(key: str, split: str, tokens: np.ndarray, stats: dict, counts: np.ndarray | None,
                 manifest: dict) -> Path:
    """Publish one split's tokens, its statistics and (for train) the count of each id as tokens/<key>."""
    with _new_entry("tokens", key) as tmp:
        save_npy(tmp / "tokens.npy", tokens)
        if counts is not None:
            save_npy(tmp / "counts.npy", counts)
        write_manifest(tmp, {**_manifest("tokens", key, manifest), "split": split, "n_tokens": int(len(tokens)),
                             "dtype": str(tokens.dtype), **stats, **_created()})
    return cache_root() / "tokens" / key


def read_tokens(key: str) -> tuple[np.ndarray, np.ndarray | None, dict, Path] | None:
    """A cached split: its tokens memory-mapped, its counts, manifest and folder; None if there is
    none (a broken entry is removed)."""
    folder = cache_root() / "tokens" / key
    m = _read_manifest(folder)
    if m is None:
        return None
    try:
        tokens = np.load(folder / "tokens.npy", mmap_mode="r")
        counts = np.load(folder / "counts.npy") if (folder / "counts.npy").exists() else None
    except (OSError, ValueError):
        tokens = None
    if tokens is None or tokens.ndim != 1 or len(tokens) != m["n_tokens"] or str(tokens.dtype) != m["dtype"]:
        drop(folder)
        return None
    return tokens, counts, m, folder


def store_tokenizer(key: str, tok: Tokenizer, manifest: dict) -> tuple[Tokenizer, Path]:
    """Publish a tokenizer as tokenizers/<key>; the tokenizer in place afterwards, and its folder."""
    with _new_entry("tokenizers", key) as tmp:
        tok.save(tmp)
        write_manifest(tmp, {**_manifest("tokenizer", key, manifest), "tokenizer_kind": tok.kind,
                             "vocab_size": tok.vocab_size, **_created()})
    final = cache_root() / "tokenizers" / key
    # Read back what is in place: if another process published first, use its tokenizer so that
    # the token arrays always match the tokenizer stored beside them.
    return load_tokenizer(final), final


def read_tokenizer(key: str) -> tuple[Tokenizer, dict, Path] | None:
    folder = cache_root() / "tokenizers" / key
    m = _read_manifest(folder)
    if m is None:
        return None
    try:
        return load_tokenizer(folder), m, folder
    except (DataError, OSError, KeyError, ValueError):
        drop(folder)
        return None


OVERLAP = "overlap.json"  # in a tokenizer entry: the leak measure of its splits (data.overlap)


def store_overlap(folder: Path, record: dict) -> None:
    """Keep the overlap measure beside the tokenizer it was measured with (a tokenizer entry is
    keyed by the data and its splits), written after the entry when the documents were read for
    other reasons. Best effort: a cache that cannot be written only measures it again next time."""
    with contextlib.suppress(OSError):
        atomic_write_json(Path(folder) / OVERLAP, record, indent=1)


def read_overlap(folder: Path | None) -> dict | None:
    return read_json(Path(folder) / OVERLAP) if folder is not None else None


# --------------------------------------------------------------------------------------------
# What tiedlm's loads made in datasets/
#
# `datasets` keeps arrow copies of local files under cache_root()/"datasets", where tiedlm points
# it: <builder>/<config>/<version>/<hash>/ folders, with lock files beside them. Others may keep
# files in that folder too, so each load marks what it created there (one small file per created
# path, in _MARKS) and `cache clear` removes what is marked and nothing else.

_MARKS = ".tiedlm-made"
_MARK_DEPTH = 4  # builder/config/version/hash: the deepest level a load creates anew


def _listing(folder: Path) -> set[str]:
    """Relative POSIX paths of what is in folder, down to _MARK_DEPTH levels."""
    out: set[str] = set()
    level = [(folder, "")]
    for _ in range(_MARK_DEPTH):
        below = []
        for path, rel in level:
            with contextlib.suppress(OSError):
                for e in os.scandir(path):
                    if rel or e.name != _MARKS:
                        out.add(rel + e.name)
                        if e.is_dir(follow_symlinks=False):
                            below.append((Path(e.path), f"{rel}{e.name}/"))
        level = below
    return out


def _mark_name(rel: str) -> str:
    return hashlib.sha256(rel.encode()).hexdigest()[:20]


def _marked(folder: Path) -> set[str]:
    """The marked paths of folder ("." for the folder itself). A marker is named by the hash of the
    path it holds, so a torn one (a process killed while writing it) marks nothing."""
    out = set()
    for f in (folder / _MARKS).glob("*"):
        with contextlib.suppress(OSError, UnicodeDecodeError):
            rel = f.read_text(encoding="utf-8")
            if _mark_name(rel) == f.name:
                out.add(rel)
    return out


@contextlib.contextmanager
def marking(folder: Path) -> Iterator[None]:
    """Mark what the block creates in folder: the top-most new paths, and "." if it made folder."""
    existed = folder.exists()
    before = _listing(folder)
    try:
        yield
    finally:  # a failed or interrupted load leaves lock files and folders: tiedlm's to clear too
        created = _listing(folder) - before
        top = {r for r in created if r.rpartition("/")[0] not in created}
        if not existed and folder.is_dir():
            top.add(".")
        with contextlib.suppress(OSError):  # unmarked is left alone by `cache clear`: the safe side
            (folder / _MARKS).mkdir(exist_ok=True)
            for rel in top:
                (folder / _MARKS / _mark_name(rel)).write_text(rel, encoding="utf-8")


def _top_marks(marks: set[str]) -> set[str]:
    """The marked paths that no other marked path holds ("." aside)."""
    return {r for r in marks - {"."} if not any(r.startswith(o + "/") for o in marks)}


# --------------------------------------------------------------------------------------------
# `tiedlm cache list`


def _is_entry(folder: Path, kind: str) -> bool:
    """An entry tiedlm published: its manifest names its kind and, as its key, the folder's name."""
    m = read_json(folder / MANIFEST) if folder.is_dir() and not folder.is_symlink() else None
    return isinstance(m, dict) and m.get("kind") == kind and m.get("key") == folder.name


def cache_entries() -> list[dict]:
    """The token cache, for `tiedlm cache list`: one dict per entry with key, kind ("tokens",
    "tokenizer" or "datasets"), source, split, tokenizer, tokens, bytes (on disk) and path."""
    root = cache_root()
    out = []
    for kind in ("tokenizers", "tokens"):
        for folder in sorted((root / kind).glob("*")) if (root / kind).is_dir() else []:
            if not _is_entry(folder, _KINDS[kind]):
                continue
            m = read_json(folder / MANIFEST)
            out.append({"key": folder.name, "kind": m.get("kind"), "source": m.get("source"),
                        "split": m.get("split"),
                        "tokenizer": m.get("tokenizer") or f"{m.get('tokenizer_kind')} {m.get('vocab_size')}",
                        "tokens": m.get("n_tokens"), "bytes": _size(folder), "path": str(folder),
                        "created": m.get("created")})
    made = [root / "datasets" / r for r in sorted(_top_marks(_marked(root / "datasets")))]
    if any(p.exists() for p in made):  # only what tiedlm's loads made there: what `cache clear` removes
        out.append({"key": "datasets", "kind": "datasets", "source": "arrow copies of local files made by `datasets`",
                    "split": None, "tokenizer": None, "tokens": None, "bytes": sum(_size(p) for p in made),
                    "path": str(root / "datasets"), "created": None})
    return out


# --------------------------------------------------------------------------------------------
# `tiedlm cache clear`


@dataclass
class ClearedCache:
    """What `tiedlm cache clear` did under root."""

    root: Path
    freed_bytes: int = 0
    removed: list[Path] = dataclasses.field(default_factory=list)
    left_alone: list[tuple[Path, str]] = dataclasses.field(default_factory=list)  # (path, why it was kept)


def _pid_alive(pid: int) -> bool:
    if os.name != "posix":  # os.kill(pid, 0) would end the process on Windows
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # EPERM: it exists, it is someone else's
        return True
    return True


def _being_written(path: Path, m: re.Match) -> str | None:
    """Why a temporary file or folder of tiedlm's may still be in use, or None if it is abandoned:
    its process (on this host) is gone, or nothing in it changed for _STALE_S."""
    pid = int(m.group("pid"))
    if m.group("host") == HOST and not _pid_alive(pid):
        return None
    newest = 0.0
    for f in [path, *(path.rglob("*") if path.is_dir() else [])]:
        with contextlib.suppress(OSError):  # the writer may rename or remove it meanwhile
            newest = max(newest, f.lstat().st_mtime)
    if time.time() - newest > _STALE_S:
        return None
    where = "this machine" if m.group("host") == HOST else (m.group("host") or "an unknown machine")
    return f"being written by process {pid} on {where}"


def _remove(path: Path, out: ClearedCache) -> None:
    size = _size(path)
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)  # another process may be removing it too
    else:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
    if os.path.lexists(path):
        out.left_alone.append((path, "could not be removed — check its permissions"))
        return
    out.removed.append(path)
    out.freed_bytes += size


def _remove_unless_in_use(path: Path, m: re.Match, out: ClearedCache) -> None:
    why = _being_written(path, m)
    if why is None:
        _remove(path, out)
    else:
        out.left_alone.append((path, why))


def _clear_entries(folder: Path, kind: str, out: ClearedCache) -> None:
    for path in sorted(folder.iterdir()):
        m = _TMP_ENTRY.fullmatch(path.name)
        if _is_entry(path, kind):
            _remove(path, out)
        elif m and path.is_dir() and not path.is_symlink():  # left by a killed process, or being written
            _remove_unless_in_use(path, m, out)
        else:
            out.left_alone.append((path, "not made by tiedlm"))
    with contextlib.suppress(OSError):  # only if nothing is left in it
        folder.rmdir()


def _clear_datasets(folder: Path, out: ClearedCache) -> None:
    """Remove the marked paths (see marking); go down into a folder that holds marked paths."""
    marks = _marked(folder)

    def walk(path: Path, rel: str) -> None:
        for child in sorted(path.iterdir()):
            r = rel + child.name
            if r == _MARKS:
                continue
            if r in marks:
                _remove(child, out)
            elif child.is_dir() and not child.is_symlink() and any(m.startswith(r + "/") for m in marks):
                walk(child, r + "/")
            else:
                out.left_alone.append((child, "not made by tiedlm"))

    walk(folder, "")
    for rel in marks - {"."}:  # markers of what is gone now (or was removed by hand)
        if not os.path.lexists(folder / rel):
            with contextlib.suppress(OSError):
                (folder / _MARKS / _mark_name(rel)).unlink()
    if "." in marks and [p.name for p in folder.iterdir()] == [_MARKS]:  # tiedlm made it, and it is empty
        shutil.rmtree(folder, ignore_errors=True)
    with contextlib.suppress(OSError):  # only if no marker is left in it
        (folder / _MARKS).rmdir()


def clear_cache() -> ClearedCache:
    """Remove what tiedlm made under cache_root(): entries with a tiedlm manifest, what its loads
    marked in datasets/, its two memos (hub-revisions.json, file-digests.json), and temporary
    folders and files that no live process is writing. Everything else there is left alone, and listed with the reason."""
    root = cache_root()
    out = ClearedCache(root)
    for path in sorted(root.iterdir()) if root.is_dir() else []:
        real_dir = path.is_dir() and not path.is_symlink()
        if path.name in _KINDS and real_dir:
            _clear_entries(path, _KINDS[path.name], out)
        elif path.name == "datasets" and real_dir:
            _clear_datasets(path, out)
        elif path.name in _MEMOS and path.is_file():
            _remove(path, out)
        elif (m := _MEMO_TMP.fullmatch(path.name)) and path.is_file():
            _remove_unless_in_use(path, m, out)
        else:
            out.left_alone.append((path, "not made by tiedlm"))
    return out
