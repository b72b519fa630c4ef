"""Every option and argument of every command against hostile values, as a user would type them:
each is either refused with exit 2, one line and nothing created or changed on disk, or listed
below as valid (with the reason) and then gets as far as the command's real work.

"The real work" is where a command builds its model (train, eval, analyze, sample, export), which
a stand-in stops, or the end of a command that builds none (params, data, compare, sweep,
tensorboard). A value that only a later stage refuses fails here: checks belong before the work.
"""

import hashlib
import shutil
from pathlib import Path

import pytest
import typer
import yaml
from typer.testing import CliRunner

from tiedlm.cli import app
from tiedlm.config import apply_overrides, load_config

from .conftest import TINY

runner = CliRunner()

# What a user may type for an option's value. Paths are filled in per test ({file}: a file that
# exists, {missing}: a path under a folder that does not exist).
KINDS = {
    "text": "abc",
    "negative": "-1",
    "zero": "0",
    "huge": "1" + "0" * 30,
    "nan": "nan",
    "inf": "inf",
    "empty": "",
    "newline": "a\nb",
    "file": "{file}",
    "missing": "{missing}",
}

# (command, option) -> the kinds that are valid for it, with the reason. Everything else must be
# refused. An option's "-" value (negative) is read by click as the value, not an option.
_TEXT_LIKE = ("text", "zero", "huge", "nan", "inf")  # words that are legitimate text
VALID = {
    ("train", "--seed"): ("zero",),  # any seed in [0, 2**64)
    ("train", "--name"): _TEXT_LIKE,  # run names: letters, digits, '-', '_', '.', '=', '+'
    # Folders to create: any name, "-1" too (a value, not an option, after --out). Refused: empty
    # (an unset shell variable), a control character, a file.
    ("train", "--out"): _TEXT_LIKE + ("negative", "missing"),
    ("analyze", "--out"): _TEXT_LIKE + ("negative", "missing"),
    ("analyze", "--seed"): ("zero",),
    ("export", "--out"): _TEXT_LIKE + ("negative", "missing"),  # a new folder
    ("sample", "--prompt"): _TEXT_LIKE + ("negative", "empty", "newline", "file", "missing"),  # any text
    ("sample", "--temperature"): ("zero", "huge"),  # 0 is greedy; a huge temperature is near uniform
    ("sample", "--seed"): ("zero",),
    ("sample", "--top-k"): ("huge",),  # a cap: more than the vocabulary keeps every token
    ("compare", "--out"): _TEXT_LIKE + ("negative", "missing"),  # a runs folder; compare-NAME/ is written in it
    ("compare", "--into"): _TEXT_LIKE + ("negative", "missing"),  # the comparison's own folder, made if missing
    ("compare", "--baseline"): (),  # must name a compared variant
    ("sweep", "--partition"): _TEXT_LIKE + ("negative",),  # Slurm partition names: letters, digits, _ - .
    ("sweep", "--time"): ("zero",),  # Slurm time: minutes; 0 is sbatch's "no limit"
}

# Commands, the arguments that make them valid, and the option names under test.
# RUN is a tiny trained run, CFG its config, GRID a sweep file over CFG.
COMMANDS = {
    "train": (["train", "--config", "{cfg}", "--out", "{tmp}/runs", "-q"], ["--config", "--set", "--seed", "--name", "--out"]),
    "params": (["params", "--config", "{cfg}"], ["--config", "--set", "--vocab-size"]),
    "data": (["data", "--config", "{cfg}"], ["--config", "--set"]),
    "eval": (["eval", "{run}"], ["RUN", "--split", "--stride", "--device"]),
    "analyze": (["analyze", "{run}"], ["RUN", "--out", "--split", "--sample", "--seed"]),
    "export": (["export", "{run}", "--out", "{tmp}/exported"], ["RUN", "--out", "--checkpoint"]),
    "sample": (["sample", "{run}", "--max-new-tokens", "2"],
               ["RUN", "--prompt", "--max-new-tokens", "--temperature", "--top-k", "--top-p", "--seed",
                "--num-samples", "--device"]),
    "tensorboard": (["tensorboard", "{run}"], ["RUN"]),
    "compare": (["compare", "{run}", "--out", "{tmp}/cmp"], ["RUN", "--baseline", "--primary", "--select", "--out",
                                                              "--into", "--log-to"]),
    "compare-config": (["compare", "--config", "{cfg}", "--out", "{tmp}/runs", "-q"],
                       ["--config", "--set", "--seeds", "--match", "--tune", "--max-seeds", "--min-effect", "--jobs"]),
    # --max-seeds and --min-effect above are refused without --seeds auto; here their ranges are
    "compare-auto": (["compare", "--config", "{cfg}", "--seeds", "auto", "--out", "{tmp}/runs", "-q"],
                     ["--max-seeds", "--min-effect"]),
    "sweep": (["sweep", "{grid}", "--emit", "slurm"],
              ["GRID", "--emit", "--partition", "--time", "--gpus-per-task", "--jobs"]),
}


class Reached(Exception):
    """The command got to its real work: the value was not refused."""


def _cases():
    for command, (_, options) in COMMANDS.items():
        for option in options:
            for kind in KINDS:
                yield command, option, kind


CASES = list(_cases())


def test_every_option_of_every_command_is_covered():
    group = typer.main.get_command(app)
    covered = {(c.split("-")[0], o) for c, (_, opts) in COMMANDS.items() for o in opts}
    for name, command in group.commands.items():
        if name == "cache":  # list and clear take no options
            assert all(not [p for p in sub.params] for sub in command.commands.values())
            continue
        for param in command.params:
            if param.is_flag if hasattr(param, "is_flag") else False:
                continue  # a flag takes no value
            opt = next((o for o in param.opts if o.startswith("--")), None)
            label = opt or ("GRID" if name == "sweep" else "RUN")
            assert (name, label) in covered, f"{name} {label} is not in the hostile-value test"


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    from tiedlm.train import train_run

    root = tmp_path_factory.mktemp("runs")
    cache = tmp_path_factory.mktemp("cache")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TIEDLM_CACHE", str(cache))
        run = train_run(load_config(None, TINY), out=root, progress=False)
    return run, cache


def _snapshot(root: Path) -> dict:
    out = {}
    for path in sorted(root.rglob("*")):
        rel = str(path.relative_to(root))
        out[rel] = hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else "dir"
    return out


@pytest.mark.parametrize("command, option, kind", CASES)
def test_a_hostile_value_is_refused_in_one_line_or_valid_by_design(command, option, kind, trained, tmp_path,
                                                                   monkeypatch):
    import tiedlm.model.blocks

    run_src, cache = trained
    monkeypatch.setenv("TIEDLM_CACHE", str(cache))  # the run's tokens are there already
    monkeypatch.chdir(tmp_path)
    work = tmp_path / "work"
    run = work / run_src.name
    shutil.copytree(run_src, run)
    cfg = work / "tiny.yaml"
    cfg.write_text(yaml.safe_dump(apply_overrides({}, TINY)))
    grid = work / "grid.yaml"
    grid.write_text(yaml.safe_dump({"config": "tiny.yaml", "grid": {"model.tie_embeddings": [True, False]},
                                    "seeds": [0], "out": "../sweep-runs"}))
    (work / "afile").write_text("a file\n")
    fill = {"cfg": str(cfg), "run": str(run), "grid": str(grid), "tmp": str(tmp_path),
            "file": str(work / "afile"), "missing": str(tmp_path / "nowhere" / "at-all")}
    value = KINDS[kind].format(**fill)

    def reached(*args, **kwargs):
        raise Reached()

    monkeypatch.setattr(tiedlm.model.blocks, "GPT", reached)
    base, _ = COMMANDS[command]
    args = [a.format(**fill) for a in base]
    if option in ("RUN", "GRID"):
        target = fill["grid"] if option == "GRID" else fill["run"]
        args = [value if a == target else a for a in args]
    elif option in args:
        i = args.index(option)
        args[i + 1] = value
    else:
        args += [option, value]
    before = _snapshot(tmp_path)
    r = runner.invoke(app, args)
    name = command.split("-")[0]
    valid = kind in VALID.get((name, option), ())
    shown = f"{' '.join(args)!r}: exit {r.exit_code}, {r.output.strip()[-300:]!r} {r.exception!r}"
    if valid:
        assert isinstance(r.exception, Reached) or r.exit_code == 0, shown
        return
    assert r.exit_code == 2, shown
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("tiedlm: error:"), shown
    assert "Traceback" not in r.output
    assert _snapshot(tmp_path) == before, f"{shown}: the disk changed"


# Config files that cannot be read safely as YAML: not a regular file (opening a named pipe waits
# for a writer; /dev/zero never ends, /dev/null stands in for it here), nested too deeply (PyYAML
# recurses), too large, or with a base: chain too deep. Each is refused in one line with exit 2,
# before anything is read or written.
BAD_CONFIGS = {"fifo": "not a regular file", "device": "not a regular file", "folder": "not a regular file",
               "deep-flow": "nested more than", "deep-block": "nested more than", "deep-base": "nested more than",
               "large": "larger than", "long-base-chain": "base: files nest more than"}  # -> what the line says


def _bad_config(bad: str, work: Path) -> Path:
    import os

    from tiedlm.config import yamlsafe

    cfg = work / "c.yaml"
    if bad == "fifo":
        os.mkfifo(cfg)
    elif bad == "device":
        return Path("/dev/null")
    elif bad == "folder":
        cfg.mkdir()
    elif bad == "deep-flow":
        cfg.write_text("model: " + "{a: " * 20_000 + "\n")
    elif bad in ("deep-block", "deep-base"):
        deep = "".join(" " * i + f"k{i}:\n" for i in range(200)) + " " * 200 + "1\n"
        (work / "deep.yaml").write_text(deep)
        cfg.write_text("base: deep.yaml\n" if bad == "deep-base" else deep)
    elif bad == "large":
        with open(cfg, "wb") as f:  # sparse: a size past the limit without the bytes
            f.truncate(yamlsafe.YAML_BYTES_LIMIT + 1)
    else:
        for i in range(1_000):
            (work / f"b{i}.yaml").write_text(f"base: b{i + 1}.yaml\n" if i < 999 else "train: {max_steps: 1}\n")
        cfg.write_text("base: b0.yaml\n")
    return cfg


@pytest.mark.parametrize("command", [c for c, (_, options) in COMMANDS.items() if "--config" in options])
@pytest.mark.parametrize("bad", BAD_CONFIGS)
def test_a_config_file_that_cannot_be_read_safely_is_refused_in_one_line(command, bad, tmp_path, monkeypatch):
    import signal

    import tiedlm.model.blocks

    def blocked(*_):
        raise TimeoutError("reading the config blocked")

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(tiedlm.model.blocks, "GPT", lambda *a, **k: (_ for _ in ()).throw(Reached()))
    work = tmp_path / "work"
    work.mkdir()
    cfg = _bad_config(bad, work)
    args = [a.format(cfg=cfg, tmp=tmp_path) for a in COMMANDS[command][0]]
    before = _snapshot(tmp_path)
    previous = signal.signal(signal.SIGALRM, blocked)
    signal.alarm(20)
    try:
        r = runner.invoke(app, args)
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
    shown = f"{' '.join(args)!r}: exit {r.exit_code}, {r.output.strip()[-300:]!r} {r.exception!r}"
    assert r.exit_code == 2, shown
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("tiedlm: error:") and BAD_CONFIGS[bad] in lines[0], shown
    assert "Traceback" not in r.output
    assert _snapshot(tmp_path) == before, f"{shown}: the disk changed"


# A grid file's own values, each hostile kind (and every line break) in each field that reaches the
# emitted commands: `sweep --dry-run` / `--emit shell` refuses it in one line, or every line it
# prints parses (shlex) as exactly one `tiedlm train` command, the one the grid means.
GRID_FIELDS = ("config", "out", "name", "set", "grid")
LINE_KINDS = {f"break-{ord(c):x}": f"a{c}touch PWNED" for c in "\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029\x00"}


@pytest.mark.parametrize("field", GRID_FIELDS)
@pytest.mark.parametrize("kind", [*KINDS, *LINE_KINDS])
def test_a_hostile_grid_value_is_refused_or_emitted_one_command_per_line(field, kind, tmp_path, monkeypatch):
    import shlex

    from tiedlm.experiment.sweep import load_grid, sweep_commands

    monkeypatch.chdir(tmp_path)
    (tmp_path / "tiny.yaml").write_text(yaml.safe_dump(apply_overrides({}, TINY)))
    (tmp_path / "afile").write_text("a file\n")
    value = {**KINDS, **LINE_KINDS}[kind].format(file=str(tmp_path / "afile"), missing=str(tmp_path / "no" / "where"))
    data = {"config": "tiny.yaml", "grid": {"model.tie_embeddings": [True, False]}, "seeds": [0], "out": "runs"}
    if field in ("config", "out", "name"):
        data[field] = value
    elif field == "set":
        data["set"] = [f"data.name={value}"]
    else:
        data["grid"]["data.text_column"] = [value]
    grid = tmp_path / "grid.yaml"
    grid.write_text(yaml.safe_dump(data))
    before = _snapshot(tmp_path)
    for args in (["--dry-run"], ["--emit", "shell"]):
        r = runner.invoke(app, ["sweep", str(grid), *args])
        shown = f"{field}={value!r} {args}: exit {r.exit_code}, {r.output.strip()[-300:]!r} {r.exception!r}"
        if r.exit_code == 0:
            commands = [shlex.split(line) for line in r.stdout.splitlines()]
            assert commands == sweep_commands(load_grid(grid)) and len(commands) == 2, shown
            assert all(c[:2] == ["tiedlm", "train"] and c.count("tiedlm") == 1 for c in commands), shown
        else:
            assert r.exit_code == 2, shown
            lines = r.stderr.strip().splitlines()
            assert len(lines) == 1 and lines[0].startswith("tiedlm: error:") and "Traceback" not in r.output, shown
        assert _snapshot(tmp_path) == before, f"{shown}: the disk changed"
