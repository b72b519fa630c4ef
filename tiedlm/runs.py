"""The run folder: its layout, the lock, what to do with an existing folder, metrics, and
report.json (`RunReport`, its one schema) with report.md. Checkpoint folders are checkpoints.py's;
the atomic writes themselves are files.py's.

The layout:

    runs/<name>/
      config.yaml          the resolved config
      metrics.jsonl        one JSON object per log / evaluation step
      report.json          status, parameters, final metrics, versions, config hash
      report.md            the same for people
      tokenizer/           the tokenizer the run used
      checkpoints/LATEST   the name of the newest complete checkpoint
      checkpoints/step-000500/{model.safetensors, state.pt, manifest.json}
      tb/                  TensorBoard's event files, when they are written (tensorboard.py)
      .lock                pid and host of the process that owns the run

Every file is written to a temporary name, fsynced and renamed (files.py), so a killed process
never leaves a half-written file; a failed write is one line saying what to do (write_failure).
"""

from __future__ import annotations

import contextlib
import glob
import json
import os
import shutil
import socket
import time
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Iterator

from . import files
from .checks import check_run_name
from .config import Config, from_dict, to_dict
from .variant import config_hash, diff_keys, operational_keys, variant_dict
from .yamlsafe import load_yaml
from .errors import ConfigError, ConfigMismatchError, DamagedRunError, NotARunError, RunError, TiedlmError
from .files import describe_write_failure
from .report_md import render_report_md
from .process import log
from .yamlsafe import read_yaml_text

FORMAT = 1  # bumped when the run folder changes incompatibly
STATUSES = ("running", "finished", "interrupted", "diverged", "failed")

CONFIG = "config.yaml"
METRICS = "metrics.jsonl"
REPORT = "report.json"
REPORT_MD = "report.md"
TOKENIZER = "tokenizer"
CHECKPOINTS = "checkpoints"
LOCK = ".lock"
TB = "tb"  # TensorBoard's event files (tensorboard.py)
MANAGED = (CONFIG, METRICS, REPORT, REPORT_MD, TOKENIZER, CHECKPOINTS, LOCK, TB)  # checkpoints.check_outside_runs


# ------------------------------------------------------------------------- write failures

RESUME_HINT = "then run the same command to resume from the last checkpoint"
AGAIN_HINT = "then run the same command again"  # for what is not a run's own file: a comparison, an analysis


def write_failure(exc: BaseException, what: Path | str, then: str = RESUME_HINT) -> RunError:
    """A failed write of a run file as one line. A full disk, a quota or a file-size limit
    surface as OSError from plain writes but as other exceptions from torch.save and safetensors
    (files.errno_of finds them): every one is a write that did not happen, with the previous
    checkpoint intact, so the advice is the same."""
    if isinstance(exc, RunError):
        return exc
    why, no_room = describe_write_failure(exc, what)
    if no_room:
        return RunError(f"{why} while writing {what} — free some disk space (or raise the file-size "
                        f"limit, ulimit -f), {then}")
    if isinstance(exc, OSError):
        return RunError(f"{why} while writing {what} — check the path and its permissions, {then}")
    return RunError(f"cannot write {what} ({why}) — check the free disk space and the file-size limit "
                    f"(ulimit -f), {then}")


@contextlib.contextmanager
def writing(what: Path | str, then: str = RESUME_HINT) -> Iterator[None]:
    """Turn any failure of the writes inside into write_failure's one-line RunError; `then` is the
    way on it advises (a run's files: resume from the last checkpoint)."""
    try:
        yield
    except RunError:
        raise
    except Exception as exc:
        raise write_failure(exc, what, then) from exc


def as_tiedlm_error(exc: BaseException, distributed: bool = False) -> TiedlmError | None:
    """Expected runtime failures as one-line errors: out of memory (GPU or CPU), a failed write,
    and under torchrun a collective broken by another rank's failure."""
    import torch

    if isinstance(exc, TiedlmError):
        return exc
    if distributed and isinstance(exc, RuntimeError) and any(
            w in str(exc) for w in ("gloo", "NCCL", "Connection closed", "connection", "peer")):
        return RunError("another process of this distributed run failed, which broke a collective — see "
                        "torchrun's output for that rank's error; the last checkpoint is kept")
    # The CPU allocator raises a plain RuntimeError; its message is the only sign of what it is.
    cpu_oom = isinstance(exc, RuntimeError) and "DefaultCPUAllocator" in str(exc)
    if isinstance(exc, (torch.OutOfMemoryError, MemoryError)) or cpu_oom:
        where = "the device" if isinstance(exc, torch.OutOfMemoryError) else "this machine (CPU memory)"
        return RunError(f"out of memory on {where} — lower train.batch_size (raise train.grad_accum to keep "
                        "the same batch), model.block_size or the model size; the last checkpoint is kept")
    if isinstance(exc, OSError):
        return write_failure(exc, exc.filename or "the run folder")
    return None


# ------------------------------------------------------------------------- names and folders


def run_dir_for(out: Path, name: str) -> Path:
    """The folder of run `name` under `out`; a name that is not a plain folder name (one that
    would escape `out`, hide itself or read as an option) is a ConfigError (checks.check_run_name)."""
    check_run_name(name)
    return Path(out) / name


def expand_runs(items: list[str]) -> list[Path]:
    """Run folders from the command line: folders, or globs (a glob matching nothing is an error)."""
    found: list[Path] = []
    for item in items:
        matches = sorted(glob.glob(item)) if any(ch in item for ch in "*?[") else [item]
        if not matches:
            raise NotARunError(f"no run folder matches {item!r} — give run folders such as runs/base-tied-s0")
        found += [Path(m) for m in matches if Path(m).name != "compare"]
    return list(dict.fromkeys(found))


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


# ------------------------------------------------------------------------- report.json


# Fields whose null says something ("no error", "never untied"): written even when null.
_ALWAYS_WRITTEN = {"status", "error", "git_commit", "data_identity", "floor", "untie_step", "untied_at_step",
                   "params_after_untie"}
_NOT_WRITTEN = {"extra", "config_problem", "_stored"}  # fields of RunReport that are not keys of report.json


@dataclass
class RunReport:
    """report.json. The one schema of a run's result: training (tiedlm.train) writes it, and
    compare, sweep and eval read it through read_report. Keys a reader does not know (from another
    tiedlm version) are kept in `extra` and written back unchanged."""

    # in the order report.json holds them
    format: int = FORMAT
    tiedlm_version: str | None = None
    name: str = ""
    status: str | None = "running"  # one of STATUSES; None when a report lacks it
    error: str | None = None
    seed: int | None = None
    config_hash: str | None = None  # variant.config_hash: what identifies the variant
    config: Config | None = None  # the resolved config; read_report rebuilds it (None: see config_problem)
    started_at: str | None = None
    device: str | None = None
    dtype: str | None = None
    versions: dict = field(default_factory=dict)
    git_commit: str | None = None
    command: str | None = None
    data_identity: dict | None = None  # data.data_identity: what the tokens depend on
    # known once the model is built
    params: dict | None = None  # model.count_params, with the tokenizer's and the padded vocabulary
    flops_per_token: dict | None = None
    total_steps: int | None = None
    data: dict | None = None  # PreparedData.info
    floor: dict | None = None  # builtin:synthetic only
    untie_step: int | None = None  # the step at which an untie_at run is to split in two
    decay_embeddings: bool | None = None
    ledger: dict | None = None  # ledger.Ledger: what E and W_out received (lr, decay, init, V·d's share)
    also: dict | None = None  # eval.also: another data set's test split before and after training
    resumed_at_steps: list = field(default_factory=list)
    # the end
    final: dict | None = None  # split -> evaluate.summarize_nll's result
    steps: int | None = None
    tokens_seen: int | None = None
    train_time_s: float | None = None
    wall_time_s: float | None = None  # over every attempt of a resumed run
    tokens_per_s: float | None = None
    peak_memory_bytes: int | None = None
    peak_memory_kind: str | None = None
    untied_at_step: int | None = None  # the step at which it did split
    skipped_steps: int | None = None
    finished_at: str | None = None
    params_after_untie: dict | None = None
    checkpoint: str | None = None  # the final checkpoint, relative to the run folder
    interrupted_at_step: int | None = None
    diverged_at_step: int | None = None
    best: dict | None = None  # selection.BestTracker.summary: the best periodic validation evaluation
    final_best: dict | None = None  # train.keep_best: the final evaluation of the best weights, as `final`
    stopped_early: dict | None = None  # early stopping: the step, the budget in steps, the reason
    world_size: int | None = None  # processes of a distributed run (torchrun); absent for one
    allreduce_bytes_per_step: int | None = None  # gradient bytes all-reduced per step under DDP
    threads: dict | None = None  # CPU runs: device.threads_used, the count(s) this attempt ran at
    extra: dict = field(default_factory=dict)
    config_problem: str | None = None  # why report.json's config did not rebuild (then `config` is None)
    _stored: tuple = field(default=(None, None), repr=False)  # (the config as read, its JSON as read)

    @classmethod
    def from_json(cls, data: dict) -> "RunReport":
        names = {f.name for f in fields(cls)} - _NOT_WRITTEN
        known = {k: v for k, v in data.items() if k in names}
        known.setdefault("status", None)  # a report without a status is not a running one
        config, problem = _report_config(known.get("config"))  # its JSON is written back while it is unchanged
        return cls(**{**known, "config": config}, config_problem=problem, _stored=(config, known.get("config")),
                   extra={k: v for k, v in data.items() if k not in names})

    def to_json(self) -> dict:
        """The fields that have a value (and _ALWAYS_WRITTEN), then `extra`."""
        out = {f.name: getattr(self, f.name) for f in fields(self) if f.name not in _NOT_WRITTEN}
        read, stored = self._stored
        out["config"] = stored if self.config == read else None if self.config is None else to_dict(self.config)
        keep = {k: v for k, v in out.items() if v is not None and v != [] or k in _ALWAYS_WRITTEN}
        return {**keep, **self.extra}

    def update(self, **changes: Any) -> None:
        for key, value in changes.items():
            if not hasattr(self, key) or key in _NOT_WRITTEN:
                raise AttributeError(f"RunReport has no field {key!r}")
            setattr(self, key, value)


class RunRecord:
    """A run's report.json and report.md, kept in step: every update rewrites both atomically."""

    def __init__(self, run_dir: Path, report: RunReport):
        self.run_dir = Path(run_dir)
        self.report = report

    def write(self, **changes: Any) -> None:
        self.report.update(**changes)
        data = self.report.to_json()  # each made before its writing(): a failure there is no write's
        with writing(self.run_dir / REPORT):
            files.atomic_write_json(self.run_dir / REPORT, data)
        text = render_report_md(self.report)
        with writing(self.run_dir / REPORT_MD):
            files.atomic_write_text(self.run_dir / REPORT_MD, text)


# ------------------------------------------------------------------------- reading a folder


def read_report(run_dir: Path) -> RunReport | None:
    """report.json as a RunReport, None when there is none; a corrupt or newer report is an error."""
    path = Path(run_dir) / REPORT
    if not path.exists():
        return None
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError):
        raise DamagedRunError(f"{path} is not valid JSON (the run folder is damaged)",
                              "move it away, or start afresh with --overwrite", "move it away, or retrain the run") from None
    if not isinstance(data, dict):
        raise DamagedRunError(f"{path} is not a tiedlm report", "move the folder away, or use --overwrite",
                              "move the folder away, or retrain the run")
    check_format(data.get("format"), path)
    return RunReport.from_json(data)


def check_format(fmt: Any, path: Path) -> None:
    if isinstance(fmt, int) and fmt > FORMAT:
        raise RunError(f"{path} was written by a newer tiedlm (run format {fmt}, this one reads {FORMAT}) "
                       "— upgrade tiedlm to use this run")


def _report_config(stored: Any) -> tuple[Config | None, str | None]:
    """report.json's config rebuilt, or (None, why not); (None, None) when it holds none (config.yaml serves).
    A stored config is made the resolved Config here and in read_config only (from_dict normalises it)."""
    if not isinstance(stored, dict) or not stored:
        return None, None
    if not isinstance(stored.get("model"), dict):
        return None, f"the config in {REPORT} has no model section"
    try:
        return from_dict(stored), None
    except (ConfigError, TypeError, ValueError, AttributeError) as exc:  # a newer tiedlm's key, a hand edit
        return None, f"the config in {REPORT} does not load: {exc}"


def read_config(run_dir: Path) -> Config | None:
    """config.yaml rebuilt, None when there is none; damaged, or edited since the run
    (check_config_unedited): a DamagedRunError; not rebuilt: a ConfigError."""
    data = _config_data(run_dir)
    cfg = None if data is None else from_dict(data)
    if cfg is not None:
        check_config_unedited(run_dir, cfg, read_report(run_dir))
    return cfg


def check_config_unedited(run_dir: Path, cfg: Config, report: RunReport | None) -> None:
    """Refuse (DamagedRunError) config.yaml, read as `cfg`, when its config_hash is neither the hash
    report.json stores nor its config's: edited after the run (training writes all three from one
    Config), maybe in a key that keeps every shape (rope_theta). Keys outside the hash (threads) may
    change, as on a resume. from_dict gives an older folder's added keys their "as before" values,
    which the hash leaves out, so it compares equal (even were its stored hash of an older definition)."""
    theirs = {report.config_hash, None if report.config is None else config_hash(report.config)} if report else set()
    if not theirs - {None} or (mine := config_hash(cfg)) in theirs:
        return
    path, keys = Path(run_dir) / CONFIG, ""
    if report.config is not None:
        differ = diff_keys(variant_dict(report.config), variant_dict(cfg))
        shown = ", ".join(differ[:4]) + (f" and {len(differ) - 4} more" if len(differ) > 4 else "")
        keys = f"{shown} differ{'s' if len(differ) == 1 else ''} from the config in {REPORT}; " if differ else ""
    raise DamagedRunError(
        f"{path} was edited after the run ({keys}its hash {mine} is not the run's "
        f"{report.config_hash or config_hash(report.config)})", "restore it, or use --overwrite to start afresh "
        "with the config given", f"restore it (the run's config is in {REPORT}), or train the edited config as a "
        f"run of its own: tiedlm train --config {path} --out {Path(run_dir).parent} --name {Path(run_dir).name}-edited")


def _config_data(run_dir: Path) -> dict | None:
    """config.yaml as stored, None when there is none; a damaged one is a DamagedRunError."""
    import yaml

    path = Path(run_dir) / CONFIG
    if not path.exists():
        return None
    fixes = ("use --overwrite to start afresh", "restore it, or retrain the run")
    try:  # read_yaml_text: a regular file of bounded size (a pipe put there would hang the read)
        data = load_yaml(read_yaml_text(path, "run config"), str(path))  # duplicate keys and alias bombs refused
    except ConfigError as exc:  # its problem only: the fix load_yaml gives is for a file the user writes
        raise DamagedRunError(f"{str(exc).split(' — ', 1)[0]} (the run folder is damaged)", *fixes) from None
    except (yaml.YAMLError, UnicodeDecodeError):
        raise DamagedRunError(f"{path} is not valid YAML (the run folder is damaged)", *fixes) from None
    if not isinstance(data, dict):
        raise DamagedRunError(f"{path} is not a tiedlm config", *fixes)
    return data


def existing_state(run_dir: Path, cfg: Config) -> str:
    """What to do with a run folder for config `cfg`: 'new', 'finished' (nothing to do), or 'resume'.

    A folder holding a different config is refused with the keys that differ."""
    run_dir = Path(run_dir)
    if not run_dir.exists():
        return "new"
    report = read_report(run_dir)
    old = _config_data(run_dir)  # as stored: a key of a newer tiedlm is a difference, not an error
    if old is None and report is None:
        leftovers = [p.name for p in run_dir.iterdir() if p.name != LOCK]
        if leftovers:
            raise RunError(f"{run_dir} exists but is not a tiedlm run (it holds {', '.join(sorted(leftovers)[:3])}) "
                           "— choose another --name, or --overwrite to replace it")
        return "new"
    if old is not None and (stored := _report_config(old)[0]) is not None:  # not rebuilt: a newer key, said below
        check_config_unedited(run_dir, stored, report)
    if old is not None:
        skip = operational_keys(cfg)
        differ = [k for k in diff_keys(old, to_dict(cfg)) if k not in skip]
        if differ:
            shown = ", ".join(differ[:6]) + (f" and {len(differ) - 6} more" if len(differ) > 6 else "")
            raise ConfigMismatchError(f"{run_dir} holds a run with a different config ({shown} differ) — "
                                      "choose another --name or --seed, or --overwrite to start afresh", differ)
    return "finished" if report is not None and report.status == "finished" else "resume"


def clear_run_dir(run_dir: Path) -> None:
    """Remove a run's files for --overwrite, keeping the lock this process holds."""
    for child in Path(run_dir).iterdir():
        if child.name != LOCK:
            shutil.rmtree(child) if child.is_dir() and not child.is_symlink() else child.unlink()


# ------------------------------------------------------------------------- metrics


def append_metrics(run_dir: Path, records: list[dict]) -> None:
    """Append records; a torn last line (a kill or a full disk mid-write) is skipped on reading and
    cut away by trim_metrics on resume."""
    if not records:
        return
    path = Path(run_dir) / METRICS
    with writing(path), open(path, "a", encoding="utf-8") as f:
        for r in records:
            f.write(files.json_text(r) + "\n")
        f.flush()
        os.fsync(f.fileno())


def read_metrics(run_dir: Path) -> list[dict]:
    """Every complete record of metrics.jsonl; a torn last line (a kill mid-write) is skipped."""
    return read_metrics_counted(run_dir)[0]


def read_metrics_counted(run_dir: Path) -> tuple[list[dict], int]:
    """(read_metrics's records, how many non-blank lines were skipped as unreadable)."""
    path = Path(run_dir) / METRICS
    if not path.exists():
        return [], 0
    out, skipped = [], 0
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
        try:
            rec = json.loads(line)
        except ValueError:
            skipped += bool(line.strip())
            continue
        if isinstance(rec, dict):
            out.append(rec)
        else:
            skipped += 1
    return out, skipped


def trim_metrics(run_dir: Path, up_to_step: int) -> None:
    """Keep only the records of steps <= up_to_step (those the checkpoint covers), so that a
    resumed run's metrics.jsonl has no duplicated or missing steps."""
    path = Path(run_dir) / METRICS
    if not path.exists():
        return
    # final-evaluation records are written after the last checkpoint: a resume writes them again
    keep = [r for r in read_metrics(run_dir) if int(r.get("step", 0)) <= up_to_step and r.get("kind") != "final"]
    text = "".join(files.json_text(r) + "\n" for r in keep)
    with writing(path):
        files.atomic_write_text(path, text)


def clean_temporary_files(run_dir: Path) -> list[str]:
    """Remove what a killed writer left: `.NAME.*.tmp` files (files.replace_atomically) in the run folder
    and its checkpoints folder, and `.tmp-step-*` / `.tmp-best-step-*` folders (checkpoints.py). Only called by the
    process holding the run's lock, so no other writer can own them. Returns what was removed."""
    removed = []
    for folder in (Path(run_dir), Path(run_dir) / CHECKPOINTS):
        for child in folder.iterdir() if folder.is_dir() else []:
            stray_file = child.name.startswith(".") and child.name.endswith(".tmp") and child.is_file()
            stray_dir = child.name.startswith((".tmp-step-", ".tmp-best-step-")) and child.is_dir()
            if stray_file or stray_dir:
                with contextlib.suppress(OSError):
                    shutil.rmtree(child) if stray_dir else child.unlink()
                    removed.append(child.name)
    return removed
