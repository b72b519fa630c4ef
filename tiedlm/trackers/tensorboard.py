"""TensorBoard event files of a run, in `<run>/tb/`: a view of metrics.jsonl and report.json,
never the record itself (metrics.jsonl stays the source of truth, and `backfill` rebuilds `tb/`
from it at any time).

Scalars, at the training step: `train/loss`, `train/lr`, `train/grad_norm`, `train/tokens_per_s`
(and `train/w_out_minus_e`, `train/tie_penalty` for the soft and pull modes),
`val/loss` and `val/perplexity` (the periodic evaluation), and at the end `final/<split>/...`
(and `final_best/<split>/...` for the kept best weights); as text, the run (name, tied or
untied, the architecture where it is not gpt2, seed, variant) and its parameter breakdown. `tensorboard --logdir runs/` shows the runs
of a comparison side by side, told apart by their folder names.

Training writes through `TrainingLog`, which opens `tb/` afresh from the (trimmed) metrics.jsonl,
so that a resumed run has each step once, and which turns itself off with one line on a failed
write rather than fail the run. torch and tensorboard are imported inside functions only.

Writing `tb/` afresh removes the event files tiedlm wrote there and nothing else: tiedlm names its
event files with SUFFIX; other files and folders in `tb/` are left alone, and said so.
"""

from __future__ import annotations

import contextlib
import os
import shlex
from pathlib import Path
from typing import Any, Callable, Iterable

from .. import runs
from ..errors import ConfigError, NotARunError, RunError, TiedlmError
from ..files import describe_write_failure, first_line
from ..process import log

TB = runs.TB  # the event files' folder inside a run folder
SUFFIX = ".tiedlm"  # the end of the name of every event file tiedlm writes: how it knows its own
_EVENTS = "events.out.tfevents."  # how every TensorBoard event file's name begins
INSTALL_HINT = "pip install 'tiedlm[tensorboard]'"
# metrics.jsonl record kind -> (tag prefix, the record's fields written as scalars)
# w_out_minus_e and tie_penalty: soft and pull runs only (‖W_out − E‖ and the penalty); absent elsewhere
_SCALARS = {"train": ("train", ("loss", "lr", "grad_norm", "tokens_per_s", "w_out_minus_e", "tie_penalty")),
            "eval": ("val", ("loss", "perplexity"))}
_FINAL_FIELDS = ("loss", "perplexity", "bits_per_byte", "word_perplexity")


def require() -> None:
    """A ConfigError when TensorBoard logging cannot work here (the package is not importable)."""
    try:
        import tensorboard  # noqa: F401
        from torch.utils.tensorboard import SummaryWriter  # noqa: F401
    except ImportError:
        raise ConfigError(f"train.log_to: tensorboard needs the tensorboard package — {INSTALL_HINT}") from None


def _number(value: Any) -> float | None:
    """A value a scalar can hold (nan and infinities included); None for text, bools and nulls."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value)


def record_scalars(record: dict) -> list[tuple[str, float, int]]:
    """(tag, value, step) of one metrics.jsonl record; none for kinds TensorBoard does not show
    (final records are written from report.json, which also holds best weights scored once)."""
    kind = _SCALARS.get(record.get("kind"))
    step = record.get("step")
    if kind is None or not isinstance(step, int):
        return []
    prefix, names = kind
    values = ((f"{prefix}/{name}", _number(record.get(name))) for name in names)
    return [(tag, value, step) for tag, value in values if value is not None]


def final_scalars(report: runs.RunReport) -> list[tuple[str, float, int]]:
    """(tag, value, step) of the final evaluation: the last weights at the last step, and the
    kept best weights (train.keep_best) at the step they were kept."""
    out = []
    last = report.steps or 0
    best_step = (report.best or {}).get("step", last)
    for section, results, step in (("final", report.final, last), ("final_best", report.final_best, best_step)):
        for split, res in (results or {}).items():
            for name in _FINAL_FIELDS:
                value = _number(res.get(name)) if isinstance(res, dict) else None
                if value is not None:
                    out.append((f"{section}/{split}/{name}", value, step if isinstance(step, int) else last))
    return out


def run_texts(run_dir: Path, report: runs.RunReport) -> dict[str, str]:
    """The run and its parameter breakdown as Markdown, by text tag."""
    m = report.config.model if report.config is not None else None
    if m is None:
        tie = "input/output embeddings of an unknown tying (its config does not load)"
    else:
        untie = f", untied at {m.untie_at} of training" if m.untie_at is not None else ""
        arch = f"{m.arch} blocks, " if m.family.summary else ""  # the default family, unnamed as before
        tie = f"{arch}{m.tie.label} input/output embeddings{untie}"
    texts = {"run": f"**{Path(run_dir).name}** — {tie}; seed {report.seed}, variant {report.config_hash}"}
    if report.params:
        rows = [f"| {key} | {str(value).lower()} |" if isinstance(value, bool)  # not 0/1, as int would
                else f"| {key} | {value:,} |" if isinstance(value, int) else f"| {key} | {value} |"
                for key, value in report.params.items()]
        texts["params"] = "\n".join(["| parameters | count |", "| --- | ---: |", *rows])
    return texts


def is_own_event_file(path: Path) -> bool:
    """An event file tiedlm wrote: a plain file whose name ends with SUFFIX."""
    path = Path(path)
    return (path.name.startswith(_EVENTS) and path.name.endswith(SUFFIX) and not path.is_symlink()
            and path.is_file())


def clear_events(folder: Path) -> list[Path]:
    """Remove the event files tiedlm wrote in folder (a run's tb/); returns what else is there,
    left alone. A file (or a dangling link) where the folder belongs is refused."""
    folder = Path(folder)
    if not folder.is_dir():
        if folder.is_symlink() or folder.exists():
            raise ConfigError(f"{folder} is not a folder — tiedlm writes the run's TensorBoard event files there; "
                              "move it away, then write them again")
        return []
    left = []
    for child in sorted(folder.iterdir()):
        if is_own_event_file(child):
            child.unlink()
        else:
            left.append(child)
    return left


class EventWriter:
    """A SummaryWriter over `<run>/tb/`, from which it first removes the event files tiedlm wrote
    (clear_events); `left_alone` lists the rest."""

    def __init__(self, run_dir: Path):
        from torch.utils.tensorboard import SummaryWriter

        self.dir = Path(run_dir) / TB
        self.left_alone = clear_events(self.dir)
        self.writer = SummaryWriter(log_dir=str(self.dir), max_queue=1000, flush_secs=30, filename_suffix=SUFFIX)

    def scalars(self, items: Iterable[tuple[str, float, int]]) -> None:
        for tag, value, step in items:
            self.writer.add_scalar(tag, value, global_step=step)

    def records(self, records: Iterable[dict]) -> None:
        for record in records:
            self.scalars(record_scalars(record))

    def header(self, run_dir: Path, report: runs.RunReport) -> None:
        for tag, text in run_texts(run_dir, report).items():
            self.writer.add_text(tag, text, global_step=0)

    def final(self, report: runs.RunReport) -> None:
        self.scalars(final_scalars(report))

    def flush(self) -> None:
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()


def write_run(run_dir: Path, report: runs.RunReport, records: list[dict]) -> EventWriter:
    """`tb/` written afresh from a report and metrics records; the writer is left open."""
    writer = EventWriter(run_dir)
    try:
        writer.header(run_dir, report)
        writer.records(records)
        if report.final or report.final_best:
            writer.final(report)
        writer.flush()
    except BaseException:
        with contextlib.suppress(Exception):
            writer.close()
        raise
    return writer


class TrainingLog:
    """TensorBoard beside metrics.jsonl while a run trains. Opening it rewrites `tb/` from the
    metrics.jsonl there is (trimmed to the checkpoint on resume), so no step appears twice. A
    failure never fails the run: it is logged once and TensorBoard logging stops."""

    def __init__(self, run_dir: Path, report: runs.RunReport):
        self.run_dir = Path(run_dir)
        self.writer: EventWriter | None = None
        self.stopped = False  # after a failure
        self._guard(self._open, report)

    def append(self, records: list[dict]) -> None:
        """The records just appended to metrics.jsonl."""
        if records:
            self._guard(self._write, records, None)

    def finish(self, report: runs.RunReport) -> None:
        """The final evaluation, from the finished report."""
        self._guard(self._write, [], report)

    def close(self) -> None:
        """Flush and close; never raises (called on every way out of training)."""
        writer, self.writer = self.writer, None
        if writer is not None:
            try:
                writer.close()
            except Exception as exc:
                self._failed(exc)

    def _open(self, report: runs.RunReport) -> None:
        self.writer = write_run(self.run_dir, report, runs.read_metrics(self.run_dir))
        if self.writer.left_alone:
            names = ", ".join(p.name for p in self.writer.left_alone[:3])
            more = f" and {len(self.writer.left_alone) - 3} more" if len(self.writer.left_alone) > 3 else ""
            log(f"{self.run_dir.name}: left alone in {TB}/ (not written by tiedlm): {names}{more}")

    def _write(self, records: list[dict], report: runs.RunReport | None) -> None:
        assert self.writer is not None
        self.writer.records(records)
        if report is not None:
            self.writer.final(report)
        self.writer.flush()

    def _guard(self, write: Callable[..., None], *args: Any) -> None:
        if self.stopped:
            return
        try:
            write(*args)
        except Exception as exc:
            self._failed(exc)
            self.close()

    def _failed(self, exc: Exception) -> None:
        if not self.stopped:
            self.stopped = True
            log(f"{self.run_dir.name}: TensorBoard logging stopped ({type(exc).__name__}: {first_line(exc)}); "
                "training goes on and metrics.jsonl is complete — back-fill tb/ from it later")


# ------------------------------------------------------------------------- back-filling runs


def _is_run_dir(path: Path) -> bool:
    return (path / runs.REPORT).is_file() or (path / runs.CONFIG).is_file()


def backfill(run_dir: Path, left_alone: list[Path] | None = None) -> Path:
    """(Re)write `<run>/tb/` from the run's metrics.jsonl and report.json, finished or not,
    replacing the event files tiedlm wrote there; returns the `tb/` folder, and adds to
    `left_alone` what else `tb/` holds. Takes the run's lock, so a run that is training is
    refused rather than raced."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir() or not _is_run_dir(run_dir):
        raise NotARunError(f"{run_dir} is not a tiedlm run folder (no report.json or config.yaml) — give the "
                       "folder of a run, such as runs/<name>")
    if not (run_dir / runs.METRICS).is_file():
        raise NotARunError(f"{run_dir} has no {runs.METRICS} (the run never logged a step) — train it first, "
                           "or give another run")
    try:
        require()
    except ConfigError as exc:
        raise RunError(str(exc).replace("train.log_to: ", "")) from None
    report = runs.read_report(run_dir)
    if report is None:
        try:
            config = runs.read_config(run_dir)
        except ConfigError:  # a config that does not rebuild: the texts say so, the scalars are written
            config = None
        report = runs.RunReport(name=run_dir.name, config=config)
    try:
        with runs.RunLock(run_dir):
            writer = write_run(run_dir, report, runs.read_metrics(run_dir))
            writer.close()
            if left_alone is not None:
                left_alone += writer.left_alone
    except TiedlmError:
        raise
    except Exception as exc:  # OSError, or what the writer makes of one
        why, _ = describe_write_failure(exc)
        raise RunError(f"cannot write {run_dir / TB} ({why}) — check the free disk space and the folder's "
                       "permissions, then back-fill again") from exc
    return run_dir / TB


def run_folders(path: Path) -> list[Path]:
    """A run folder, or the run folders directly inside a folder of runs (those with metrics)."""
    path = Path(path)
    if _is_run_dir(path) or not path.is_dir():
        return [path]
    found = sorted(p for p in path.iterdir() if p.is_dir() and _is_run_dir(p) and (p / runs.METRICS).is_file())
    if not found:
        raise NotARunError(f"{path} holds no tiedlm runs with a {runs.METRICS} — give run folders or the folder "
                       "they are in (such as runs/)")
    return found


def left_alone_lines(paths: list[Path], shown: int = 5) -> list[str]:
    """What back-filling left in tb/ folders, as `tiedlm cache clear` says it: the first few, then a count."""
    lines = [f"left alone: {p} (not written by tiedlm)" for p in paths[:shown]]
    if len(paths) > shown:
        lines.append(f"left alone: {len(paths) - shown} more, not written by tiedlm")
    return lines


def backfill_many(paths: Iterable[Path], left_alone: list[Path] | None = None) -> list[Path]:
    """backfill for each run folder given (a folder of runs stands for the runs in it), in order,
    each once; returns the `tb/` folders written (and adds to `left_alone` the files in them that
    tiedlm did not write). The first failure stops, naming its run; a `tb` that is not a folder
    stops them all before any is written."""
    todo: dict[Path, Path] = {}
    for path in paths:
        for run_dir in run_folders(Path(path)):
            todo.setdefault(run_dir.resolve(), run_dir)
    for run_dir in todo.values():
        tb = run_dir / TB
        if (tb.is_symlink() or tb.exists()) and not tb.is_dir():
            clear_events(tb)  # refuses it
    return [backfill(run_dir, left_alone) for run_dir in todo.values()]


def logdir_of(written: list[Path]) -> str:
    """The folder the runs of these event files (each run/tb/events…) share, for `tensorboard
    --logdir`, quoted for a shell; '.' when they are folders of the working directory."""
    return shlex.quote(os.path.commonpath([str(Path(p).parent.parent) for p in written]) or ".")
