"""Emitted sweeps and tuning specs against hostile or ambiguous input: a value that cannot stand on
one line of `--dry-run` / `--emit shell`, a grid name that would be cleaned into another, tuning
keys that change the data, a tuning of one point, whole-number grids of a real setting, a bare
number of tuning seeds, and tune: keys that are empty, unknown or nested."""

import os
import shlex
import subprocess
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

import tiedlm.compare as C
from tiedlm.cli import app
from tiedlm.errors import ConfigError
from tiedlm.experiment.sweep import LINE_BREAKS, load_grid, sweep_commands
from tiedlm.experiment.tuning_spec import extend_value, spec_from_block, spec_from_options, whole_key

from .test_compare_tuning import run, stand_in  # noqa: F401 (a fixture)
from .test_hardening_resources import SHELL, files_under, refused, write_grid
from .conftest import comparison_dir

runner = CliRunner()

# The character classes of the Slurm injection tests (grid values, the sweep's name and set:),
# every line break str.splitlines() knows, and NUL.
SLURM_VALUES = ["$(touch PWNED1)", "`touch PWNED2`; touch PWNED3", "x' ; touch PWNED4 ; '", "a\ntouch PWNED5",
                'x" && touch PWNED6 && "', "$HOME *", "n$(touch PWNED7)", "$(touch PWNED8)"]
BREAKS = [f"a{c}touch PWNED9 #" for c in LINE_BREAKS]
VALUES = list(dict.fromkeys(SLURM_VALUES + [v for v in SHELL if v] + BREAKS + ["a\ttab", "ü € 中"]))


def test_line_breaks_are_every_character_splitlines_breaks_at_and_nul():
    import sys

    breaks = {c for c in map(chr, range(sys.maxunicode + 1)) if len(f"a{c}b".splitlines()) > 1}
    assert set(LINE_BREAKS) == breaks | {"\0"}


def _stub(tmp_path: Path) -> dict:
    """PATH with a `tiedlm` that appends its arguments, NUL-separated, to calls.bin."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    stub = bin_dir / "tiedlm"
    stub.write_text(f'#!/bin/sh\nprintf "%s\\0" "$@" >> {shlex.quote(str(tmp_path / "calls.bin"))}\n'
                    f'printf "\\n" >> {shlex.quote(str(tmp_path / "calls.bin"))}\n')
    stub.chmod(0o755)
    return {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"}


def _grid_with(tmp_path: Path, where: str, value: str) -> Path:
    if where == "grid":
        return write_grid(tmp_path, grid={"data.text_column": [value, "text"]})
    if where == "set":
        return write_grid(tmp_path, set=["train.max_steps=3", f"data.name={value}"])
    if where == "out":
        return write_grid(tmp_path, out=value)
    grid = write_grid(tmp_path)  # config: a file of that name (none can hold a NUL)
    if "\0" not in value:
        (tmp_path / value).write_text((tmp_path / "base.yaml").read_text())
    data = yaml.safe_load(grid.read_text())
    grid.write_text(yaml.safe_dump({**data, "config": value}))
    return grid


@pytest.mark.parametrize("where", ["grid", "set", "out", "config"])
@pytest.mark.parametrize("value", VALUES, ids=ascii)
def test_every_emitted_line_is_exactly_one_tiedlm_command(where, value, tmp_path, monkeypatch):
    """Each line of --dry-run / --emit shell, split as docs/scale.md's pipeline splits it, parses as
    one `tiedlm train` command with the grid's values; run through that pipeline (tiedlm a stub), it
    runs those commands and nothing else. A value that cannot be written on one line is refused."""
    monkeypatch.chdir(tmp_path)
    grid = _grid_with(tmp_path, where, value)
    before = files_under(tmp_path)
    for args in (["--dry-run"], ["--emit", "shell"]):
        r = runner.invoke(app, ["sweep", str(grid), *args])
        if any(c in value for c in LINE_BREAKS):
            key = {"grid": "grid: data.text_column", "set": "set:", "out": "out:", "config": "config:"}[where]
            nul = "\0" in value and where in ("out", "config")  # no path holds one: refused when the grid is read
            refused(r, f"grid.yaml: {key}", "holds a NUL character" if nul else "cannot be written on one line")
            assert files_under(tmp_path) == before
            continue
        assert r.exit_code == 0, r.output
        lines = r.stdout.splitlines()
        expected = sweep_commands(load_grid(grid))
        assert [shlex.split(line) for line in lines] == expected
        assert all(cmd[:2] == ["tiedlm", "train"] and cmd.count("tiedlm") == 1 for cmd in expected)
    if any(c in value for c in LINE_BREAKS):
        return
    env = _stub(tmp_path)
    # docs/scale.md: tiedlm sweep GRID --dry-run | xargs -d '\n' -P 2 -I{} sh -c '{}'
    done = subprocess.run(["xargs", "-d", "\n", "-I{}", "sh", "-c", "{}"], input=r.stdout.encode(), cwd=tmp_path,
                          env=env, capture_output=True, timeout=60)
    assert done.returncode == 0, done.stderr
    calls = [c.split(b"\0") for c in (tmp_path / "calls.bin").read_bytes().split(b"\0\n")[:-1]]
    assert sorted(calls) == sorted([[a.encode() for a in cmd[1:]] for cmd in expected])
    assert not list(tmp_path.rglob("PWNED*"))


def test_a_newline_in_a_paired_axis_value_is_refused_and_the_message_is_one_line(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    grid = write_grid(tmp_path, grid={"pair": [{"data.text_column": "a\ntouch PWNED #", "train.lr": 1e-3}]})
    refused(runner.invoke(app, ["sweep", str(grid), "--dry-run"]), "grid: data.text_column", r'"a\ntouch PWNED #"')
    # a value the config refuses is quoted on one line too, when the sweep trains
    grid = write_grid(tmp_path, grid={"model.n_embd": ["a\nb"]})
    refused(runner.invoke(app, ["sweep", str(grid)]), 'model.n_embd="a\\nb"')


@pytest.mark.parametrize("name", ["my sweep", "n$(touch PWNED7)", "../up", "-x", ".hidden", "a/b", "a\nb", "x" * 201])
def test_a_grid_name_that_would_be_cleaned_is_refused(name, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    grid = write_grid(tmp_path, name=name)
    for args in (["--dry-run"], ["--emit", "shell"], ["--emit", "slurm"], ["-q"]):
        refused(runner.invoke(app, ["sweep", str(grid), *args]), "grid.yaml: name:", "use letters, digits")
    assert not (tmp_path / "runs").exists() and not list(tmp_path.glob("PWNED*"))
    grid = write_grid(tmp_path, name="my_sweep.v2")  # a name as --name takes it is taken as written
    assert all(c[c.index("--name") + 1].startswith("my_sweep.v2-") for c in sweep_commands(load_grid(grid)))


# ---------------------------------------------------------------------------- tuning keys and values


@pytest.mark.parametrize("item", ["tokenizer.vocab_size=150,512", "data.synthetic.seed=0,1,2", "data.path=a,b",
                                  "data.train_fraction=0.5,1", "tokenizer.kind=1,2"])
def test_tuning_a_data_or_tokenizer_key_is_refused_with_the_reason(item):
    with pytest.raises(ConfigError, match="cannot be tuned — validation perplexity is not comparable") as info:
        spec_from_options([item])
    assert "\n" not in str(info.value) and item.split("=")[0] in str(info.value)


def test_a_data_key_in_a_grid_files_tune_block_is_refused(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    grid = write_grid(tmp_path, tune={"data.synthetic.seed": [0, 1, 2]})
    refused(runner.invoke(app, ["sweep", str(grid)]), "grid.yaml: data.synthetic.seed cannot be tuned", "corpora")
    paired = write_grid(tmp_path, tune={"p": [{"train.lr": 1e-3, "tokenizer.vocab_size": 150}]})
    refused(runner.invoke(app, ["sweep", str(paired)]), "tokenizer.vocab_size cannot be tuned")
    assert not (tmp_path / "runs").exists()


def test_a_data_key_in_compares_tune_is_refused_before_anything_trains(tmp_path, stand_in):  # noqa: F811
    with pytest.raises(ConfigError, match="tokenizer.vocab_size cannot be tuned"):
        run(tmp_path, stand_in, ["tokenizer.vocab_size=150,512"])
    assert stand_in.calls == []


def test_a_single_tuning_value_says_nothing_was_compared(tmp_path, stand_in):  # noqa: F811
    c = run(tmp_path, stand_in, ["train.lr=1e-3"], seeds=2)
    assert c.tuning.only_point == "lr=0.001"
    text = C.format_terminal_table(c)
    assert "Not tuned: train.lr was given one value, lr=0.001, so" in text and "nothing was compared" in text
    assert "Tuned on validation" not in text and "chosen" not in text.replace("nor chosen", "").replace(
        "or chosen", "")
    assert not any("at its own" in n for n in c.notes) and any("nothing was compared" in n for n in c.notes)
    md = (comparison_dir(tmp_path / "runs") / "comparison.md").read_text()
    assert "## Tuning: one point, nothing compared" in md and "Each variant at its own setting" not in md
    assert "* marks" not in md and "at its own" not in md and "0.001*" not in md and "chosen:" not in md
    two = run(tmp_path / "two", stand_in, ["train.lr=1e-3,3e-3"])
    assert two.tuning.only_point is None and "Tuned on validation" in C.format_terminal_table(two)


def test_a_tuned_sweep_of_one_point_says_nothing_was_compared(tmp_path, monkeypatch, stand_in):  # noqa: F811
    from tiedlm.compare import compare_runs
    from tiedlm.experiment.sweep import format_sweep_summary, run_sweep

    (tmp_path / "base.yaml").write_text("name: base\nmodel:\n  n_head: 2\ntrain:\n  max_steps: 10\n  warmup_steps: 1\n")
    grid = tmp_path / "grid.yaml"
    grid.write_text("config: base.yaml\ngrid:\n  model.tie_embeddings: [true, false]\nseeds: 2\nout: runs\n"
                    "tune:\n  train.lr: [1.0e-3]\n")
    summary = run_sweep(load_grid(grid), progress=False, train=stand_in.train)
    text = format_sweep_summary(summary)
    assert "not tuned: train.lr was given one value, lr=0.001" in text and "tuned on validation" not in text
    c = compare_runs([tmp_path / "runs"], out=tmp_path / "cmp")
    assert any("nothing was compared" in n for n in c.notes)
    assert not any("tuned per variant" in n or n.startswith("chosen:") for n in c.notes)


def test_a_whole_number_grid_of_a_real_setting_extends_geometrically(tmp_path, stand_in):  # noqa: F811
    assert extend_value([5, 8], 5, -1, whole_key("train.lr")) == 3.12
    assert extend_value([5, 8], 8, +1, whole_key("train.lr")) == 12.8
    assert extend_value([64, 128], 128, +1, whole_key("model.n_embd")) == 256  # an integer setting stays whole
    assert isinstance(extend_value([64, 128], 128, +1, whole_key("model.n_embd")), int)
    assert whole_key("train.lr") is False and whole_key("train.max_tokens") is True and whole_key("bogus") is None
    c = run(tmp_path, stand_in, ["train.lr=5,8"])  # both optima far below: the grid grows down to its limit
    for v in c.tuning.variants:
        assert sorted(p.point["train.lr"] for p in v.points) == [1.22, 1.95, 3.12, 5, 8]


def test_a_bare_number_of_tuning_seeds_is_refused_with_both_readings():
    with pytest.raises(ConfigError, match=r"seeds: 3 is ambiguous .* seeds: \[3\] .* seeds: \[0, 1, 2\]") as info:
        spec_from_block({"train.lr": [1e-3, 3e-3], "seeds": 3}, "cfg.yaml")
    assert "\n" not in str(info.value)
    assert spec_from_block({"train.lr": [1e-3], "seeds": [3]}, "cfg.yaml").seeds == [3]
    assert spec_from_options(["train.lr=1e-3", "seeds=3"]).seeds == [3]  # --tune's values are always a list


def test_a_bare_number_of_tuning_seeds_in_a_grid_file_is_refused(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    grid = write_grid(tmp_path, seeds=3, tune={"train.lr": [1e-3, 3e-3], "seeds": 3})
    refused(runner.invoke(app, ["sweep", str(grid)]), "seeds: 3 is ambiguous", "seeds: [0, 1, 2]")


@pytest.mark.parametrize("block, message", [
    ({"bogus": True}, "unknown key 'bogus' — give a config key such as train.lr"),
    ({"bogus": [1, 2]}, "unknown key 'bogus'"),
    ({"lr": [1e-3, 3e-3]}, "unknown key 'lr' — did you mean train.lr?"),
    ({"train.lrr": [1e-3]}, "did you mean train.lr?"),
    ({"train.lr": [1e-3], "extnd": False}, "unknown key 'extnd' — did you mean extend?"),
    ({"train": {"lr": [1e-3, 3e-3]}}, r"train holds a mapping — write tuned keys dotted, e.g. tune: \{train.lr:"),
    ({"train": [1, 2]}, "train is a section of the config, not a setting"),
])
def test_a_bad_tune_block_key_says_what_it_is(block, message):
    with pytest.raises(ConfigError, match=message) as info:
        spec_from_block(block, "cfg.yaml")
    assert str(info.value).startswith("cfg.yaml: tune:") and "\n" not in str(info.value)


def test_an_empty_tune_key_is_named():
    for item in ("=1,2", " =1,2"):
        with pytest.raises(ConfigError, match="has no key before '='"):
            spec_from_options([item])
    with pytest.raises(ConfigError, match=r"^--tune unknown key 'bogus'"):
        spec_from_options(["bogus=1,2"])


def test_a_nested_tune_block_in_a_config_is_refused_on_the_command_line(tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("name: c\ntrain:\n  max_steps: 2\n  warmup_steps: 1\ntune:\n  train:\n    lr: [1.0e-3, 3.0e-3]\n")
    r = runner.invoke(app, ["compare", "--config", str(cfg), "--out", str(tmp_path / "runs"), "-q"])
    refused(r, "tune: train holds a mapping", "train.lr")
    assert not (tmp_path / "runs").exists()
