"""The run folder: its layout, atomic writes, the lock, status, checkpoints and loading runs.

This is the only module that knows the layout:

    runs/<name>/
      config.yaml          the resolved config
      metrics.jsonl        one JSON object per log / evaluation step
      report.json          status, parameters, final metrics, versions, config hash
      report.md            the same for people
      tokenizer/           the tokenizer the run used
      checkpoints/LATEST   the name of the newest complete checkpoint
      checkpoints/step-000500/{model.safetensors, state.pt, manifest.json}
      .lock                pid and host of the process that owns the run

Every file is written to a temporary name, fsynced and renamed, so a killed process never leaves
a half-written file; a checkpoint folder becomes visible (rename) only once complete, and the
previous one is deleted only after LATEST points at the new one.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import re
import shutil
import socket
import tempfile
from pathlib import Path
from typing import Any, Iterator

from .errors import RunError

FORMAT = 1  # bumped when the run folder changes incompatibly
STATUSES = ("running", "finished", "interrupted", "diverged", "failed")

CONFIG = "config.yaml"
METRICS = "metrics.jsonl"
REPORT = "report.json"
REPORT_MD = "report.md"
TOKENIZER = "tokenizer"
CHECKPOINTS = "checkpoints"
LOCK = ".lock"


# ------------------------------------------------------------------------- write failures

_NO_ROOM = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)
RESUME_HINT = "then run the same command to resume from the last checkpoint"


def write_failure(exc: BaseException, what: Path | str) -> RunError:
    """A failed write of a run file as one line. A full disk, a quota or a file-size limit
    (`ulimit -f`) surface as OSError from plain writes, but as RuntimeError ("unexpected pos")
    from torch.save and as SafetensorError from safetensors: every one of them is a write that did
    not happen, and the previous checkpoint is intact, so the advice is the same."""
    if isinstance(exc, RunError):
        return exc
    code = getattr(exc, "errno", None)
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    if code in _NO_ROOM or "No space left" in text or "File too large" in text:
        why = os.strerror(code) if code in _NO_ROOM else ("File too large" if "File too large" in text
                                                          else "No space left on device")
        return RunError(f"{why} while writing {what} — free some disk space (or raise the file-size "
                        f"limit, ulimit -f), {RESUME_HINT}")
    if isinstance(exc, OSError):
        return RunError(f"{exc.strerror or text} while writing {what} — check the path and its permissions, "
                        f"{RESUME_HINT}")
    return RunError(f"cannot write {what} ({type(exc).__name__}: {text}) — check the free disk space "
                    f"and the file-size limit (ulimit -f), {RESUME_HINT}")


@contextlib.contextmanager
def writing(what: Path | str) -> Iterator[None]:
    """Turn any failure of the writes inside into write_failure's one-line RunError."""
    try:
        yield
    except RunError:
        raise
    except Exception as exc:
        raise write_failure(exc, what) from exc


# ------------------------------------------------------------------------- atomic files


def _fsync_dir(path: Path) -> None:
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


def _read_umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


_UMASK = _read_umask()


def atomic_write_bytes(path: Path, data: bytes) -> None:
    path = Path(path)
    with writing(path):
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
        try:
            os.fchmod(fd, 0o666 & ~_UMASK)  # mkstemp makes 0600; run files are for everyone who may read the folder
            with os.fdopen(fd, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
    _fsync_dir(path.parent)


def atomic_write_text(path: Path, text: str) -> None:
    atomic_write_bytes(path, text.encode("utf-8"))


def atomic_write_json(path: Path, data: Any) -> None:
    atomic_write_text(path, json.dumps(data, indent=2, sort_keys=False, default=_json_default) + "\n")


def _json_default(obj: Any) -> Any:
    if hasattr(obj, "item"):  # numpy / torch scalars
        return obj.item()
    if isinstance(obj, Path):
        return str(obj)
    raise TypeError(f"not JSON serialisable: {type(obj).__name__}")


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


# ------------------------------------------------------------------------- names and folders


def run_dir_for(out: Path, name: str) -> Path:
    """The folder of run `name` under `out`; a name that is not a plain folder name (one that
    would escape `out`, hide itself or read as an option) is a ConfigError (config.check_run_name)."""
    from .config import check_run_name

    check_run_name(name)
    return Path(out) / name


# ------------------------------------------------------------------------- the lock


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
        import fcntl

        while True:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                owner = _read_owner(fd)
                os.close(fd)
                who = f"process {owner.get('pid')}" if owner else "another process"
                if owner and owner.get("host") not in (None, socket.gethostname()):
                    who += f" on host {owner.get('host')}"
                raise RunError(f"run folder {self.path.parent} is in use by {who} — wait for it to "
                               "finish or stop it, then start again") from None
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
            return

    def release(self) -> None:
        if self.fd is not None:
            try:
                os.unlink(self.path)  # unlink while still holding the lock, then let go
            except OSError:
                pass
            os.close(self.fd)
            self.fd = None

    def __enter__(self) -> "RunLock":
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.acquire()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.release()


def _read_owner(fd: int) -> dict | None:
    try:
        data = json.loads(os.pread(fd, 4096, 0).decode() or "null")
    except (OSError, ValueError, UnicodeDecodeError):
        return None
    return data if isinstance(data, dict) and "pid" in data else None


# ------------------------------------------------------------------------- reading a folder


def read_report(run_dir: Path) -> dict | None:
    """report.json as a dict, None when there is none; a corrupt or newer report is an error."""
    path = Path(run_dir) / REPORT
    if not path.exists():
        return None
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError):
        raise RunError(f"{path} is not valid JSON — the run folder is damaged; move it away, or start "
                       "afresh with --overwrite") from None
    if not isinstance(data, dict):
        raise RunError(f"{path} is not a tiedlm report — move the folder away, or use --overwrite")
    check_format(data.get("format"), path)
    return data


def check_format(fmt: Any, path: Path) -> None:
    if isinstance(fmt, int) and fmt > FORMAT:
        raise RunError(f"{path} was written by a newer tiedlm (run format {fmt}, this one reads {FORMAT}) "
                       "— upgrade tiedlm to use this run")


def read_config(run_dir: Path) -> dict | None:
    import yaml

    path = Path(run_dir) / CONFIG
    if not path.exists():
        return None
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (yaml.YAMLError, UnicodeDecodeError):
        raise RunError(f"{path} is not valid YAML — the run folder is damaged; use --overwrite") from None
    if not isinstance(data, dict):
        raise RunError(f"{path} is not a tiedlm config — use --overwrite")
    return data


def existing_state(run_dir: Path, config: dict) -> str:
    """What to do with a run folder: 'new', 'finished' (nothing to do), or 'resume'.

    A folder holding a different config is refused with the keys that differ."""
    from .config import OPERATIONAL_KEYS, diff_keys

    run_dir = Path(run_dir)
    if not run_dir.exists():
        return "new"
    report = read_report(run_dir)
    old = read_config(run_dir)
    if old is None and report is None:
        leftovers = [p.name for p in run_dir.iterdir() if p.name != LOCK]
        if leftovers:
            raise RunError(f"{run_dir} exists but is not a tiedlm run (it holds {', '.join(sorted(leftovers)[:3])}) "
                           "— choose another --name, or --overwrite to replace it")
        return "new"
    if old is not None:
        differ = [k for k in diff_keys(old, config) if k not in OPERATIONAL_KEYS]
        if differ:
            shown = ", ".join(differ[:6]) + (f" and {len(differ) - 6} more" if len(differ) > 6 else "")
            raise RunError(f"{run_dir} holds a run with a different config ({shown} differ) — "
                           "choose another --name or --seed, or --overwrite to start afresh", exit_code=2)
    if report is not None and report.get("status") == "finished":
        return "finished"
    return "resume"


def clear_run_dir(run_dir: Path) -> None:
    """Remove a run's files for --overwrite, keeping the lock this process holds."""
    for child in Path(run_dir).iterdir():
        if child.name == LOCK:
            continue
        if child.is_dir() and not child.is_symlink():
            shutil.rmtree(child)
        else:
            child.unlink()


# ------------------------------------------------------------------------- metrics


def append_metrics(run_dir: Path, records: list[dict]) -> None:
    """Append records; a torn last line (a kill or a full disk mid-write) is skipped on reading and
    cut away by trim_metrics on resume."""
    if not records:
        return
    path = Path(run_dir) / METRICS
    with writing(path), open(path, "a", encoding="utf-8") as f:
        for r in records:
            f.write(json.dumps(r, default=_json_default) + "\n")
        f.flush()
        os.fsync(f.fileno())


def read_metrics(run_dir: Path) -> list[dict]:
    """Every complete record of metrics.jsonl; a torn last line (a kill mid-write) is skipped."""
    path = Path(run_dir) / METRICS
    out = []
    if not path.exists():
        return out
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
        try:
            rec = json.loads(line)
        except ValueError:
            continue
        if isinstance(rec, dict):
            out.append(rec)
    return out


def trim_metrics(run_dir: Path, up_to_step: int) -> None:
    """Keep only the records of steps <= up_to_step (those the checkpoint covers), so that a
    resumed run's metrics.jsonl has no duplicated or missing steps."""
    path = Path(run_dir) / METRICS
    if not path.exists():
        return
    # final-evaluation records are written after the last checkpoint: a resume writes them again
    keep = [r for r in read_metrics(run_dir) if int(r.get("step", 0)) <= up_to_step and r.get("kind") != "final"]
    atomic_write_text(path, "".join(json.dumps(r, default=_json_default) + "\n" for r in keep))


# ------------------------------------------------------------------------- checkpoints

MODEL_FILE = "model.safetensors"
STATE_FILE = "state.pt"
MANIFEST = "manifest.json"


def save_checkpoint(run_dir: Path, step: int, tensors: dict, metadata: dict, state: dict,
                    keep_previous: bool = False) -> Path:
    """Write checkpoints/step-N atomically: weights (safetensors), training state (torch.save),
    and a manifest with each file's SHA-256, in a temporary folder renamed into place; then
    LATEST is pointed at it and older checkpoints are removed."""
    root = Path(run_dir) / CHECKPOINTS
    name = f"step-{step:07d}"
    with writing(root / name):
        root.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{name}-", dir=root))
        final = _write_checkpoint_folder(tmp, root, name, step, tensors, metadata, state)
    atomic_write_text(root / "LATEST", final.name + "\n")
    if not keep_previous:
        for old in root.iterdir():
            if old.name != final.name and old.name != "LATEST" and old.is_dir():
                shutil.rmtree(old, ignore_errors=True)
    return final


def _write_checkpoint_folder(tmp: Path, root: Path, name: str, step: int, tensors: dict, metadata: dict,
                             state: dict) -> Path:
    """Fill tmp and rename it to root/name (or name-1, ... if that exists); tmp is removed on failure."""
    import torch
    from safetensors.torch import save_file

    try:
        save_file(tensors, str(tmp / MODEL_FILE), metadata={k: str(v) for k, v in metadata.items()})
        torch.save(state, tmp / STATE_FILE)
        files = {}
        for fname in (MODEL_FILE, STATE_FILE):
            with open(tmp / fname, "rb") as f:
                os.fsync(f.fileno())
            files[fname] = {"sha256": sha256_file(tmp / fname), "bytes": (tmp / fname).stat().st_size}
        manifest = {"format": FORMAT, "step": step, "files": files, **{k: v for k, v in metadata.items()}}
        atomic_write_json(tmp / MANIFEST, manifest)
        final = root / name
        n = 1
        while final.exists():  # the same step saved again (a resume at it): a new name, the old one kept
            final, n = root / f"{name}-{n}", n + 1
        os.rename(tmp, final)
        _fsync_dir(root)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return final


_STEP_DIR = re.compile(r"step-(\d+)(?:-(\d+))?")


def _checkpoint_folders(root: Path) -> list[Path]:
    """Complete checkpoint folders (step-N, or step-N-k for a step saved again), newest first.
    Temporary folders (.tmp-*) are never complete: they are renamed only once fsynced."""
    found = []
    for child in root.iterdir() if root.is_dir() else []:
        m = _STEP_DIR.fullmatch(child.name)
        if m and child.is_dir():
            found.append(((int(m.group(1)), int(m.group(2) or 0)), child))
    return [path for _, path in sorted(found, reverse=True)]


def resolve_checkpoint(run_dir: Path) -> tuple[Path | None, str | None]:
    """The checkpoint to resume from, and a note when it was not found through LATEST.

    LATEST is written after its folder is renamed into place, so a kill between the two, or a
    LATEST deleted by hand, leaves complete checkpoints without a pointer: then the newest one
    that verifies against its manifest is used. A folder whose checkpoints exist but none
    verifies is refused, never silently restarted (a restart would delete them)."""
    root = Path(run_dir) / CHECKPOINTS
    latest = root / "LATEST"
    try:
        name = latest.read_text(encoding="utf-8").strip() if latest.is_file() else None
    except (OSError, UnicodeDecodeError):
        name = "(unreadable)"
    if name is not None and _STEP_DIR.fullmatch(name) and (root / name).is_dir():
        return root / name, None
    problem = "checkpoints/LATEST is missing" if name is None else \
        f"checkpoints/LATEST points at a missing checkpoint {name!r}"
    candidates = _checkpoint_folders(root)
    for path in candidates:
        try:
            verify_checkpoint(path)
        except RunError:
            continue
        return path, f"{problem}: using {path.name}, the newest checkpoint that verifies"
    if candidates:
        raise RunError(f"{problem} and none of the checkpoints in {root} ({', '.join(p.name for p in candidates[:3])}) "
                       "matches its manifest — restore the checkpoint files, or use --overwrite to start afresh")
    if name is not None:
        raise RunError(f"{problem} and {root} holds no checkpoint — the run folder is damaged; restore the "
                       "checkpoint, or use --overwrite to start afresh")
    return None, None


def latest_checkpoint(run_dir: Path) -> Path | None:
    return resolve_checkpoint(run_dir)[0]


def clean_temporary_files(run_dir: Path) -> list[str]:
    """Remove what a killed writer left: `.NAME.*.tmp` files (atomic_write_bytes) in the run folder
    and its checkpoints folder, and `.tmp-step-*` folders (save_checkpoint). Only called by the
    process holding the run's lock, so no other writer can own them. Returns what was removed."""
    removed = []
    for folder in (Path(run_dir), Path(run_dir) / CHECKPOINTS):
        for child in folder.iterdir() if folder.is_dir() else []:
            stray_file = child.name.startswith(".") and child.name.endswith(".tmp") and child.is_file()
            stray_dir = child.name.startswith(".tmp-step-") and child.is_dir()
            if stray_file or stray_dir:
                with contextlib.suppress(OSError):
                    shutil.rmtree(child) if stray_dir else child.unlink()
                    removed.append(child.name)
    return removed


def verify_checkpoint(ckpt: Path) -> dict:
    """Check every file against the manifest's SHA-256; return the manifest."""
    mpath = ckpt / MANIFEST
    try:
        manifest = json.loads(mpath.read_text())
    except (OSError, ValueError):
        raise RunError(f"checkpoint {ckpt} has no readable manifest — it is damaged; "
                       "use --overwrite to start afresh") from None
    check_format(manifest.get("format"), mpath)
    for fname, meta in manifest.get("files", {}).items():
        fpath = ckpt / fname
        if not fpath.exists():
            raise RunError(f"checkpoint file {fpath} is missing — use --overwrite to start afresh")
        if fpath.stat().st_size != meta.get("bytes") or sha256_file(fpath) != meta.get("sha256"):
            raise RunError(f"checkpoint file {fpath} does not match its SHA-256 in the manifest (truncated "
                           "or altered) — nothing was loaded; restore it, or use --overwrite to start afresh")
    return manifest


def load_checkpoint(ckpt: Path, with_state: bool = True) -> tuple[dict, dict | None, dict]:
    """(tensors, state or None, manifest) of a verified checkpoint. Nothing is unpickled:
    weights come from safetensors, state from torch.load(weights_only=True)."""
    import torch
    from safetensors.torch import load_file

    manifest = verify_checkpoint(ckpt)
    try:
        tensors = load_file(str(ckpt / MODEL_FILE))
        state = torch.load(ckpt / STATE_FILE, weights_only=True) if with_state else None
    except Exception as exc:  # a file that passed the hash but still fails to parse
        raise RunError(f"checkpoint {ckpt} cannot be read ({type(exc).__name__}) — use --overwrite") from None
    return tensors, state, manifest


def clear_checkpoints(run_dir: Path) -> None:
    """Remove every checkpoint (a run restarting from step 0 must not find stale ones)."""
    shutil.rmtree(Path(run_dir) / CHECKPOINTS, ignore_errors=True)
