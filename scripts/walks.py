"""Count the two walks of docs/architecture.md by tracing the code that runs, not by reading it.

A walk is every tiedlm file one of whose functions is called after the command starts (code run
at import time is left out), less the leaves (errors, formatting, files, perplexity, process, device,
distributed, threads, and the package's __init__.py, whose lazy exports run for --help):

- compare: `tiedlm compare --config configs/base.yaml --tune train.lr=…` scaled down on
  builtin:synthetic, from the command line to the printed verdict, training itself left out
  (calls made inside train.train_run are not counted: it is the seam the second walk enters);
- train: `tiedlm train` of the same config, to the first optimizer step (the data prepared afresh).

Each walk also names the files of it that call into another file of it: the ones a reader follows
the walk through, as against those that are called and return (a value's methods, a YAML read).
A caller is the nearest tiedlm frame below a call, so what autograd runs during `loss.backward()` is
the training step's call; a dataclass's generated __init__ is no tiedlm file and is not seen.

    python scripts/walks.py            # both walks, each file named
    python scripts/walks.py --json     # the same as JSON
    python scripts/walks.py --warm     # the training walk with the token cache warm
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

PACKAGE = ROOT / "tiedlm"
LEAVES = {"errors", "formatting", "files", "perplexity", "process", "device", "distributed", "threads",
          "__init__"}  # the package's own __init__.py (a subpackage's, as train/__init__, is counted)
SMALL = ["data.path=builtin:synthetic", "data.synthetic.train_tokens=20000", "data.synthetic.validation_tokens=4000",
         "data.synthetic.test_tokens=4000", "model.n_layer=1", "model.n_head=2", "model.n_embd=16",
         "model.block_size=16", "train.batch_size=4", "train.max_steps=4", "train.eval_every=2",
         "train.eval_tokens=256", "train.warmup_steps=1", "train.threads=1"]


@functools.lru_cache(maxsize=None)
def _module(filename: str) -> str | None:
    """tiedlm's module of a code object's file ("compare/verdicts"), None outside the package."""
    try:
        rel = Path(filename).resolve().relative_to(PACKAGE)
    except ValueError:
        return None
    return str(rel.with_suffix(""))


def _caller(frame) -> str | None:
    """The tiedlm module of the nearest tiedlm frame below `frame` (through torch's or typer's own
    frames: a model's forward called by nn.Module.__call__ is its caller's call)."""
    f = frame.f_back
    while f is not None:
        mod = _module(f.f_code.co_filename)
        if mod is not None:
            return mod
        f = f.f_back
    return None


class Walk:
    """The tiedlm modules whose functions are called while it is on, outside `skip` (train.train_run,
    whose calls and everything below them are left out: it runs untraced) and until `stop` (a
    predicate on a called frame) first holds; and which module called which."""

    def __init__(self, skip: bool = False, stop=None):
        self.seen: set[str] = set()
        self.calls: dict[str, set[str]] = {}  # caller module -> the other modules it called
        self.skip, self.stop, self.done = skip, stop, False

    def __call__(self, frame, event, arg):
        if self.done or event != "call":
            return
        if self.stop is not None and self.stop(frame):
            self.done = True
            sys.setprofile(None)  # the walk is over: the rest of the command runs untraced
            return
        mod = _module(frame.f_code.co_filename)
        if mod is not None and frame.f_code.co_name != "<module>":
            self.seen.add(mod)
            # a generator expression's frame is "called" each time the code iterating it resumes it:
            # that code reads a value, it does not call into the module that wrote the expression
            caller = None if frame.f_code.co_name == "<genexpr>" else _caller(frame)
            if caller is not None and caller != mod:
                self.calls.setdefault(caller, set()).add(mod)

    def counted(self) -> list[str]:
        return sorted(m for m in self.seen if m not in LEAVES)

    def directing(self) -> list[str]:
        """The counted files that call into another counted file: the ones a reader follows the
        walk through. The others are called and return (a value's methods, a check, a format)."""
        counted = set(self.counted())
        return sorted(m for m in counted if self.calls.get(m, set()) & (counted - {m}))

    def run(self, argv: list[str]) -> None:
        """The command, traced (train.train_run untraced when `skip`)."""
        import tiedlm.train

        seam = tiedlm.train.train_run

        def untraced(*a, **kw):  # the compare walk leaves training out: it runs at full speed
            sys.setprofile(None)
            try:
                return seam(*a, **kw)
            finally:
                sys.setprofile(self)

        if self.skip:
            tiedlm.train.train_run = untraced
        try:
            self._invoke(argv, traced=True)
        finally:
            tiedlm.train.train_run = seam

    def run_untraced(self, argv: list[str]) -> None:
        self._invoke(argv, traced=False)

    def _invoke(self, argv: list[str], traced: bool) -> None:
        from typer.testing import CliRunner

        from tiedlm.cli import app

        if traced:
            sys.setprofile(self)
        try:
            result = CliRunner().invoke(app, argv)
        finally:
            sys.setprofile(None)
        if result.exit_code != 0 and not self.done:
            raise SystemExit(f"tiedlm {' '.join(argv)} failed: {result.output[-2000:]}")


def _optimizer_step(frame) -> bool:
    return frame.f_code.co_name == "step" and "torch/optim" in frame.f_code.co_filename.replace("\\", "/")


def walks(warm: bool = False) -> dict[str, Walk]:
    import importlib

    for name in ("tiedlm.cli", "tiedlm.compare", "tiedlm.experiment", "tiedlm.train"):
        try:  # imported before tracing: import-time code is not counted
            importlib.import_module(name)
        except ImportError:  # an older tree, before experiment/ was split from compare/
            pass

    sets = [a for item in SMALL for a in ("--set", item)]
    config = str(ROOT / "configs" / "base.yaml")
    before = os.environ.get("TIEDLM_CACHE")
    with tempfile.TemporaryDirectory() as tmp:
        try:
            os.environ["TIEDLM_CACHE"] = f"{tmp}/compare-cache"  # never the user's own cache
            compare = Walk(skip=True)
            compare.run(["compare", "--config", config, *sets, "--tune", "train.lr=0.001,0.003", "--out",
                         f"{tmp}/runs", "--jobs", "1"])
            train = Walk(stop=_optimizer_step)
            os.environ["TIEDLM_CACHE"] = f"{tmp}/cache"  # the training walk prepares its data afresh
            if warm:  # the data prepared (tokenized, cached) before the walk, untraced
                Walk().run_untraced(["data", "--config", config, *sets])
            train.run(["train", "--config", config, *sets, "--out", f"{tmp}/one", "--name", "walk", "-q"])
        finally:
            if before is None:
                os.environ.pop("TIEDLM_CACHE", None)
            else:
                os.environ["TIEDLM_CACHE"] = before
    return {"compare": compare, "train": train}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", action="store_true", help="print JSON")
    parser.add_argument("--warm", action="store_true", help="the training walk with the token cache warm")
    args = parser.parse_args()
    found = walks(args.warm)
    if args.json:
        print(json.dumps({k: {"files": len(w.counted()), "modules": w.counted(), "directing": w.directing()}
                          for k, w in found.items()}, indent=2))
        return
    for name, w in found.items():
        mods, directing = w.counted(), w.directing()
        print(f"{name}: {len(mods)} files — {', '.join(mods)}")
        print(f"  {len(directing)} of them call into another: {', '.join(directing)}")


if __name__ == "__main__":
    main()
