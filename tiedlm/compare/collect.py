"""Finding and reading finished runs, through runs/ (the one module that knows the run folder).

discover turns the paths a user gave (run folders, folders of runs, globs; default: every run
under the runs folder) into run folders; load_run reads one into a LoadedRun, or says in a few
words why it is left out (unfinished, failed, damaged, not a run folder).
"""

from __future__ import annotations

import dataclasses
import glob
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from .. import runs as run_folder
from ..config import Config
from ..config.identity import config_hash
from ..errors import DamagedRunError, NotARunError, RunError, TiedlmError
from ..runs.human_report import overtrained_text
from ..perplexity import perplexity
from .stats import number
from ..errors import ConfigError

COMPARE_DIR = "compare"  # the folder every comparison went to before compare-NAME/ (naming.comparison_folder)
COMPARISON_JSON = "comparison.json"  # the comparison in its folder (report.FILES["json"] is this)


@dataclass
class LeftOut:
    """A path given (or found) that is not compared, and why."""

    path: str
    name: str
    reason: str


@dataclass
class LoadedRun:
    """A finished run as the comparison sees it: its report, cleaned of hand-edited oddities."""

    name: str  # the folder's name (not the report's: a folder may have been renamed)
    path: str
    seed: int
    config: Config  # the resolved config, as runs.read_report (or read_config) rebuilt it
    config_hash: str  # recomputed from the config, so that older runs group with newer ones
    report: run_folder.RunReport
    final: dict[str, dict]  # split -> final metrics; every split's "buckets" is a list
    params: dict  # the report's parameter breakdown ({} when it has none)
    curve: list[tuple[float, float]]  # validation (tokens seen, perplexity) during training
    notes: list[str]  # what could not be read, for the comparison's notes
    data_identity: dict | None  # report.json's data_identity: fingerprint and tokenizer key
    best: dict | None = None  # report.json's `best`: the best periodic validation evaluation
    final_best: dict[str, dict] | None = None  # the final evaluation of the kept best weights (keep_best)
    weights: str = "last"  # whose scores `final` holds: the last weights, or the kept best ones
    analysis: dict | None = None  # analysis.json (tiedlm analyze) of the final checkpoint, where there is one
    analysis_note: str | None = None  # why an analysis.json there is not used (compare --analyze replaces it)
    data_alias: dict | None = None  # the same two keys by the files' modification times (data.data_identity)
    start_identity: dict | None = None  # report.json's start_identity: the files the model started from, by content

    def metric(self, split: str, key: str) -> float | None:
        section = self.final.get(split)
        return number(section.get(key)) if section else None

    def at_unigram(self, split: str) -> bool:
        """Whether its loss on split is not below its training split's unigram model's: it has not
        learned from context (compare.guards)."""
        loss, unigram = self.metric(split, "loss"), self.metric(split, "unigram_loss")
        return loss is not None and unigram is not None and loss >= unigram

    @property
    def adapted(self) -> bool:
        """Whether it started from a checkpoint, scored eval.also or added tokens: what the
        comparison's adaptation table (compare/adaptation.py) reports."""
        new_tokens = any(isinstance(s, dict) and s.get("new_tokens") for s in self.final.values())
        return bool((self.params.get("start") or {}).get("start") or self.report.also or new_tokens)

    def bucket_names(self, split: str) -> list[str]:
        section = self.final.get(split) or {}
        return [b["name"] for b in section.get("buckets", [])
                if isinstance(b, dict) and isinstance(b.get("name"), str)]

    def bucket(self, split: str, name: str) -> dict | None:
        section = self.final.get(split) or {}
        return next((b for b in section.get("buckets", []) if isinstance(b, dict) and b.get("name") == name), None)


# ============================================================================ one run


def _reason_from_report(report: run_folder.RunReport) -> str:
    status, error = report.status, report.error
    text = f"status {status}" if status else f"{run_folder.REPORT} has no status"
    if error:
        text += f": {first_words(error)}"
    hint = {"running": " (still training, or killed: run the same train command again to resume)",
            "interrupted": " (run the same train command again to resume)",
            "diverged": " (training loss became non-finite; lower train.lr or raise warmup_steps)"}
    return text + hint.get(str(status), "")


def _read_curve(run_dir: Path) -> tuple[list[tuple[float, float]], list[str]]:
    """Validation (tokens, perplexity) points from metrics.jsonl, and notes on unreadable lines."""
    metrics = run_folder.METRICS
    if not (run_dir / metrics).exists():
        return [], [f"{run_dir.name}: no {metrics}, so no learning curve"]
    try:
        records, bad = run_folder.read_metrics_counted(run_dir)
    except OSError as exc:
        return [], [f"{run_dir.name}: cannot read {metrics} ({exc}), so no learning curve"]
    points: list[tuple[float, float]] = []
    for rec in records:
        if rec.get("kind") == "eval" and rec.get("split", "validation") == "validation":
            tokens, ppl = number(rec.get("tokens")), number(rec.get("perplexity"))
            if ppl is None and number(rec.get("loss")) is not None:
                ppl = perplexity(rec["loss"])
            if tokens is not None and ppl is not None:
                points.append((tokens, ppl))
    notes = [f"{run_dir.name}: skipped {bad} unreadable line{'s' if bad != 1 else ''} of {metrics}"] if bad else []
    return sorted(points), notes


def _recorded_identity(ident: Any) -> dict | None:
    if not isinstance(ident, dict):
        return None
    core = {"fingerprint": ident.get("fingerprint"), "tokenizer": ident.get("tokenizer")}  # data.core_identity
    return core if any(v is not None for v in core.values()) else None


def _read_file(read: Callable[[Path], Any], run_dir: Path, name: str) -> tuple[Any, str | None]:
    """(read(run_dir), None), or (None, why) when the file is damaged or cannot be read."""
    try:
        return read(run_dir), None
    except DamagedRunError as exc:  # compare's --overwrite retrains with --config, it does not repair
        return None, f"unreadable {name}: {exc.for_reader()}"
    except TiedlmError as exc:
        return None, f"unreadable {name}: {exc}"
    except OSError as exc:
        return None, f"cannot read {name}: {exc}"


def _read(run_dir: Path) -> tuple[run_folder.RunReport | None, str | None]:
    """The finished report of a run folder, or why there is none."""
    report_file, config_file = run_folder.REPORT, run_folder.CONFIG
    if not run_dir.exists():
        return None, "does not exist"
    if not run_dir.is_dir():
        return None, "is not a folder"
    report, why = _read_file(run_folder.read_report, run_dir, report_file)
    if why:
        return None, why
    if report is None:
        if (run_dir / config_file).exists():
            return None, f"no {report_file} yet (training has not finished its first report, or crashed early)"
        if is_comparison_folder(run_dir):
            return None, f"a comparison's folder ({COMPARISON_JSON}), not a run: compare the runs it compared"
        return None, f"not a run folder (no {report_file} or {config_file})"
    if report.status != "finished":
        return None, _reason_from_report(report)
    return report, None


def _config_of(run_dir: Path, report: run_folder.RunReport) -> tuple[Config | None, str | None]:
    """The resolved config: report.json's, else config.yaml's; or why there is none."""
    if report.config is not None or report.config_problem:
        return report.config, report.config_problem
    config, why = _read_file(run_folder.read_config, run_dir, run_folder.CONFIG)
    if why is None and config is None:
        why = f"no config in {run_folder.REPORT} and no {run_folder.CONFIG}"
    return config, why


def load_run(run_dir: str | Path) -> tuple[LoadedRun | None, str | None]:
    """(run, None) for a finished, readable run; (None, reason) for one to leave out."""
    run_dir = Path(run_dir)
    report, why = _read(run_dir)
    if report is None:
        return None, why
    config, why = _config_of(run_dir, report)
    if config is None:
        return None, why
    final = _final_section(report.final)
    if not final:
        return None, f"{run_folder.REPORT} has no final evaluation (final.validation / final.test)"
    seed = report.seed if report.seed is not None else config.seed
    if not isinstance(seed, int) or isinstance(seed, bool):
        return None, f"{run_folder.REPORT} has no integer seed"
    curve, notes = _read_curve(run_dir)
    analysis, analysis_note = current_analysis(run_dir, report)
    recorded = report.data_identity if isinstance(report.data_identity, dict) else {}
    return LoadedRun(name=run_dir.name, path=str(run_dir), seed=seed, config=config, config_hash=config_hash(config),
                     report=report, final=final, params=report.params if isinstance(report.params, dict) else {},
                     curve=curve, notes=notes, data_identity=_recorded_identity(recorded),
                     best=report.best if isinstance(report.best, dict) else None,
                     final_best=_final_section(report.final_best) or None, analysis=analysis,
                     analysis_note=analysis_note,
                     data_alias=_recorded_identity(recorded.get("by_mtime")),
                     start_identity=report.start_identity if isinstance(report.start_identity, dict) else None), None


def current_analysis(run_dir: Path, report: run_folder.RunReport) -> tuple[dict | None, str | None]:
    """The run's analysis.json when it analysed the final checkpoint on validation; (None, why) otherwise."""
    from ..analyze import read_analysis

    analysis = read_analysis(run_dir)
    if analysis is None:
        return None, None
    final = Path(str(report.checkpoint or "")).name
    if analysis.get("checkpoint") != final:
        return None, (f"{run_dir.name}: its analysis.json is of {analysis.get('checkpoint')}, not the final "
                      f"checkpoint {final} — run tiedlm analyze again (or compare --analyze)")
    if analysis.get("split") != "validation":
        return None, (f"{run_dir.name}: its analysis.json scored the direct path on {analysis.get('split')}, and the "
                      "comparison shows validation — run tiedlm analyze again without --split (or compare --analyze)")
    return analysis, None


def _final_section(final: Any) -> dict[str, dict]:
    """report.json's final (or final_best): split -> metrics, tolerant of hand-edited reports
    (buckets must be a list of dicts)."""
    out = {k: v for k, v in final.items() if isinstance(v, dict)} if isinstance(final, dict) else {}
    return {k: v if isinstance(v.get("buckets"), list) else {**v, "buckets": []} for k, v in out.items()}


# ============================================================================ which weights


SELECT = ("best", "final")


def choose_weights(runs: list[LoadedRun], select: str | None,
                   primary: str | None) -> tuple[list[LoadedRun], list[LeftOut], str, str, str]:
    """(the runs with `final` holding the selected weights' scores, runs left out, the selection,
    why, the primary split).

    --select best compares the weights each run kept at its best validation evaluation; since
    validation chose them, their validation scores are biased low and the verdict is on test.
    The default is best when every run kept its best weights and scored test with them (and
    --primary is not validation), else final."""

    kept = [r for r in runs if r.final_best]
    if select is None:
        if primary == "validation":
            select, why = "final", "--primary validation: validation chose the best weights, so only the last are fair"
        elif runs and len(kept) == len(runs) and all("test" in r.final_best for r in kept):
            select, why = "best", "every run kept its best weights (train.keep_best)"
        else:
            missing = len(runs) - len(kept)
            select, why = "final", (f"{missing} of {len(runs)} runs kept no best weights (train.keep_best: false)"
                                    if missing else "the kept best weights were not scored on test (eval.splits)")
    else:
        why = "chosen on the command line"
    if select == "final":
        return runs, [], "final", why, primary or "validation"
    if primary == "validation":
        raise ConfigError("--select best with --primary validation: validation chose each run's best weights, so "
                          "its scores of them are biased low — use --primary test, or --select final")
    left = [LeftOut(r.path, r.name, "kept no best weights (train.keep_best: false), and --select best compares "
                    "only those") for r in runs if not r.final_best]
    if runs and not kept:  # the generic "train some first" would point the wrong way
        raise RunError(f"the {len(runs)} finished run{'s' * (len(runs) != 1)} kept no best weights (train.keep_best: "
                       "false), and --select best compares only those — use --select final, or train with "
                       "train.keep_best: true")
    if primary is None and kept and not any("test" in r.final_best for r in kept):
        raise ConfigError("--select best judges on test (validation chose the weights), and no run scored test with "
                          "its best weights — add test to eval.splits and retrain, or use --select final")
    chosen = [dataclasses.replace(r, final=r.final_best, weights="best") for r in kept]
    return chosen, left, "best", why, primary or "test"


def first_words(text: str, limit: int = 400) -> str:
    """A run's error as a reason: its first line, cut at a word before `limit` characters."""
    line = str(text).strip().splitlines()[0] if str(text).strip() else ""
    return line if len(line) <= limit else line[:limit].rsplit(" ", 1)[0] + " …"


def load_runs(run_dirs: list[Path], left_out: list[LeftOut],
              failed: dict[str, str] | None = None) -> tuple[list[LoadedRun], list[LeftOut]]:
    """The finished runs among run_dirs, and every run left out (after left_out) with its reason.
    `failed` maps the names of runs whose training just failed to the error: such a folder is
    left out even when it holds a finished run (of an older config, say)."""
    loaded, skipped = [], list(left_out)
    for d in run_dirs:
        run, reason = load_run(d)
        error = (failed or {}).get(Path(d).name)
        if run is not None and error:
            run, reason = None, "training this run failed"
        if run is None:  # the error said once: a failed run's report already holds its first line
            said = error is None or first_words(error) in reason
            skipped.append(LeftOut(str(d), Path(d).name, reason if said else f"{reason}: {error}"))
        else:
            loaded.append(run)
    return loaded, skipped


# the reasons a path given or found is no run at all (the user's argument), not a run that ended badly
NOT_A_RUN = ("does not exist", "is not a folder", "not a run folder", "no run folder matches", "a comparison's folder")


def no_runs_error(run_dirs: list[Path], skipped: list[LeftOut], runs_dir: Path) -> RunError:
    """The error when nothing is left to compare: where it looked, and the first reasons."""
    where = ", ".join(str(d) for d in run_dirs[:3]) if run_dirs else str(runs_dir)
    left = (f" ({len(skipped)} left out: " + "; ".join(f"{s.name}: {s.reason}" for s in skipped[:3])
            + ("; ..." if len(skipped) > 3 else "") + ")") if skipped else ""
    # One rule for the exit code: 2 for what the user typed (paths that hold no run at all), 1 for
    # what happened (runs found that failed, diverged, were interrupted, are still running or damaged).
    folders = [Path(s.path) for s in skipped if s.reason.startswith("a comparison's folder")]
    if folders and len(folders) == len(skipped):  # a comparison given as runs: its runs, by their shared name
        runs = shlex.quote(str(folders[0].parent / f"{folders[0].name.removeprefix('compare-')}-*"))
        return NotARunError(f"{folders[0]} is a comparison's folder, not a run — compare its runs instead "
                            f"(tiedlm compare {runs}), or read it with tiedlm.load_results")
    if any(not s.reason.startswith(NOT_A_RUN) for s in skipped):
        return RunError(f"no finished runs to compare in {where}{left} — none of the runs found finished: resume "
                        "or retrain them as their reasons say, then compare again")
    return NotARunError(f"no finished runs to compare in {where}{left} — train some first: "
                        "tiedlm compare --config configs/base.yaml (trains tied and untied), or "
                        "tiedlm train --config CONFIG --seed N")


# ============================================================================ finding run folders


def _has_glob(text: str) -> bool:
    return any(ch in text for ch in "*?[")


def _is_run_folder(path: Path) -> bool:
    return (path / run_folder.REPORT).exists() or (path / run_folder.CONFIG).exists()


def _dedupe(paths: list[Path]) -> list[Path]:
    unique, seen = [], set()
    for p in paths:
        key = p.resolve()
        if key not in seen:
            seen.add(key)
            unique.append(p)
    return unique


def is_comparison_folder(path: Path) -> bool:
    """A folder compare wrote (compare/, compare-NAME/, or any holding a comparison.json), not a run."""
    path = Path(path)
    return not _is_run_folder(path) and (path.name == COMPARE_DIR or (path / COMPARISON_JSON).exists())


def discover(paths: list[str | Path] | None, runs_dir: Path, out: Path | None) -> tuple[list[Path], list[LeftOut]]:
    """Run folders to read, and entries left out before reading (paths that match nothing); the
    comparison's own folder `out` and every other comparison's folder are never taken for runs."""
    found: list[Path] = []
    missing: list[LeftOut] = []
    skip = {Path(out).resolve()} if out is not None else set()

    def children(parent: Path) -> list[Path]:
        return [c for c in sorted(parent.iterdir())
                if c.is_dir() and not c.name.startswith(".") and c.resolve() not in skip and _is_run_folder(c)
                and not (c.name == COMPARE_DIR and not (c / run_folder.CONFIG).exists())]  # a run may be named compare

    if not paths:
        runs_dir = Path(runs_dir)
        if not runs_dir.is_dir():
            raise NotARunError(f"no runs folder {runs_dir} — train runs first, e.g. "
                           "tiedlm compare --config configs/base.yaml")
        return _dedupe(children(runs_dir)), missing
    for item in paths:
        text = str(item)
        matches = sorted(Path(p) for p in glob.glob(text)) if _has_glob(text) else [Path(text)]
        matches = [m for m in matches if m.resolve() not in skip and not (_has_glob(text) and is_comparison_folder(m))]
        if not matches:
            missing.append(LeftOut(text, Path(text).name,
                                   "no run folder matches" if _has_glob(text) else "does not exist"))
        for m in matches:
            if m.is_dir() and not _is_run_folder(m) and children(m):
                found.extend(children(m))  # a folder of runs, like runs/
            else:
                found.append(m)
    return _dedupe(found), missing


def overtrained_notes(runs: list[LoadedRun], select: str) -> list[str]:
    """With the last weights compared, one note per run whose last validation evaluation ended
    more than the margin above its best: how much of the comparison is over-training."""
    if select != "final":
        return []
    notes = []
    for r in runs:
        if r.best and r.best.get("overtrained"):
            fix = ("compare --select best to compare its best weights" if r.final_best else
                   "train with train.keep_best: true and compare --select best to compare the best weights")
            notes.append(f"`{r.name}` is {overtrained_text(r.best)}; its last weights are compared — {fix}")
    return notes
