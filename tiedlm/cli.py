"""The `tiedlm` command. Each command parses its options, calls one library function, and turns
a TiedlmError into a one-line message on stderr and an exit code (2 usage/config, 1 runtime,
130/143 interrupted). `--debug` shows the traceback instead. The modules behind the commands
(compare, experiment, train, data, evaluate, export, analyze, params, runs, config, tensorboard)
are imported inside them: some bring numpy, and compare's package alone takes about as long to
import as this whole module, so `tiedlm --help` stays instant. The light modules the commands use
(checks, files, distributed, errors, and generate, which imports torch inside its functions) are
imported here."""

from __future__ import annotations

import json
import math
import os
import sys
import traceback
from pathlib import Path
from typing import Any, Callable, List, Optional

import typer
from typer.core import TyperCommand, TyperGroup

from . import __version__
from .config.checks import (
    VOCAB_LIMIT,
    check_at_most,
    check_device,
    check_folder_option,
    check_positive,
    check_run_name,
    check_seed,
    check_split,
)
from .device import keep_freed_memory, set_thread_env
from .distributed import is_main_process, leaves_errors_to_rank_0
from .errors import ConfigError, DamagedRunError, Interrupted, TiedlmError
from .files import json_text, os_error_line
from .generate import SampleOptions, sample_run

# Before any command imports torch: its OpenMP pool reads the variables once, when it loads
# (the `tiedlm` script starts here, not in __main__).
set_thread_env()
keep_freed_memory()  # glibc's malloc keeps what a step frees for the next step (device.py)

# click's UsageError (the base of typer's public BadParameter), from whichever click typer uses:
# recent typer versions vendor their own copy, so `import click` would catch nothing.
_UsageError = next(c for c in typer.BadParameter.__mro__ if c.__name__ == "UsageError")


def _plain_help(option):
    """--help is a flag: shown without a value (typer would show `--help <bool>`)."""
    if option is not None:
        option.metavar = ""
    return option


class _Command(TyperCommand):
    def get_help_option(self, ctx):
        return _plain_help(super().get_help_option(ctx))


class _OneLineUsageErrors(TyperGroup):
    """Usage errors that click finds itself (a value that is not an integer, an unknown option or
    command, a missing --config) as one line with exit 2, like every other error, not a usage box."""

    def get_help_option(self, ctx):
        return _plain_help(super().get_help_option(ctx))

    def make_context(self, *args, **kwargs):  # the options before the command
        try:
            return super().make_context(*args, **kwargs)
        except _UsageError as exc:
            _usage_error(exc)

    def invoke(self, ctx):  # the command's name and its options
        try:
            return super().invoke(ctx)
        except _UsageError as exc:
            _usage_error(exc)


def _usage_error(exc) -> None:
    if type(exc).__name__ == "NoArgsIsHelpError":  # `tiedlm` alone prints the help
        raise exc
    where = exc.ctx.command_path if exc.ctx is not None else "tiedlm"
    message = " ".join(exc.format_message().split()).rstrip(".")
    _fail(f"{message} — see '{where} --help'", exc.exit_code)


app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  cls=_OneLineUsageErrors,
                  help="Train language models with tied and untied embeddings (any block family, every tying mode) and "
                       "compare them honestly.")
cache_app = typer.Typer(no_args_is_help=True, cls=_OneLineUsageErrors, help="The token cache: list or clear prepared datasets.")
app.add_typer(cache_app, name="cache")

_state = {"debug": False}

ConfigOpt = typer.Option(..., "--config", "-c", help="YAML config file.")
SetOpt = typer.Option(None, "--set", "-s", help="Override a config key, e.g. --set model.n_embd=256 (repeatable).")


def Flag(*names: str, **kw: Any) -> Any:  # noqa: N802 (read as typer.Option)
    """A boolean option shown as a flag (--debug), not as one that takes a value (--debug <bool>)."""
    return typer.Option(False, *names, metavar="", **kw)


def _fail(message: str, code: int, same_on_every_rank: bool = True) -> None:
    """One line on stderr and exit `code`. Under torchrun an error that every rank meets alike (a
    refused config or option, an interrupt) is said by rank 0 alone; one that only some ranks meet
    is said by each of them, with its rank. A process that is not surely one of several (no
    process group started here, not launched by torchrun, or a malformed launch environment)
    always says its error (distributed.leaves_errors_to_rank_0)."""
    if is_main_process():
        typer.echo(f"tiedlm: error: {message}", err=True)
    elif not same_on_every_rank:
        typer.echo(f"tiedlm: error: rank {os.environ.get('RANK', '?')}: {message}", err=True)
    elif not leaves_errors_to_rank_0():
        typer.echo(f"tiedlm: error: {message}", err=True)
    raise typer.Exit(code)


def _silence_closed_streams() -> None:
    """Point stdout and stderr at /dev/null so that the interpreter's final flush of a closed pipe
    prints no 'Exception ignored' message and exits 0."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    for stream in (sys.stdout, sys.stderr):
        try:
            os.dup2(devnull, stream.fileno())
        except (OSError, ValueError):  # not a real file (a test runner's capture): nothing to flush
            pass
    os.close(devnull)


def _traceback_if_debug(code: int) -> None:
    """--debug: the traceback on stderr, and the exit code the command has without it (not always 1)."""
    if _state["debug"]:
        traceback.print_exc()
        raise typer.Exit(code)


def run_command(fn: Callable[[], object], reads_runs: bool = False) -> object:
    """Call fn; map expected failures to one line on stderr and an exit code. `reads_runs`: the
    command only reads runs, so a damaged run's fix is not train's --overwrite (DamagedRunError)."""
    try:
        return fn()
    except TiedlmError as exc:
        _traceback_if_debug(exc.exit_code)
        text = exc.for_reader() if reads_runs and isinstance(exc, DamagedRunError) else str(exc)
        alike = isinstance(exc, (ConfigError, Interrupted)) or exc.exit_code in (2, 130, 143)
        _fail(text.splitlines()[0] if text else type(exc).__name__, exc.exit_code, same_on_every_rank=alike)
    except KeyboardInterrupt:
        _traceback_if_debug(130)
        _fail("interrupted", 130)
    except BrokenPipeError:
        # The reader of our output went away (`tiedlm ... | head -1`). The work itself is done and
        # recorded; there is nobody left to tell, so end quietly, as `cat` and `ls` do.
        _silence_closed_streams()
        raise typer.Exit(0)
    except OSError as exc:  # a path that cannot be written, a full disk: no traceback for those
        _traceback_if_debug(1)
        _fail(os_error_line(exc), 1, same_on_every_rank=False)
    return None


def _version(value: bool) -> None:
    if value:
        typer.echo(f"tiedlm {__version__}")
        raise typer.Exit()


@app.callback()
def main(
    debug: bool = Flag("--debug", help="Show tracebacks for errors."),
    version: bool = Flag("--version", callback=_version, is_eager=True, help="Print the version."),
) -> None:
    _state["debug"] = debug


def _load(config: Path, overrides: Optional[List[str]], seed: Optional[int] = None):
    from .config import load_config

    return load_config(config, overrides or [], seed)


def _seeds_option(value: str | None) -> int | str | None:
    """compare --seeds: a whole number, or auto (the sequential design)."""
    if value is None:
        return None
    if value.strip().lower() == "auto":
        return "auto"
    try:
        return int(value.strip())
    except ValueError:
        raise ConfigError(f"--seeds must be a whole number or auto, got {value!r}") from None


@app.command()
def compare(
    runs_: Optional[List[str]] = typer.Argument(None, metavar="[RUN_DIR|GLOB]...",
                                                help="Run folders or globs (default: every run under --out)."),
    config: Optional[Path] = typer.Option(None, "--config", "-c",
                                          help="Train the tied and untied variants of this config first."),
    set_: Optional[List[str]] = SetOpt,
    seeds: Optional[str] = typer.Option(None, "--seeds", help="Seeds per variant with --config (default 1), or "
                                        "'auto': from 3, one more while the verdict is undecided (a sequential "
                                        "design that keeps false positives at 5%)."),
    max_seeds: Optional[int] = typer.Option(None, "--max-seeds", help="With --seeds auto: at most this many seeds "
                                            "per variant (default 10)."),
    min_effect: Optional[float] = typer.Option(None, "--min-effect", help="With --seeds auto: stop once effects "
                                               "this large are detectable (80% power), as a fraction (default "
                                               "0.02: 2%)."),
    match: Optional[str] = typer.Option(None, "--match", help="'params': add a tied variant with extra layers "
                                        "matching the untied parameter count; 'params:width': wider instead "
                                        "(n_embd grown by the head size). Tuned like the others; the verdict "
                                        "has both contrasts, Holm-adjusted."),
    tune: Optional[List[str]] = typer.Option(None, "--tune", help="With --config: tune each variant on validation "
                                             "first, e.g. --tune train.lr=3e-4,1e-3,3e-3 (repeatable: their grid; "
                                             "also seeds=0, extend=false); the verdict is then on test."),
    baseline: Optional[str] = typer.Option(None, "--baseline", help="The variant to compare against (in a grid, "
                                           "instead of each tied variant against its untied twin)."),
    primary: Optional[str] = typer.Option(None, "--primary", help="The split whose loss carries the verdict "
                                          "(train, validation or test; default validation, test with --select "
                                          "best); the others confirm."),
    select: Optional[str] = typer.Option(None, "--select", help="Whose scores to compare: 'best' (the weights "
                                         "each run kept at its best validation evaluation, train.keep_best) or "
                                         "'final' (the last weights). Default: best when every run kept them."),
    out_: Optional[str] = typer.Option(None, "--out", help="Runs folder (default runs, or the one the runs given lie "
                                       "in); the comparison goes to OUT/compare-NAME/, NAME the name its runs share."),
    into: Optional[str] = typer.Option(None, "--into", help="Write the comparison into this folder instead."),
    overwrite: bool = Flag("--overwrite", help="With --config: retrain runs whose folders hold "
                                   "another config (say, after editing it) instead of refusing them."),
    overwrite_output: bool = Flag("--overwrite-output", help="Replace files in the comparison's folder (and, "
                                          "with --analyze, analysis files in the run folders) that tiedlm did not "
                                          "write, instead of refusing them."),
    analyze: bool = Flag("--analyze", help="First analyse each run's two matrices (tiedlm "
                                 "analyze) and add what they show to the report."),
    tensorboard: bool = Flag("--tensorboard", help="Write TensorBoard event files (tb/) for the compared runs."),
    log_to: Optional[List[str]] = typer.Option(None, "--log-to", help="Log the comparison as a summary run to "
                                               "this tracker (wandb, mlflow or trackio; repeatable). Default: the "
                                               "trackers its runs logged to (train.log_to)."),
    jobs: Optional[str] = typer.Option(None, "--jobs", "-j", help="Runs trained at once (own processes), or auto."),
    quiet: bool = Flag("--quiet", "-q", help="No progress bars."),
) -> None:
    """Train a config tied and untied and compare them (--config), or compare finished runs.

    The verdict with its interval and p-value, over seeds and token frequencies, with plots. Examples:

    tiedlm compare --config configs/shakespeare.yaml --seeds 3 --set data.path=my_corpus.txt

    tiedlm compare runs/shakespeare-my_corpus-*   (runs already trained, tied and untied)
    """

    def compare_runs_or_config():  # the values are checked by CompareRequest.check; here, which options go together

        out = None if out_ is None else check_folder_option(out_, "--out")
        into_dir = None if into is None else check_folder_option(into, "--into")
        if config is None:
            given = [opt for opt, value in (("--set", set_), ("--seeds", seeds is not None), ("--match", match),
                                            ("--overwrite", overwrite), ("--tune", tune),
                                            ("--max-seeds", max_seeds is not None), ("--jobs", jobs is not None),
                                            ("--min-effect", min_effect is not None)) if value]
            if given:
                one = len(given) == 1
                raise ConfigError(f"{', '.join(given)} only {'applies' if one else 'apply'} with --config, which "
                                  f"names the runs to train — add --config FILE or drop {'it' if one else 'them'}")
        elif runs_:
            raise ConfigError("give either --config or run folders, not both — drop one of them")
        n_seeds = _seeds_option(seeds)
        from .compare import Judging, format_terminal_table, judge_runs

        judging = Judging(paths=runs_ or None, runs_dir=out, out=into_dir, baseline=baseline, primary=primary,
                          select=select, analyze=analyze, overwrite_output=overwrite_output, log_to=log_to or None)
        if config is not None:  # run the experiment, then judge its runs
            from .experiment import CompareRequest, compare

            result = compare(CompareRequest(config=config, overrides=set_ or [], judging=judging,
                                            seeds=1 if n_seeds is None else n_seeds, match=match, progress=not quiet,
                                            overwrite=overwrite, tune=tune or [], max_seeds=max_seeds,
                                            min_effect=min_effect, jobs=jobs))
        else:  # judge the finished runs named
            result = judge_runs(judging)
        typer.echo(format_terminal_table(result))
        if tensorboard:
            from .trackers.tensorboard import backfill_many, left_alone_lines, logdir_of

            left_alone: list = []
            written = backfill_many([Path(r.path) for r in result.runs], left_alone)
            view = f": tensorboard --logdir {logdir_of(written)}" if written else ""
            typer.echo(f"wrote TensorBoard event files for {len(written)} runs{view}")
            for line in left_alone_lines(left_alone):
                typer.echo(line)
        failures = result.train_failures
        if failures:
            raise TiedlmError(f"{len(failures)} run(s) failed to train: "
                              + ", ".join(f.name for f in failures) + " — see the reasons above")

    run_command(compare_runs_or_config, reads_runs=config is None)


@app.command()
def train(
    config: Path = ConfigOpt,
    set_: Optional[List[str]] = SetOpt,
    seed: Optional[int] = typer.Option(None, "--seed", help="Run seed (model init, batches, dropout)."),
    name: Optional[str] = typer.Option(None, "--name", help="Run folder name (default: <name>-s<seed>)."),
    out: str = typer.Option("runs", "--out", help="Parent folder of run folders."),
    overwrite: bool = Flag("--overwrite", help="Delete an existing run folder and start afresh."),
    print_config: bool = Flag("--print-config", help="Print the resolved config and exit."),
    tensorboard: bool = Flag("--tensorboard", help="Also write TensorBoard event files into "
                                     "the run's tb/ (train.log_to: \\[tensorboard])."),
    quiet: bool = Flag("--quiet", "-q", help="No progress bars."),
    dry_run: bool = Flag("--dry-run", help="Plan the run and exit: parameters counted on the meta device, "
                                           "memory per process (whole under DDP, sharded under FSDP), FLOPs."),
) -> None:
    """Train one model. Re-running a finished run does nothing; an unfinished one resumes."""

    def train_one_run():
        out_dir = check_folder_option(out, "--out")
        if seed is not None:
            check_seed(seed, "--seed")
        if name is not None:
            check_run_name(name, "--name")
        cfg = _load(config, list(set_ or []) + (["train.log_to=[tensorboard]"] if tensorboard else []), seed)
        if print_config:
            from .config import to_yaml

            typer.echo(to_yaml(cfg), nl=False)
            return
        if dry_run:
            from .distributed import from_env
            from .model.memory_plan import plan_text

            if is_main_process():
                typer.echo(plan_text(cfg, from_env().world))
            return
        from .train import train_run

        run_dir = train_run(cfg, out=out_dir, name=name, overwrite=overwrite, progress=not quiet)

        if is_main_process():  # under torchrun, rank 0 speaks for the run
            typer.echo(str(run_dir / "report.md"))

    run_command(train_one_run)


@app.command()
def params(
    config: Path = ConfigOpt,
    set_: Optional[List[str]] = SetOpt,
    vocab_size: Optional[int] = typer.Option(None, "--vocab-size", help="Vocabulary size to count with."),
    data: bool = Flag("--data", help="Prepare the data and use the tokenizer's real size."),
    as_json: bool = Flag("--json", help="Print JSON."),
) -> None:
    """Parameter breakdown of the tied and untied forms side by side (no training, instant)."""

    def count_params():
        if vocab_size is not None:
            if data:
                raise ConfigError("--vocab-size and --data contradict each other (--data counts with the prepared "
                                  "tokenizer's real size) — give one of them")
            check_positive(vocab_size, "--vocab-size")
            check_at_most(vocab_size, VOCAB_LIMIT, "--vocab-size", "real tokenizers stay below a million entries")
        cfg = _load(config, set_)
        from .model.params_report import params_report

        result = params_report(cfg, vocab_size=vocab_size, use_data=data)
        typer.echo(json.dumps(result.to_json(), indent=2) if as_json else result.text)

    run_command(count_params)


@app.command("eval")
def eval_(
    run: Path = typer.Argument(..., help="A run folder."),
    split: Optional[List[str]] = typer.Option(None, "--split", help="Split(s) to score (default: the config's)."),
    stride: Optional[int] = typer.Option(None, "--stride", help="Window stride (default: the config's)."),
    device: str = typer.Option("auto", "--device", help="auto, cpu, cuda, cuda:N or mps."),
    best: bool = Flag("--best", help="Score the weights kept at the best validation evaluation "
                              "(train.keep_best) instead of the last checkpoint."),
    as_json: bool = Flag("--json", help="Print JSON."),
) -> None:
    """Re-evaluate a run's checkpoint on whole splits."""

    def score_splits():
        for sp in split or []:
            check_split(sp, "--split")
        if stride is not None:
            check_positive(stride, "--stride")
        check_device(device, "--device")
        from .evaluate import evaluate_run

        result = evaluate_run(run, splits=split, stride=stride, device=device, best=best)

        typer.echo(json_text(result["results"], indent=2) if as_json
                   else result["text"])

    run_command(score_splits, reads_runs=True)


@app.command()
def analyze(
    runs_: List[str] = typer.Argument(..., metavar="RUN_DIR|GLOB...", help="Run folders or globs."),
    out: Optional[str] = typer.Option(None, "--out", help="Write here instead of into the run folder (with "
                                       "several runs, into OUT/<run name>/)."),
    split: str = typer.Option("validation", "--split", help="The split the direct path is scored on."),
    sample: int = typer.Option(2000, "--sample", help="Tokens sampled for the neighbour statistics."),
    seed: int = typer.Option(0, "--seed", help="Seed of the samples."),
    as_json: bool = Flag("--json", help="Print analysis.json of each run (a JSON list)."),
    overwrite: bool = Flag("--overwrite", help="Replace files of the analysis' names (analysis.md, "
                                   "analysis.json, analysis_*.png) that tiedlm did not write there."),
) -> None:
    """Look inside E and W_out: norms, anisotropy, spectra, how the two differ, the direct path."""

    def analyze_runs():
        out_dir = None if out is None else check_folder_option(out, "--out")
        check_split(split, "--split")
        check_positive(sample, "--sample")
        check_at_most(sample, 100_000, "--sample", "neighbours of that many tokens are plenty for a mean")
        check_seed(seed, "--seed")
        from .analyze import analyze_run, check_target
        from .runs import expand_runs

        dirs = expand_runs(runs_)
        results, failed = [], []
        targets = {d: None if out_dir is None else (out_dir if len(dirs) == 1 else out_dir / d.name) for d in dirs}
        for d, target in targets.items():  # a refused folder refuses them all, before anything is written
            check_target(target or d, overwrite, "--overwrite", target is not None, d)
        for d in dirs:
            target = targets[d]
            try:
                results.append(analyze_run(d, out=target, split=split, sample=sample, seed=seed,
                                           overwrite=overwrite))
            except TiedlmError as exc:  # one damaged run does not keep the others from being analysed
                if len(dirs) == 1 or _state["debug"] or isinstance(exc, Interrupted):
                    raise
                failed.append((d, exc))
                continue
            if not as_json:
                from .analyze import summary_line

                typer.echo(summary_line(results[-1], target or d))
        if as_json:
            typer.echo(json_text(results, indent=2))
        for d, exc in failed:  # said at the end, one line each, after the runs that were analysed
            text = exc.for_reader() if hasattr(exc, "for_reader") else str(exc)
            typer.echo(f"tiedlm: error: {d} was not analysed: {(text.splitlines() or [type(exc).__name__])[0]}",
                       err=True)
        if failed:
            codes = {exc.exit_code for _, exc in failed}
            raise typer.Exit(codes.pop() if len(codes) == 1 else 1)

    run_command(analyze_runs, reads_runs=True)


@app.command()
def export(
    run: Path = typer.Argument(..., help="A run folder."),
    out: str = typer.Option(..., "--out", help="The folder to write (new, or empty)."),
    checkpoint: Optional[str] = typer.Option(None, "--checkpoint", help="step-N, best-step-N or latest (default: "
                                             "the weights a comparison judges, the best validation evaluation's "
                                             "where the run kept them, else the latest checkpoint)."),
) -> None:
    """Export a run as its family's transformers model (GPT2LMHeadModel, LlamaForCausalLM, or an arch: hf
    family's own class), its logits checked against tiedlm's."""

    def write_export():
        from .export import export_run, summary

        typer.echo(summary(export_run(run, check_folder_option(out, "--out"), checkpoint=checkpoint)))

    run_command(write_export, reads_runs=True)


@app.command()
def sample(
    run: Path = typer.Argument(..., help="A run folder."),
    prompt: str = typer.Option("", "--prompt", help="Text to continue (default: a new document)."),
    max_new_tokens: int = typer.Option(200, "--max-new-tokens", help="Tokens to generate at most per sample."),
    temperature: float = typer.Option(1.0, "--temperature", help="Softmax temperature; 0 is greedy."),
    top_k: Optional[int] = typer.Option(None, "--top-k", help="Sample among the k most likely tokens."),
    top_p: Optional[float] = typer.Option(None, "--top-p", help="Sample among the most likely tokens holding "
                                          "this much probability (nucleus)."),
    seed: int = typer.Option(0, "--seed", help="Seed of the sampling: the same seed gives the same text."),
    num_samples: int = typer.Option(1, "--num-samples", help="How many samples."),
    device: Optional[str] = typer.Option(None, "--device", help="Default: the device the run would use."),
) -> None:
    """Generate text from a run's latest checkpoint, streamed as it is generated."""

    def sample_text():
        check_seed(seed, "--seed")
        check_positive(max_new_tokens, "--max-new-tokens")
        check_at_most(max_new_tokens, 1_000_000, "--max-new-tokens", "one token per forward pass")
        check_positive(num_samples, "--num-samples")
        check_at_most(num_samples, 10_000, "--num-samples", "each sample is generated in turn")
        if not (math.isfinite(temperature) and temperature >= 0):
            raise ConfigError(f"--temperature must be 0 (greedy) or positive, got {temperature}")
        if top_k is not None:
            check_positive(top_k, "--top-k")
        if top_p is not None and not 0 < top_p <= 1:
            raise ConfigError(f"--top-p must be in (0, 1], got {top_p}")
        if device is not None:
            check_device(device, "--device")

        def write(text: str) -> None:
            sys.stdout.write(text)
            sys.stdout.flush()

        opts = SampleOptions(prompt, max_new_tokens, temperature, top_k, top_p, seed, num_samples)
        sample_run(run, opts, write, note=lambda m: typer.echo(f"note: {m}", err=True), device=device)

    run_command(sample_text, reads_runs=True)


@app.command("tensorboard")
def tensorboard_(
    runs_: List[str] = typer.Argument(..., metavar="RUN_DIR|GLOB...", help="Run folders, folders of runs, or globs."),
) -> None:
    """Write TensorBoard event files (tb/) for runs from their metrics.jsonl and report.json."""

    def write_events():
        from .runs import expand_runs
        from .trackers.tensorboard import backfill_many, left_alone_lines, logdir_of

        left_alone: list = []
        written = backfill_many(expand_runs(runs_), left_alone)
        for path in written:
            typer.echo(f"wrote {path}")
        for line in left_alone_lines(left_alone):
            typer.echo(line)
        if written:
            typer.echo(f"view them side by side: tensorboard --logdir {logdir_of(written)}")

    run_command(write_events, reads_runs=True)


@app.command()
def data(
    config: Path = ConfigOpt,
    set_: Optional[List[str]] = SetOpt,
) -> None:
    """Prepare (download, tokenize, cache) the data of a config and print its statistics."""

    def prepare_and_describe():
        from .data import prepare_data, summarize

        cfg = _load(config, set_)
        typer.echo(summarize(prepare_data(cfg, progress=True)))

    run_command(prepare_and_describe)


def _cache_folder() -> Path:
    """The token cache, refused where it or a folder above it is a file: not an empty cache."""
    from .data import cache_root

    root = cache_root()
    if any(p.is_file() for p in (root, *root.parents)):
        raise ConfigError(f"the token cache {root} is not a folder (it, or a folder above it, is a file) — point "
                          "TIEDLM_CACHE at a folder (made if missing), or unset it for ~/.cache/tiedlm")
    return root


@cache_app.command("list")
def cache_list() -> None:
    """List the prepared datasets in the token cache."""

    def list_cache():
        from .data import cache_entries

        typer.echo(f"cache: {_cache_folder()}")
        entries = cache_entries()
        for e in entries:
            tokens = f"{e['tokens']:,} tokens" if e.get("tokens") is not None else ""
            typer.echo(f"  {e.get('kind', ''):<9} {str(e.get('source', ''))[:48]:<48} {e.get('split') or '':<10} "
                       f"{str(e.get('tokenizer') or ''):<14} {tokens:>16} {(e.get('bytes') or 0) / 2**20:8.1f} MiB")
        total = sum(e.get("bytes") or 0 for e in entries)
        typer.echo(f"  {len(entries)} entries, {total / 2**20:.1f} MiB" if entries else "(empty)")

    run_command(list_cache)


@cache_app.command("clear")
def cache_clear() -> None:
    """Delete the entries tiedlm made in the token cache (nothing else in its folder)."""

    def clear_cache_entries():
        from .data import clear_cache

        _cache_folder()
        done = clear_cache()
        n = len(done.removed)  # paths: an entry, or one of the files and folders `datasets` made
        typer.echo(f"cleared {done.root}: {n} item{'s' * (n != 1)} removed, {done.freed_bytes / 2**20:.1f} MiB freed")
        shown = 5  # a cache folder shared with other things may hold many: the first few say enough
        for path, why in done.left_alone[:shown]:
            typer.echo(f"left alone: {path} ({why})")
        if len(done.left_alone) > shown:
            typer.echo(f"left alone: {len(done.left_alone) - shown} more, not made by tiedlm or in use")

    run_command(clear_cache_entries)



@app.command()
def sweep(
    grid: Path = typer.Argument(..., help="Sweep file: a base config, a grid of --set overrides, seeds."),
    dry_run: bool = Flag("--dry-run", help="Print one `tiedlm train` command per run (= --emit shell)."),
    emit: Optional[str] = typer.Option(None, "--emit", help="'shell': the commands, for xargs -P or GNU parallel; "
                                       "'slurm': an sbatch job-array script with one task per run."),
    partition: Optional[str] = typer.Option(None, "--partition", help="--emit slurm: the partition."),
    time_: Optional[str] = typer.Option(None, "--time", help="--emit slurm: each task's time limit."),
    gpus_per_task: Optional[str] = typer.Option(None, "--gpus-per-task", help="--emit slurm: GPUs per task."),
    jobs: Optional[str] = typer.Option(None, "--jobs", "-j", help="Runs trained at once (own processes), or auto."),
    quiet: bool = Flag("--quiet", "-q", help="No progress bars."),
) -> None:
    """Run a grid of overrides x seeds one after another (finished runs are skipped), or emit it."""

    def run_grid():
        from .experiment.sweep import check_options, format_sweep_summary, load_grid, run_sweep, slurm_script

        options = {"partition": partition, "time": time_, "gpus_per_task": gpus_per_task}
        n_jobs = check_options(emit, options, jobs, dry_run)  # one line and exit 2 for a refused one
        if emit == "slurm":
            typer.echo(slurm_script(load_grid(grid), options), nl=False)
            return
        summary = run_sweep(load_grid(grid), dry_run=dry_run or emit == "shell", progress=not quiet, jobs=n_jobs)
        if not summary.dry_run:
            typer.echo(format_sweep_summary(summary))
        if summary.failed:
            raise TiedlmError(f"{len(summary.failed)} of {summary.total} runs failed: "
                              + ", ".join(summary.failed))

    run_command(run_grid)


for _info in app.registered_commands + cache_app.registered_commands:  # every command's --help a flag
    _info.cls = _Command if _info.cls in (None, TyperCommand) else _info.cls


if __name__ == "__main__":  # pragma: no cover
    sys.exit(app())
