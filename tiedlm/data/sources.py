"""Where the text comes from: what `data.path` names (a built-in corpus, a builder name with
data.data_files, a local file or folder, a `save_to_disk` folder, or a hub id), a fingerprint
that changes when the data does, loading it through `datasets`, and one line for each way that
can fail.

A path, file or dataset (config) that the config names and that is not there, or is empty, is a
ConfigError (exit 2); what the world does (an unreachable hub, a full disk) and text that is not
UTF-8 are a DataError (exit 1).
"""

from __future__ import annotations

import codecs
import contextlib
import dataclasses
import glob as globlib
import os
import re
import stat
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from . import builtin
from ..config import DataConfig
from ..errors import ConfigError, DataError, TiedlmError
from ..files import NO_ROOM, atomic_write_json, errno_of, exception_chain, first_line, read_json, sha256_file
from .cache import DIGEST_MEMO, HUB_MEMO, cache_root, cache_write_failure, marking

BUILDERS = {"text": "text", "json": "json", "jsonl": "json", "csv": "csv", "parquet": "parquet"}
_EXTENSIONS = {".txt": "text", ".text": "text", ".md": "text", ".json": "json", ".jsonl": "json",
               ".csv": "csv", ".parquet": "parquet"}
_BUILTIN_NAMES = ", ".join(f"builtin:{n}" for n in builtin.BUILTINS[:-1]) + f" or builtin:{builtin.BUILTINS[-1]}"
_TEXT_FREE = f"local files (data.path: text, data.data_files: FILE) or a built-in corpus (data.path: {_BUILTIN_NAMES})"


@dataclass
class Source:
    kind: str  # builtin | files | disk | folder | hub
    description: str  # for people
    fingerprint: dict  # JSON; changes when the data changes
    path: str = ""
    builder: str | None = None
    files: dict[str, list[Path]] | None = None  # local files, for builders (and the UTF-8 check)
    # local files: the fingerprint as tiedlm wrote it before it hashed their content (each file's
    # modification time where the digest is now), so that runs recorded then are still known
    by_mtime: dict | None = None


# --------------------------------------------------------------------------------------------
# Resolving data.path, without loading anything


def file_stamps(paths: list[Path]) -> tuple[list[list], list[list]]:
    """[path, bytes, content digest] of each data file: what identifies it. The content, not the
    modification time, so that a copy, a checkout, an rsync or a touch of the same bytes keeps the
    fingerprint (and with it the runs' claim to the same tokens: their resume and their comparison).
    Each file is hashed once per (size, mtime, ctime, inode, device) it shows: the memo in the
    cache remembers it. The ctime is what an in-place edit of the same size with its mtime set back
    (touch -d, rsync -t) cannot set back; what is still not caught is a change that restores the
    ctime too (a clock set back, or a file system without one), which needs a re-hash
    (tiedlm cache clear). A file that cannot be read is stamped by its mtime instead; loading it says what
    is wrong. Second, from the same stat, the stamps as tiedlm made them before it hashed the
    content, [path, bytes, mtime in ns] (Source.by_mtime)."""
    memo_file = cache_root() / DIGEST_MEMO
    memo = read_json(memo_file)
    memo = memo if isinstance(memo, dict) else {}
    stamps, by_mtime, changed = [], [], False
    for path in paths:
        st = path.stat()
        seen = [st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino, st.st_dev]
        by_mtime.append([str(path), st.st_size, st.st_mtime_ns])
        known = memo.get(str(path))
        if isinstance(known, list) and len(known) == len(seen) + 1 and known[:-1] == seen:  # an older memo: hashed again
            digest = known[-1]
        else:
            try:
                digest = _content_digest(path)
            except OSError:
                stamps.append(by_mtime[-1])
                continue
            memo[str(path)], changed = [*seen, digest], True
        stamps.append([str(path), st.st_size, digest])
    if changed:
        with contextlib.suppress(OSError):  # a cache that cannot be written only costs a re-hash
            memo_file.parent.mkdir(parents=True, exist_ok=True)
            atomic_write_json(memo_file, memo, indent=0)
    return stamps, by_mtime


def _content_digest(path: Path) -> str:
    return "sha256:" + sha256_file(path)


_SPECIAL = ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
            (stat.S_ISSOCK, "a socket"))


def _special_kind(path: Path) -> str | None:
    """What `path` is where it is neither a regular file nor a folder ("a FIFO", "a character
    device", ...), from its stat alone: nothing is opened, so a FIFO with no writer cannot block."""
    try:
        mode = path.stat().st_mode
    except OSError:
        return None
    if stat.S_ISREG(mode) or stat.S_ISDIR(mode):
        return None
    return next((name for test, name in _SPECIAL if test(mode)), "not a file")


def _human_bytes(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1000 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} GB"


def _resolve_data_files(spec: Any, base: Path) -> dict[str, list[Path]]:
    """data.data_files (a path, glob, list, or {split: files}, as config.validate admits) →
    {split: sorted existing files}."""
    if isinstance(spec, (str, Path)):
        spec = {"train": [spec]}
    elif isinstance(spec, (list, tuple)):
        spec = {"train": list(spec)}
    out: dict[str, list[Path]] = {}
    for split, patterns in spec.items():
        patterns = patterns if isinstance(patterns, (list, tuple)) else [patterns]
        files: list[Path] = []
        for pattern in patterns:
            full = Path(str(pattern)).expanduser()
            full = full if full.is_absolute() else base / full
            matches = sorted(Path(m) for m in globlib.glob(str(full), recursive=True) if Path(m).is_file())
            special = _special_kind(full) if not matches else None
            if special:
                raise ConfigError(f"data.data_files: {pattern!r} is not a regular file ({special}) — point it at "
                                  "text files or a glob of them")
            if not matches:
                raise ConfigError(f"data.data_files: {pattern!r} matches no file (relative paths start at {base}) "
                                  "— check the path or the glob")
            files.extend(m.resolve() for m in matches if m.resolve() not in files)
        out[str(split)] = files
    return out


def _offline() -> bool:
    return any(os.environ.get(v, "").upper() in ("1", "ON", "YES", "TRUE")
               for v in ("HF_DATASETS_OFFLINE", "HF_HUB_OFFLINE"))


def hub_revision(path: str, revision: str | None) -> str:
    """The commit the hub serves for this dataset revision, so that the cache key changes when the
    dataset does. Offline (or unreachable), the last commit seen, so cached tokens are still used."""
    if revision and re.fullmatch(r"[0-9a-f]{40}", revision):
        return revision  # a pinned commit names itself: no need to ask the hub
    memo_file = cache_root() / HUB_MEMO
    memo = read_json(memo_file) or {}
    name = f"{path}@{revision or 'main'}"
    if not _offline():
        try:
            from huggingface_hub import HfApi

            sha = HfApi().dataset_info(path, revision=revision, timeout=10).sha
            if sha and memo.get(name) != sha:
                memo[name] = sha
                memo_file.parent.mkdir(parents=True, exist_ok=True)
                atomic_write_json(memo_file, memo, indent=1)
            return sha or name
        except Exception:  # unreachable, gated or missing: load_dataset will say which
            pass
    return memo.get(name, name)


# What a data file's name ends with: the formats tiedlm reads (_EXTENSIONS) and the usual others
# and compressions. No hub dataset id ends so, so such a path names a file even when it is missing.
_FILE_SUFFIXES = frozenset(_EXTENSIONS) | {".tsv", ".arrow", ".gz", ".bz2", ".xz", ".zst", ".zip", ".tar"}


def looks_local(p: str) -> bool:
    """Whether data.path names a local file or folder by its spelling alone, present or not: it
    starts with / ./ ../ ~ or a drive letter, holds a backslash, ends with a separator, has more
    parts than a hub id's owner/name, or its last part ends with a data file's extension (.txt,
    .jsonl, .csv.gz, ...). Anything else that does not exist is a hub dataset id (wikitext,
    roneneldan/TinyStories), which is asked of the hub."""
    p = p.strip()
    if p in (".", "..") or p.startswith(("/", "./", "../", "~", ".\\", "..\\")) or "\\" in p:
        return True
    if re.match(r"[A-Za-z]:[\\/]", p) or p.endswith("/") or p.count("/") > 1:
        return True
    return Path(p).suffix.lower() in _FILE_SUFFIXES


def _no_such_path(p: str, local: Path) -> ConfigError:
    """A local-looking data.path that is not there: said at once, without asking the hub."""
    where = "" if Path(p).is_absolute() else \
        f" ({local})" if p.startswith("~") else f" (relative to {Path.cwd()})"
    return ConfigError(f"data.path {p} does not exist{where} — check the path; a Hugging Face dataset id looks "
                       "like owner/name")


def resolve_source(d: DataConfig) -> Source:
    """Decide what data.path names and fingerprint it, without loading anything."""
    p = d.path.strip()
    if p.startswith("builtin:"):
        return _builtin_source(p, d)
    if p in BUILDERS:
        if d.data_files is None:
            raise ConfigError(f"data.path: {p} needs data.data_files (a path, a glob, a list, or split: files)")
        return _files_source(BUILDERS[p], _resolve_data_files(d.data_files, Path.cwd()), p)
    local = Path(p).expanduser()
    if local.exists() or looks_local(p):
        if not local.exists():
            raise _no_such_path(p, local)
        return _local_source(p, local.resolve(), d)
    what = f"hub dataset {p}" + (f" ({d.name})" if d.name else "") + (f" @ {d.revision}" if d.revision else "")
    return Source("hub", what, {"hub": p, "name": d.name, "revision": hub_revision(p, d.revision),
                                "data_files": d.data_files}, p)


def check_source(d: DataConfig) -> None:
    """Refuse at once what resolve_source refuses of a built-in name, a builder's data_files or a
    local path (missing, empty, of an unknown format), without asking the hub anything: for a
    command that plans many runs, before the first one."""
    p = d.path.strip()
    if p.startswith("builtin:") or p in BUILDERS or looks_local(p) or Path(p).expanduser().exists():
        resolve_source(d)


def _builtin_source(p: str, d: DataConfig) -> Source:
    name = p[len("builtin:"):]
    if name == "synthetic":
        s = d.synthetic
        return Source("builtin", f"builtin:synthetic ({s.vocab_size} words in {s.n_classes} classes, "
                                 f"zipf {s.zipf}, seed {s.seed})",
                      {"builtin": "synthetic", "version": builtin.SYNTHETIC_VERSION, **dataclasses.asdict(s)}, p)
    if name == "pydoc":
        return Source("builtin", f"builtin:pydoc (CPython {sys.version_info[0]}.{sys.version_info[1]} "
                                 "documentation topics)",
                      {"builtin": "pydoc", "text": builtin.pydoc_fingerprint()}, p)
    if name == "shakespeare":
        return Source("builtin", "builtin:shakespeare (Tiny Shakespeare, 1,115,394 characters, shipped with tiedlm; "
                                 "contiguous 90/5/5 by lines)", builtin.shakespeare_fingerprint(), p)
    raise ConfigError(f"unknown built-in corpus {p} — use {_BUILTIN_NAMES}")


def _local_source(p: str, local: Path, d: DataConfig) -> Source:
    """A local data file, a `save_to_disk` folder or a folder of data files."""
    special = _special_kind(local)
    if special:
        raise ConfigError(f"data.path {p} is not a regular file or folder ({special}) — point data.path at a text "
                          "file, a folder of them, or a dataset id")
    if local.is_file():
        builder = _EXTENSIONS.get(local.suffix.lower())
        if builder is None:
            raise ConfigError(f"cannot tell the format of {p} from its extension — use data.path: text (or json, "
                              f"csv, parquet) with data.data_files: {p}")
        return _files_source(builder, {"train": [local]}, p)
    listing, listing_by_mtime = file_stamps(
        [f for f in sorted(local.rglob("*"))
         if f.is_file() and not any(part.startswith(".") for part in f.relative_to(local).parts)])
    if not listing:
        raise ConfigError(f"data.path {p} is an empty folder — add data files (.txt, .json, .jsonl, .csv, "
                          ".parquet) or point data.path elsewhere")
    size = _human_bytes(sum(s[1] for s in listing))
    if (local / "dataset_dict.json").exists() or (local / "state.json").exists():
        return Source("disk", f"dataset saved with save_to_disk at {local} ({size})",
                      {"disk": str(local), "files": listing}, str(local),
                      by_mtime={"disk": str(local), "files": listing_by_mtime})
    files = _resolve_data_files(d.data_files, local) if d.data_files is not None else None
    fingerprint = {"folder": str(local), "files": listing, "name": d.name,
                   "data_files": {k: [str(f) for f in v] for k, v in (files or {}).items()}}
    return Source("folder", f"local dataset folder {local} ({len(listing)} files, {size})", fingerprint,
                  str(local), files=files, by_mtime={**fingerprint, "files": listing_by_mtime})


def _files_source(builder: str, files: dict[str, list[Path]], path: str) -> Source:
    flat, flat_by_mtime = file_stamps([f for fs in files.values() for f in fs])  # the memo read and written once
    stamps, by_mtime, at = {}, {}, 0
    for split, fs in files.items():
        stamps[split], by_mtime[split], at = flat[at:at + len(fs)], flat_by_mtime[at:at + len(fs)], at + len(fs)
    n = sum(len(fs) for fs in files.values())
    size = _human_bytes(sum(s[1] for fs in stamps.values() for s in fs))
    names = ", ".join(f.name for fs in files.values() for f in fs[:3]) + (", ..." if n > 3 else "")
    return Source("files", f"{builder} files: {names} ({n} file{'s' * (n != 1)}, {size})",
                  {"builder": builder, "files": stamps}, path, builder=builder, files=files,
                  by_mtime={"builder": builder, "files": by_mtime})


# --------------------------------------------------------------------------------------------
# Empty and non-UTF-8 data files


def _first_non_utf8(files: list[Path]) -> tuple[Path, int, int] | None:
    """The first file that is not UTF-8: (file, byte offset, byte value)."""
    for f in files:
        decoder = codecs.getincrementaldecoder("utf-8")()
        offset = 0
        with open(f, "rb") as fh:
            while chunk := fh.read(1 << 20):
                try:
                    decoder.decode(chunk)
                except UnicodeDecodeError as exc:
                    return f, offset + exc.start, chunk[exc.start]
                offset += len(chunk)
    return None


def _local_files(source: Source) -> list[Path]:
    files = [f for fs in (source.files or {}).values() for f in fs]
    if source.kind == "folder" and not files:
        files = [Path(s[0]) for s in source.fingerprint["files"]]
    return files


def _is_blank(path: Path) -> bool:
    """0 bytes, or (a text format) nothing but whitespace: read up to the first other byte."""
    try:
        if path.stat().st_size == 0:
            return True
        if path.suffix.lower() == ".parquet":
            return False
        with open(path, "rb") as fh:
            while chunk := fh.read(1 << 16):
                if chunk.strip():
                    return False
        return True
    except OSError:  # unreadable: datasets says so
        return False


def _shown(path: Path) -> str:
    """A path as the user probably wrote it: relative to the working folder when it is inside it."""
    try:
        return str(path.relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)


def _empty_files(files: list[Path], source: Source) -> ConfigError:
    """Data files with nothing in them are what the config names: a config error, like a wrong path."""
    key = "data.data_files" if source.files and (source.kind == "folder" or source.path in BUILDERS) \
        else "data.path"
    names = ", ".join(_shown(f) for f in files[:3]) + (f" and {len(files) - 3} more" if len(files) > 3 else "")
    if len(files) == 1:
        return ConfigError(f"data file {names} is empty — give a file with text, or check {key}")
    return ConfigError(f"data files {names} are empty — give files with text, or check {key}")


def _check_not_empty(source: Source) -> None:
    """Name empty data files before `datasets` reads them: it says only "An error occurred while
    generating the dataset". An empty file among others adds no documents to a text split, which
    is harmless; the csv, json and parquet builders fail on one (json on whitespace, not 0 bytes)."""
    for files in (source.files or {}).values():
        empty = [f for f in files if _is_blank(f)]
        fatal = empty if len(empty) == len(files) else \
            [f for f in empty if _EXTENSIONS.get(f.suffix.lower(), source.builder) != "text"]
        if fatal:
            raise _empty_files(fatal, source)


# --------------------------------------------------------------------------------------------
# Loading through `datasets`, and turning its exceptions into one-line errors

# What `datasets` raises for a file with no data in it: the text builder ("at least one example"),
# pandas for csv, and the json builder (StopIteration, or "Instruction "train" corresponds to no
# data!"). Only taken to mean that when an empty file is found.
_EMPTY_ERRORS = ("SchemaInferenceError", "EmptyDataError", "StopIteration")


def _no_room(exc: BaseException, source: Source) -> DataError:
    """`datasets` writing its arrow copy of the data ran out of room."""
    if source.kind == "hub":
        import datasets.config

        return cache_write_failure(exc, datasets.config.HF_DATASETS_CACHE, "the Hugging Face datasets cache",
                                   "HF_DATASETS_CACHE")
    return cache_write_failure(exc, cache_root() / "datasets")


def _not_utf8(source: Source) -> DataError:
    bad = _first_non_utf8(_local_files(source))
    if bad is None:
        return DataError(f"a data file of {source.description} is not UTF-8 text — convert it to UTF-8 "
                         "(e.g. iconv -f latin1 -t utf-8 FILE > FILE.utf8)")
    return DataError(f"{bad[0]} is not UTF-8 text (byte 0x{bad[2]:02x} at offset {bad[1]}) — convert it to "
                     f"UTF-8, e.g. iconv -f latin1 -t utf-8 {bad[0]} > {bad[0]}.utf8")


def _hub_unreachable(source: Source) -> DataError:
    if _offline():
        return DataError(f"{source.description} is not in the local Hugging Face cache and the hub is switched "
                         "off (HF_DATASETS_OFFLINE / HF_HUB_OFFLINE is set) — unset it to download, "
                         f"or use {_TEXT_FREE}")
    return DataError(f"cannot reach the Hugging Face hub to load {source.description} — check the network, set "
                     f"HF_DATASETS_OFFLINE=1 to use a copy downloaded before, or use {_TEXT_FREE}")


def translate(exc: BaseException, source: Source, d: DataConfig) -> TiedlmError:
    """What `datasets` raised, as one line: a ConfigError where the config names something that is
    not there, a DataError where the world failed (or the cause is unknown)."""
    from datasets.exceptions import DataFilesNotFoundError, DatasetNotFoundError

    chain = exception_chain(exc)
    msg = first_line(exc)
    if errno_of(exc) in NO_ROOM:
        return _no_room(exc, source)
    if any(type(e).__name__ in _EMPTY_ERRORS for e in chain) or "corresponds to no data" in msg:
        empty = [f for f in _local_files(source) if _is_blank(f)]
        if empty:
            return _empty_files(empty, source)
    if any(isinstance(e, UnicodeDecodeError) for e in chain):
        return _not_utf8(source)
    if source.kind == "hub" and (isinstance(exc, ConnectionError) or "Couldn't reach" in msg):
        return _hub_unreachable(source)
    if isinstance(exc, DataFilesNotFoundError):
        return ConfigError(f"{source.description}: {msg} — add .txt/.json/.jsonl/.csv/.parquet files "
                           "or set data.data_files")
    if isinstance(exc, DatasetNotFoundError):
        return ConfigError(f"{source.description} was not found: {msg} — check data.path and data.revision "
                           "(private or gated datasets need `hf auth login`)")
    if isinstance(exc, ValueError) and ("BuilderConfig" in msg or "Config name is missing" in str(exc)):
        configs = str(exc).split("[", 1)[-1].split("]", 1)[0] if "[" in str(exc) else "?"
        if d.name:
            return ConfigError(f"data.name {d.name!r} is not a config of {d.path}; it has: {configs} — "
                               "set data.name to one of them")
        return ConfigError(f"{d.path} has several configs: {configs} — set data.name to one of them")
    if isinstance(exc, FileNotFoundError):
        return ConfigError(f"{source.description}: {msg} — check data.path and data.data_files")
    return DataError(f"datasets could not load {source.description}: {msg} — check data.path, data.data_files "
                     "and the files' format (--debug shows the traceback)")


def _stderr_is_terminal() -> bool:
    try:
        return sys.stderr.isatty()
    except (AttributeError, ValueError):  # replaced by an object without isatty, or closed
        return False


@contextlib.contextmanager
def _datasets_progress(progress: bool):
    """`datasets`' progress bars (and the hub's, for its downloads) made to behave as tiedlm's own:
    shown only with progress on and stderr a terminal, and erased when they end. Left to themselves
    they are written into pipes and logs too, and their last line stays, so that "Generating train
    split: ..." stood before tiedlm's one error line when the data then turned out to be wrong."""
    import datasets
    from huggingface_hub import utils as hub

    shown = progress and _stderr_is_terminal()
    was_disabled, hub_was_disabled = datasets.are_progress_bars_disabled(), hub.are_progress_bars_disabled()
    # set both ways: another caller may have left them off (or on) process-wide
    (datasets.enable_progress_bars if shown else datasets.disable_progress_bars)()
    (hub.enable_progress_bars if shown else hub.disable_progress_bars)()
    with _transient_bars(datasets.utils.tqdm if shown else None):
        try:
            yield
        finally:
            (datasets.disable_progress_bars if was_disabled else datasets.enable_progress_bars)()
            (hub.disable_progress_bars if hub_was_disabled else hub.enable_progress_bars)()


@contextlib.contextmanager
def _transient_bars(bar_class: Any):
    """While inside, bars of `bar_class` (datasets' tqdm subclass, which every datasets module
    imported by name, so only the class itself can be changed) are made with leave=False, as
    tiedlm's are: a finished bar erases its line. None, or a class not as expected: unchanged."""
    own = vars(bar_class).get("__init__") if isinstance(bar_class, type) else None
    if own is None:
        yield
        return

    def transient(self, *args, **kwargs):
        if len(args) < 4:  # leave is tqdm's fourth parameter (datasets passes it by name, if at all)
            kwargs["leave"] = False
        own(self, *args, **kwargs)

    bar_class.__init__ = transient
    try:
        yield
    finally:
        bar_class.__init__ = own


def _load_dataset(source: Source, d: DataConfig) -> Any:
    import datasets

    local_cache = str(cache_root() / "datasets")  # arrow copies of local files live with our cache
    if source.kind == "disk":
        return datasets.load_from_disk(source.path)
    files = {s: [str(f) for f in fs] for s, fs in source.files.items()} if source.files else None
    if source.kind == "files":
        return datasets.load_dataset(source.builder, data_files=files, cache_dir=local_cache, streaming=d.streaming)
    if source.kind == "folder":
        return datasets.load_dataset(source.path, name=d.name, data_files=files, cache_dir=local_cache,
                                     streaming=d.streaming)
    return datasets.load_dataset(source.path, name=d.name, data_files=d.data_files, revision=d.revision,
                                 streaming=d.streaming)


def load_raw(source: Source, d: DataConfig, progress: bool) -> dict[str, Any]:
    """{split name: datasets.Dataset | IterableDataset | list[str]} for the source."""
    if source.kind == "builtin":
        if d.path.strip() == "builtin:synthetic":
            return {k: [v] for k, v in builtin.synthetic_splits(d.synthetic).items()}
        if d.path.strip() == "builtin:shakespeare":
            return builtin.shakespeare_splits()
        return builtin.pydoc_splits()

    _check_not_empty(source)
    import datasets

    mark = marking(cache_root() / "datasets") if source.kind in ("files", "folder") else contextlib.nullcontext()
    try:
        with _datasets_progress(progress), mark:
            obj = _load_dataset(source, d)
    except TiedlmError:
        raise
    except Exception as exc:
        raise translate(exc, source, d) from exc
    if isinstance(obj, (datasets.Dataset, datasets.IterableDataset)):
        obj = {"train": obj}
    return dict(obj)
