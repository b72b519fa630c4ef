"""The `tiedlm` command. Each command parses its options, calls one library function, and turns
a TiedlmError into a one-line message on stderr and an exit code (2 usage/config, 1 runtime,
130/143 interrupted). `--debug` shows the traceback instead. Heavy libraries are imported inside
the commands so that `tiedlm --help` is instant."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Callable, List, Optional

import typer

from . import __version__
from .errors import TiedlmError

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="Train small GPTs with tied and untied embeddings and compare them honestly.")
cache_app = typer.Typer(no_args_is_help=True, help="The token cache: list or clear prepared datasets.")
app.add_typer(cache_app, name="cache")

_state = {"debug": False}

ConfigOpt = typer.Option(..., "--config", "-c", help="YAML config file.")
SetOpt = typer.Option(None, "--set", "-s", help="Override a config key, e.g. --set model.n_embd=256 (repeatable).")


def _fail(message: str, code: int) -> None:
    typer.echo(f"tiedlm: error: {message}", err=True)
    raise typer.Exit(code)


def run_command(fn: Callable[[], object]) -> object:
    """Call fn; map expected failures to one line on stderr and an exit code."""
    try:
        return fn()
    except TiedlmError as exc:
        if _state["debug"]:
            raise
        _fail(str(exc).splitlines()[0] if str(exc) else type(exc).__name__, exc.exit_code)
    except KeyboardInterrupt:
        if _state["debug"]:
            raise
        _fail("interrupted", 130)
    except OSError as exc:  # a path that cannot be written, a full disk: no traceback for those
        if _state["debug"]:
            raise
        where = f" ({exc.filename})" if getattr(exc, "filename", None) else ""
        _fail(f"{exc.strerror or exc}{where} — check the path, its permissions and the free disk space", 1)
    return None


def _version(value: bool) -> None:
    if value:
        typer.echo(f"tiedlm {__version__}")
        raise typer.Exit()


@app.callback()
def main(
    debug: bool = typer.Option(False, "--debug", help="Show tracebacks for errors."),
    version: bool = typer.Option(False, "--version", callback=_version, is_eager=True, help="Print the version."),
) -> None:
    _state["debug"] = debug


def _load(config: Path, overrides: Optional[List[str]], seed: Optional[int] = None):
    from .config import load_config

    return load_config(config, overrides or [], seed)


@app.command()
def train(
    config: Path = ConfigOpt,
    set_: Optional[List[str]] = SetOpt,
    seed: Optional[int] = typer.Option(None, "--seed", help="Run seed (model init, batches, dropout)."),
    name: Optional[str] = typer.Option(None, "--name", help="Run folder name (default: <name>-s<seed>)."),
    out: Path = typer.Option(Path("runs"), "--out", help="Parent folder of run folders."),
    overwrite: bool = typer.Option(False, "--overwrite", help="Delete an existing run folder and start afresh."),
    print_config: bool = typer.Option(False, "--print-config", help="Print the resolved config and exit."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="No progress bars."),
) -> None:
    """Train one model. Re-running a finished run does nothing; an unfinished one resumes."""

    def go():
        cfg = _load(config, set_, seed)
        if print_config:
            from .config import to_yaml

            typer.echo(to_yaml(cfg), nl=False)
            return
        from .train import train_run

        run_dir = train_run(cfg, out=out, name=name, overwrite=overwrite, progress=not quiet)
        typer.echo(str(run_dir / "report.md"))

    run_command(go)


@app.command()
def params(
    config: Path = ConfigOpt,
    set_: Optional[List[str]] = SetOpt,
    vocab_size: Optional[int] = typer.Option(None, "--vocab-size", help="Vocabulary size to count with."),
    data: bool = typer.Option(False, "--data", help="Prepare the data and use the tokenizer's real size."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """Parameter breakdown of the tied and untied forms side by side (no training, instant)."""

    def go():
        from .model import params_table

        cfg = _load(config, set_)
        result = params_table(cfg, vocab_size=vocab_size, use_data=data)
        typer.echo(json.dumps(result, indent=2) if as_json else result["text"])

    run_command(go)


@app.command("eval")
def eval_(
    run: Path = typer.Argument(..., help="A run folder."),
    split: Optional[List[str]] = typer.Option(None, "--split", help="Split(s) to score (default: the config's)."),
    stride: Optional[int] = typer.Option(None, "--stride", help="Window stride (default: the config's)."),
    device: str = typer.Option("auto", "--device", help="auto, cpu, cuda, cuda:N or mps."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """Re-evaluate a run's checkpoint on whole splits."""

    def go():
        from .evaluate import evaluate_run

        result = evaluate_run(run, splits=split, stride=stride, device=device)
        typer.echo(json.dumps(result["results"], indent=2) if as_json else result["text"])

    run_command(go)


@app.command()
def data(
    config: Path = ConfigOpt,
    set_: Optional[List[str]] = SetOpt,
) -> None:
    """Prepare (download, tokenize, cache) the data of a config and print its statistics."""

    def go():
        from .data import prepare_data, summarize

        cfg = _load(config, set_)
        typer.echo(summarize(prepare_data(cfg, progress=True)))

    run_command(go)


@cache_app.command("list")
def cache_list() -> None:
    """List the prepared datasets in the token cache."""

    def go():
        from .data import cache_entries, cache_root

        entries = cache_entries()
        typer.echo(f"cache: {cache_root()}")
        if not entries:
            typer.echo("(empty)")
        total = 0
        for e in entries:
            total += e.get("bytes") or 0
            tokens = f"{e['tokens']:,} tokens" if e.get("tokens") is not None else ""
            typer.echo(f"  {e.get('kind', ''):<9} {str(e.get('source', ''))[:48]:<48} {e.get('split') or '':<10} "
                       f"{str(e.get('tokenizer') or ''):<14} {tokens:>16} {(e.get('bytes') or 0) / 2**20:8.1f} MiB")
        if entries:
            typer.echo(f"  {len(entries)} entries, {total / 2**20:.1f} MiB")

    run_command(go)


@cache_app.command("clear")
def cache_clear() -> None:
    """Delete the entries tiedlm made in the token cache (nothing else in its folder)."""

    def go():
        from .data import cache_root, clear_cache

        freed = clear_cache()
        typer.echo(f"cleared {cache_root()} ({freed / 2**20:.1f} MiB freed)")

    run_command(go)


@app.command()
def compare(
    runs_: Optional[List[str]] = typer.Argument(None, metavar="[RUN_DIR|GLOB]...",
                                                help="Run folders or globs (default: every run under --out)."),
    config: Optional[Path] = typer.Option(None, "--config", "-c",
                                          help="Train the tied and untied variants of this config first."),
    set_: Optional[List[str]] = SetOpt,
    seeds: int = typer.Option(1, "--seeds", help="Seeds per variant with --config."),
    match: Optional[str] = typer.Option(None, "--match", help="'params': add a tied variant with extra layers "
                                        "matching the untied parameter count."),
    baseline: Optional[str] = typer.Option(None, "--baseline", help="The variant to compare against."),
    out: Path = typer.Option(Path("runs"), "--out", help="Runs folder; the comparison goes to OUT/compare/."),
    overwrite: bool = typer.Option(False, "--overwrite", help="With --config: retrain runs whose folders hold "
                                   "another config (say, after editing it) instead of refusing them."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="No progress bars."),
) -> None:
    """Compare finished runs (tied vs untied), across seeds, with intervals and plots."""

    def go():
        from .compare import compare_config, compare_runs, format_terminal_table

        if match not in (None, "params"):
            raise TiedlmError(f"--match {match!r} is not known — the one choice is --match params", exit_code=2)
        if config is not None:
            if runs_:
                raise TiedlmError("give either --config or run folders, not both", exit_code=2)
            if seeds < 1:
                raise TiedlmError("--seeds must be at least 1", exit_code=2)
            result = compare_config(config, set_ or [], seeds=seeds, match=match, runs_dir=out,
                                    baseline=baseline, progress=not quiet, overwrite=overwrite)
        else:
            if set_ or match or overwrite:
                raise TiedlmError("--set, --match and --overwrite need --config", exit_code=2)
            result = compare_runs(runs_ or None, runs_dir=out, baseline=baseline)
        typer.echo(format_terminal_table(result))
        failures = result.get("train_failures") or []
        if failures:
            raise TiedlmError(f"{len(failures)} run(s) failed to train: "
                              + ", ".join(f["name"] for f in failures) + " — see the reasons above")

    run_command(go)


@app.command()
def sweep(
    grid: Path = typer.Argument(..., help="Sweep file: a base config, a grid of --set overrides, seeds."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Print one `tiedlm train` command per run."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="No progress bars."),
) -> None:
    """Run a grid of overrides x seeds one after another (finished runs are skipped)."""

    def go():
        from .sweep import format_sweep_summary, load_grid, run_sweep

        summary = run_sweep(load_grid(grid), dry_run=dry_run, progress=not quiet)
        if not dry_run:
            typer.echo(format_sweep_summary(summary))
        if summary.get("failed"):
            raise TiedlmError(f"{len(summary['failed'])} of {summary['total']} runs failed: "
                              + ", ".join(summary["failed"]))

    run_command(go)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(app())
