"""Sweeps: one base config, a grid of `--set` overrides (their cartesian product) and seeds.

A grid file (paths in it are relative to the grid file itself):

    config: base.yaml                  # the base config
    set: ["train.max_steps=200"]       # overrides applied to every run, before the grid's
    grid:                              # dotted key -> list of values; every combination is a run
      model.tie_embeddings: [true, false]
      model.n_embd: [64, 128]
      schedule:                        # a paired axis (any name): each value sets its keys together
        - {train.lr: 1.0e-3, train.warmup_steps: 100}
        - {train.lr: 3.0e-3, train.warmup_steps: 200}
    seeds: [0, 1, 2]                   # or a count: 3 means 0, 1, 2
    out: ../runs                       # the runs folder (default: runs/ in the working directory)
    name: base                         # prefix of the run names (default: the config's name)

Each run is named after its grid point and seed (`base-tie_embeddings=true-n_embd=64-s0`), so
re-running a sweep finds its finished runs and skips them. `run_sweep(grid, dry_run=True)` prints
one `tiedlm train ...` command per line instead, for `xargs -P`, GNU parallel or a job array.
"""

from __future__ import annotations

import difflib
import hashlib
import itertools
import json
import os
import re
import shlex
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, TextIO

from ..config import Config, load_config, parse_override, to_yaml
from ..errors import ConfigError
from ..formatting import shown_text
from ..config.naming import sanitize, scalar, short_keys, yaml_value
from ..config.yamlsafe import load_yaml, read_yaml_text
from .driver import tune
from .jobs import Executor, train_jobs
from .parallel import parse_jobs
from .plan import RunSource, Stage, point_overrides, point_tag
from .slurm import check_slurm_option, read_slurm_block
from .tuning import check_record_target, write_record

if TYPE_CHECKING:
    from ..compare.tuned import Tuning, TuneSpec

GRID_KEYS = ("config", "set", "grid", "seeds", "out", "name", "slurm", "tune")
# The most seeds a sweep trains at each point: a typo (seeds: 100000) would queue that many trainings
# of every point. compare --config's --seeds has the same cap (tests/test_sweep.py checks the two agree).
SEEDS_LIMIT = 1000


@dataclass
class Grid:
    path: Path  # the grid file
    config: Path  # the base config, resolved against the grid file's folder
    set: list[str] = field(default_factory=list)  # overrides for every run
    grid: dict[str, list] = field(default_factory=dict)  # dotted key -> values, in file order
    seeds: list[int] = field(default_factory=lambda: [0])
    out: Path = Path("runs")
    name: str | None = None
    slurm: dict[str, str] = field(default_factory=dict)  # sbatch options for --emit slurm (SLURM_KEYS)
    tune: TuneSpec | None = None  # each grid point tuned on validation first (tune: in the file)


@dataclass
class SweepRun:
    name: str
    seed: int
    overrides: list[str]  # grid.set followed by this grid point's
    point: dict[str, Any]  # this grid point: dotted key -> value
    cfg: Config  # the resolved Config


def _fail(path: Path, message: str) -> ConfigError:
    return ConfigError(f"{path}: {message}")


def _read_grid_file(path: Path) -> dict:
    import yaml

    try:  # a regular file of at most YAML_BYTES_LIMIT bytes; duplicate keys and deep nesting refused, as in configs
        data = load_yaml(read_yaml_text(path, "grid file"), str(path))
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" line {mark.line + 1}" if mark is not None else ""
        raise ConfigError(f"{path}{where}: invalid YAML — fix the syntax") from None
    if not isinstance(data, dict):
        raise _fail(path, "a grid file must be a mapping with config:, grid: and seeds:")
    for key in data:
        if key not in GRID_KEYS:
            close = difflib.get_close_matches(str(key), GRID_KEYS, n=1)
            hint = f" — did you mean {close[0]}?" if close else f" (the keys are {', '.join(GRID_KEYS)})"
            raise _fail(path, f"unknown key {key}{hint}")
    return data


def _overrides(path: Path, data: dict) -> tuple[list[str], dict[str, list]]:
    """set: and grid:, each key checked (an unknown one is an error with a suggestion)."""

    sets = data.get("set") or []
    if isinstance(sets, str):
        sets = [sets]
    if not isinstance(sets, list) or not all(isinstance(s, str) for s in sets):
        raise _fail(path, 'set: must be a list of "key=value" strings')
    for item in sets:
        parse_override(item)
    raw_grid = data.get("grid") or {}
    if not isinstance(raw_grid, dict):
        raise _fail(path, "grid: must map dotted keys to lists of values, e.g. model.n_embd: [64, 128]")
    grid: dict[str, list] = {}
    for key, values in raw_grid.items():
        if not isinstance(values, list):
            values = [values]
        if not values:
            raise _fail(path, f"grid: {key} has no values")
        if all(isinstance(v, dict) for v in values):  # a paired axis: each value sets several keys at once
            keys = list(values[0])
            if not keys or any(list(v) != keys for v in values):
                raise _fail(path, f"grid: the points of {key} must each set the same keys ({', '.join(map(str, keys))})")
            for k in keys:
                parse_override(f"{k}=")
        elif any(isinstance(v, dict) for v in values):
            raise _fail(path, f"grid: {key} mixes mappings and single values — give one or the other")
        else:
            parse_override(f"{key}=")
        _check_no_repeat(path, str(key), values)
        grid[str(key)] = values
    keys = [k for axis, vals in grid.items() for k in (vals[0] if isinstance(vals[0], dict) else [axis])]
    twice = sorted({str(k) for k in keys if keys.count(k) > 1})
    if twice:
        raise _fail(path, f"grid: {', '.join(twice)} is set on two axes — give it on one")
    return list(sets), grid


def _same_value(a: Any, b: Any) -> bool:
    """Whether two grid values are one value: equal as what YAML read (0.1 and 0.10 are one float, 1
    and 1.0 one number), true and 1 not; a paired axis' points key by key."""
    if isinstance(a, dict) or isinstance(b, dict):
        return isinstance(a, dict) and isinstance(b, dict) and list(a) == list(b) and all(
            _same_value(a[k], b[k]) for k in a)
    return isinstance(a, bool) == isinstance(b, bool) and a == b


def _check_no_repeat(path: Path, key: str, values: list) -> None:
    """Refuse an axis that gives one value twice: it would train one run twice under two names."""
    for i, value in enumerate(values):
        earlier = [other for other in values[:i] if _same_value(value, other)]
        if earlier:
            shown, again = _one_line_value(earlier[0]), _one_line_value(value)
            shown += f" (as {again})" if again != shown else ""
            numbers = " (values are compared as numbers: 0.1 and 0.10, or 1 and 1.0, are one)" if isinstance(
                value, (int, float)) and not isinstance(value, bool) else ""
            raise _fail(path, f"grid: {key} repeats the value {shown}{numbers} — give each value once")


def _point(combo: tuple, axes: list[str]) -> dict[str, Any]:
    """A grid point as config key -> value: a paired axis' mapping spread into its keys."""
    point: dict[str, Any] = {}
    for axis, value in zip(axes, combo):
        point.update({str(k): v for k, v in value.items()} if isinstance(value, dict) else {axis: value})
    return point


def _seeds(path: Path, seeds: Any) -> list[int]:
    if isinstance(seeds, int) and not isinstance(seeds, bool):
        if seeds < 1:
            raise _fail(path, f"seeds: a count must be at least 1, got {seeds}")
        if seeds > SEEDS_LIMIT:
            raise _fail(path, f"seeds: must be at most {SEEDS_LIMIT:,}, got {seeds:,} (each seed trains every grid "
                              "point once more) — lower it")
        seeds = list(range(seeds))
    if (not isinstance(seeds, list) or not seeds
            or not all(isinstance(s, int) and not isinstance(s, bool) for s in seeds)):
        raise _fail(path, "seeds: must be a list of integers, e.g. [0, 1, 2], or a count")
    if len(seeds) > SEEDS_LIMIT:
        raise _fail(path, f"seeds: lists {len(seeds):,} seeds, more than {SEEDS_LIMIT:,} (each seed trains every grid "
                          "point once more) — give fewer")
    if len(set(seeds)) != len(seeds):
        raise _fail(path, f"seeds: {seeds} repeats a seed")
    return list(seeds)


def load_grid(path: str | Path) -> Grid:
    """Read and check a grid file. Paths in it are taken relative to the grid file's folder."""
    path = Path(path)
    data = _read_grid_file(path)
    here = path.parent
    if not isinstance(data.get("config"), str) or not data["config"]:
        raise _fail(path, "config: must name the base config file (relative to the grid file)")
    for key in ("config", "out"):  # no path holds a NUL: the OS would refuse it mid-sweep, in every run
        if "\0" in str(data.get(key) or ""):
            raise _fail(path, f"{key}: {shown_text(str(data[key]))} holds a NUL character — give a plain path")
    config = Path(os.path.normpath(here / data["config"]))
    if not config.exists():
        raise _fail(path, f"config: {data['config']} does not exist (looked for {config}; paths are "
                          "relative to the grid file)")
    sets, grid = _overrides(path, data)
    seeds = _seeds(path, data.get("seeds", [0]))
    if "out" in data and data["out"] is not None and not str(data["out"]).strip():
        raise _fail(path, f"out: is empty ({data['out']!r}) — give the runs folder (relative to the grid file), or "
                          "leave out: out for runs/ in the working directory")
    out = Path(os.path.normpath(here / str(data["out"]))) if data.get("out") is not None else Path("runs")
    name = data.get("name")
    if name is not None and (not isinstance(name, str) or not name):
        raise _fail(path, "name: must be a string (the prefix of the run names)")
    if name is not None:  # refused as --name is, rather than cleaned into a prefix the user did not write
        from ..config.checks import check_run_name

        check_run_name(name, f"{path}: name:")
    tune = None
    if data.get("tune") is not None:
        from .tuning_spec import spec_from_block

        tune = spec_from_block(data["tune"], str(path))
        swept = {k for axis, vals in grid.items() for k in (vals[0] if isinstance(vals[0], dict) else [axis])}
        both = sorted(swept & set(tune.keys))
        if both:
            raise _fail(path, f"{', '.join(both)} is both swept (grid:) and tuned (tune:) — give it in one of them")
    return Grid(path=path, config=config, set=sets, grid=grid, seeds=seeds, out=out, name=name,
                slurm=read_slurm_block(path, data.get("slurm")), tune=tune)


def expand(grid: Grid) -> list[SweepRun]:
    """Every (grid point, seed) of the sweep as a resolved config and a unique, readable name."""

    axes = list(grid.grid)
    points = [_point(combo, axes) for combo in itertools.product(*(grid.grid[k] for k in axes))]
    short = short_keys(list(dict.fromkeys(k for p in points for k in p)))
    runs: list[SweepRun] = []
    names: set[str] = set()
    seen: dict[str, dict[str, Any]] = {}  # a resolved config's YAML -> the first point that gave it
    for point in points:
        sets = list(grid.set) + [f"{k}={yaml_value(v)}" for k, v in point.items()]
        for seed in grid.seeds:
            try:
                cfg = load_config(grid.config, sets, seed=seed)
            except ConfigError as exc:
                raise ConfigError(f"{grid.path}: grid point {_where(point)}: {exc}") from None
            prefix = grid.name or cfg.name
            label = "-".join(f"{short[k]}={scalar(v)}" for k, v in point.items())
            first = seen.setdefault(to_yaml(cfg), point)
            if first is not point:  # two values the config reads alike (n_kv_head = n_head and none): one run
                raise ConfigError(f"{grid.path}: grid points {_where(first)} and {_where(point)} give one config — "
                                  "the same run would train twice under two names; give each value once")
            name = sanitize("-".join(p for p in (prefix, label, f"s{seed}") if p))
            if name in names:  # two values that sanitise alike: make the name unique, stably
                digest = hashlib.sha256(repr(sorted(point.items(), key=str)).encode()).hexdigest()[:6]
                name = sanitize(f"{prefix}-{label}-{digest}-s{seed}")
            names.add(name)
            runs.append(SweepRun(name=name, seed=seed, overrides=sets, point=point, cfg=cfg))
    return runs


def _where(point: dict[str, Any]) -> str:
    return ", ".join(f"{k}={_one_line_value(v)}" for k, v in point.items()) or "the base config"


def _one_line_value(value: Any) -> str:
    """A grid value in a message, as YAML writes it unless that takes more than one line."""
    text = yaml_value(value)
    return text if _line_break(text) is None else json.dumps(value, default=str)


def _shown(path: Path) -> str:
    """A path for a printed command: relative to the working directory when it is under it."""
    rel = os.path.relpath(Path(path).resolve(), Path.cwd())
    return rel if not rel.startswith("..") else str(Path(path).resolve())


# A sharded run (train.parallel: fsdp) is one torchrun job of as many processes as the task has GPUs.
FSDP_LAUNCH = ["torchrun", "--standalone", "--nproc_per_node=gpu", "-m", "tiedlm"]


def _command(grid: Grid, run: SweepRun) -> list[str]:
    launch = FSDP_LAUNCH if run.cfg.train.parallel == "fsdp" else ["tiedlm"]
    cmd = [*launch, "train", "--config", _shown(grid.config)]
    for item in run.overrides:
        cmd += ["--set", item]
    return cmd + ["--seed", str(run.seed), "--name", run.name, "--out", _shown(grid.out)]


def sweep_commands(grid: Grid) -> list[list[str]]:
    """One `tiedlm train ...` argument list per run of the sweep."""
    return [_command(grid, run) for run in expand(grid)]


@dataclass
class SweepEntry:
    """What became of one run of a sweep."""

    name: str
    status: str  # skipped (finished already) | finished | failed
    error: str | None
    seed: int
    point: dict[str, Any]  # the grid point: dotted key -> value
    path: str  # the run folder


@dataclass
class SweepSummary:
    """A sweep's outcome: one entry per run, or with dry_run the commands it printed."""

    dry_run: bool
    out: str  # the runs folder
    total: int  # runs in the sweep
    runs: list[SweepEntry] = field(default_factory=list)
    commands: list[str] = field(default_factory=list)  # dry_run: one shell-quoted command per run
    tuning: Tuning | None = None  # a tuned sweep's: each grid point's chosen values

    @property
    def failed(self) -> list[str]:
        """The names of the runs that failed (the CLI exits 1 when there are any)."""
        return [e.name for e in self.runs if e.status == "failed"]

    @property
    def trained(self) -> int:
        return sum(e.status == "finished" for e in self.runs)

    @property
    def skipped(self) -> int:
        return sum(e.status == "skipped" for e in self.runs)


def run_sweep(grid: Grid, dry_run: bool = False, progress: bool = True, stream: TextIO | None = None,
              train: Callable[..., Any] | None = None, jobs: int | str = 1) -> SweepSummary:
    """Run every point of the grid one after another (finished runs skipped, failures noted and
    passed over), or with dry_run print the commands, one per line, shell-quoted. `train` trains
    one run (train.train_run, the default, or a stand-in with its signature). `jobs` (--jobs): train
    that many runs at once, each in its own process, or "auto" (parallel.py); 1: one after another."""
    jobs = parse_jobs(jobs)
    if grid.tune is not None:
        if dry_run:
            raise _tuned_cannot_list(grid)
        return _run_tuned(grid, progress, train, jobs)
    if dry_run:
        check_one_line(grid)  # before the grid points are resolved, whose errors quote the values
    runs = expand(grid)
    summary = SweepSummary(dry_run=dry_run, out=str(grid.out), total=len(runs))
    if dry_run:
        commands = [_command(grid, r) for r in runs]
        check_one_line(grid, commands)  # and every word of every command, before the first line is printed
        summary.commands = [shlex.join(c) for c in commands]
        for line in summary.commands:
            print(line, file=stream or sys.stdout)
        return summary
    from ..train import train_run

    results = train_jobs([(r.name, r.cfg) for r in runs], grid.out, progress, train=train or train_run, parallel=jobs)
    summary.runs = [SweepEntry(name=res.name, status=res.status, error=res.error, seed=run.seed, point=run.point,
                               path=str(grid.out / run.name)) for run, res in zip(runs, results)]
    return summary


# What cannot stand on one line of `--dry-run` / `--emit shell`, whose consumers (xargs -d '\n',
# parallel, a `while read` loop) take each line as one command: quoting keeps a newline inside one
# word for the shell, but the line is cut there all the same, and what follows it runs as a command
# of its own. These are the characters str.splitlines() breaks at, and NUL, which no argument holds.
LINE_BREAKS = "\n\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029\x00"


def _line_break(text: str) -> str | None:
    return next((c for c in text if c in LINE_BREAKS), None)


def _strings(value: Any):
    """Every string inside a grid value (a list or mapping value too, keys included)."""
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for k, v in value.items():
            yield from _strings(k)
            yield from _strings(v)
    elif isinstance(value, list):
        for v in value:
            yield from _strings(v)


def check_one_line(grid: Grid, commands: list[list[str]] = ()) -> None:
    """Refuse, before a command is printed, a config: or out: path, set: item or grid value that
    holds a line break (LINE_BREAKS): each emitted command must be exactly one line."""
    sources: list[tuple[str, str, str]] = [
        ("config:", _shown(grid.config), "move or rename the file to a path without one"),
        ("out:", _shown(grid.out), "give a folder path without one")]
    sources += [("set:", item, "give the value on one line") for item in grid.set]
    for axis, values in grid.grid.items():
        for value in values:
            pairs = value.items() if isinstance(value, dict) else [(axis, value)]
            sources += [(f"grid: {k}", text, "give the value on one line")
                        for k, v in pairs for text in _strings(v)]
    sources += [("the emitted command", arg, "give every value on one line") for cmd in commands for arg in cmd]
    for where, text, fix in sources:
        char = _line_break(text)
        if char is not None:
            raise _fail(grid.path, f"{where} {shown_text(text)} holds {json.dumps(char)}, which cannot be written "
                                   f"on one line of the emitted commands (each line is run as one command) — {fix}")


def check_options(emit: str | None, slurm: dict, jobs: str | None, dry_run: bool) -> int | str:
    """The options of `tiedlm sweep`: --emit known, the --emit slurm ones only with it, --jobs (a
    number or auto, parallel.parse_jobs) only when the sweep trains. Returns --jobs' value."""
    if emit not in (None, "shell", "slurm"):
        raise ConfigError(f"--emit {emit!r} is not known — choose shell or slurm")
    given = ["--" + k.replace("_", "-") for k, v in slurm.items() if v is not None]  # an empty value is given too
    if given and emit != "slurm":  # (and refused by slurm_script's checks)
        raise ConfigError(f"{given[0]} only applies with --emit slurm — add it or drop {given[0]}")
    n = parse_jobs(jobs)
    if jobs is not None and (dry_run or emit is not None):
        raise ConfigError("--jobs only applies when the sweep trains its runs — drop --jobs, or --dry-run/--emit")
    return n


def _tuned_cannot_list(grid: Grid) -> ConfigError:
    return ConfigError(f"{grid.path}: a tuned sweep (tune:) chooses its runs as it goes, so they cannot be listed in "
                       "advance — run it with tiedlm sweep GRID, or drop the tune: block to emit the grid")


def _run_tuned(grid: Grid, progress: bool, train: Callable[..., Any] | None, jobs: int | str = 1) -> SweepSummary:
    """Each grid point a variant of its own tuning (tuning.TuningSearch on the tuning seeds, a stage
    at a time), then every seed at each point's chosen values."""
    from ..train import train_run

    check_record_target(grid.out)  # refused: nothing trained
    base = load_config(grid.config, grid.set)
    axes = list(grid.grid)
    points = [_point(combo, axes) for combo in itertools.product(*(grid.grid[k] for k in axes))]
    short = short_keys(list(dict.fromkeys(k for p in points for k in p)))
    variants = [(sanitize("-".join(f"{short[k]}={scalar(v)}" for k, v in p.items())) or "tuned",
                 [f"{k}={yaml_value(v)}" for k, v in p.items()]) for p in points]
    prefix = grid.name or base.name
    source = RunSource(grid.config, tuple(grid.set), prefix, where=str(grid.path))
    executor = Executor(grid.out, progress, train=train or train_run, parallel=jobs, may_grow=True)
    with executor:  # the --jobs workers serve every stage
        tuning = tune(executor, grid.tune, variants, source, grid.out, grid.seeds[0], base)
        tuned_short = short_keys(tuning.keys)
        final = []  # (variant, grid point, seed, run)
        for (tag, _), point, v in zip(variants, points, tuning.variants):
            if v.chosen is None:
                continue
            label = point_tag(v.chosen.point, tuned_short)
            for seed in grid.seeds:
                final.append((v, point, seed, source.run(f"{tag}-{label}" if label else tag, v.overrides + point_overrides(
                    v.chosen.point, tuning.schedule), seed)))
        executor.may_grow = False  # the last stage: every run is known
        executor.run(Stage("every seed at each point's choice", [run for *_, run in final]))
    write_record(grid.out, tuning, [run.name for *_, run in final])
    summary = SweepSummary(dry_run=False, out=str(grid.out), total=len(final), tuning=tuning)
    for v, point, seed, run in final:
        res = executor.results.get(run.name)
        summary.runs.append(SweepEntry(name=run.name, status=res.status if res else "skipped",
                                       error=res.error if res else None, seed=seed,
                                       point={**point, **v.chosen.point}, path=str(grid.out / run.name)))
    for v in tuning.variants:
        if v.chosen is None:
            summary.runs.append(SweepEntry(name=f"{prefix}-{v.tag}", status="failed", seed=grid.seeds[0],
                                           error="no point of its tuning grid finished training", point={},
                                           path=str(grid.out)))
    return summary


_JOB_NAME = re.compile(r"[A-Za-z0-9_.=+-]+")


def slurm_script(grid: Grid, options: dict[str, str] | None = None) -> str:
    """An sbatch job-array script: one array task per run, its index selecting the run's `tiedlm
    train` command; logs per task in the submission folder. Options (SLURM_KEYS) come from the
    grid file's slurm: and `options` (the command line's, which win). Re-submitting it is safe:
    finished runs are skipped and interrupted ones resume from their last checkpoint."""
    # Every value of an #SBATCH line passes Slurm's grammar (check_slurm_option): sbatch, not bash,
    # reads those lines, so they hold single tokens that need no quoting. The command lines are
    # shell-quoted (shlex) and the grid's path, in a comment, is written with its newlines escaped.
    if grid.tune is not None:
        raise _tuned_cannot_list(grid)
    given = {k: v for k, v in (options or {}).items() if v is not None}
    opts = {k: check_slurm_option(k, v, f"--{k.replace('_', '-')}") for k, v in given.items()}
    opts = {**{k: check_slurm_option(k, v, f"{grid.path}: slurm: {k}") for k, v in grid.slurm.items()}, **opts}
    runs = expand(grid)
    names = [r.name for r in runs]
    if len(set(names)) != len(names):
        twice = sorted({n for n in names if names.count(n) > 1})
        raise ConfigError(f"two runs of the sweep resolve to the same run folder ({twice[0]}) — give the grid "
                          "values that differ in their names, or a name: per sweep")
    job = sanitize(grid.name or runs[0].cfg.name) if runs else "tiedlm"
    if not _JOB_NAME.fullmatch(job):  # sanitize() keeps letters, digits and . _ = + - only: never taken
        job = "tiedlm"
    lines = ["#!/bin/bash", f"#SBATCH --job-name={job}", f"#SBATCH --array=0-{len(runs) - 1}",
             "#SBATCH --output=%x-%A_%a.out"]
    lines += [f"#SBATCH --{k.replace('_', '-')}={v}" for k, v in opts.items()]
    lines += [f"# {len(runs)} runs of {json.dumps(_shown(grid.path))}, one per array task. Submit with: sbatch "
              "THIS_FILE",
              "# Re-submitting is safe: finished runs are skipped, interrupted ones resume from their last checkpoint.",
              "set -euo pipefail", f"cd {shlex.quote(str(Path.cwd()))}", 'case "${SLURM_ARRAY_TASK_ID:?not in a job array}" in']
    lines += [f"  {i}) {shlex.join(_command(grid, r))} ;;" for i, r in enumerate(runs)]
    lines += ['  *) echo "no run for array task $SLURM_ARRAY_TASK_ID" >&2; exit 2 ;;', "esac"]
    return "\n".join(lines) + "\n"


def format_sweep_summary(summary: SweepSummary) -> str:
    """A few lines for the terminal: counts, failures, and how to compare the results."""
    if summary.dry_run:
        return f"{summary.total} commands"
    lines = [f"sweep: {summary.total} runs — {summary.trained} trained, {summary.skipped} already "
             f"finished, {len(summary.failed)} failed"]
    lines += [f"  failed {e.name}: {e.error}" for e in summary.runs if e.status == "failed"]
    if summary.tuning is None:
        lines.append(f"compare them with: tiedlm compare {shlex.quote(summary.out)}")
        return "\n".join(lines)
    t = summary.tuning
    if t.only_point is not None:
        from ..compare.tuned import not_compared

        lines.append(f"not tuned: {not_compared(t.keys, t.only_point)} ({t.runs} tuning runs)")
        lines.append(f"compare the runs (each point at {t.only_point}, on test) with: tiedlm compare "
                     f"{shlex.quote(summary.out)}")
        return "\n".join(lines)
    lines.append(f"tuned on validation ({t.selection}; {', '.join(t.keys)}; {t.runs} tuning runs):")
    for v in t.variants:
        if v.chosen is not None:
            ppl = f"{v.chosen.perplexity:.2f}" if v.chosen.perplexity is not None else "–"
            lines.append(f"  {v.tag}: {v.chosen.label} (validation perplexity {ppl})"
                         + (f"; edge: {v.edge}" if v.edge else ""))
    lines.append(f"compare the tuned runs (each point at its chosen values, on test; {summary.out}/tuning.json says "
                 f"which they are) with: tiedlm compare {shlex.quote(summary.out)}")
    return "\n".join(lines)
