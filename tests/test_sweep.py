"""sweep.py and scripts/sweep.sh: grid files, --dry-run commands, sequential runs with failures."""

import contextlib
import io
import os
import shlex
import subprocess
import types
import sys
from pathlib import Path

import pytest

from tiedlm.config import load_config
from tiedlm.config.identity import config_hash
from tiedlm.errors import ConfigError, DataError
from tiedlm.runs import RunRecord, RunReport
from tiedlm.experiment.sweep import load_grid, run_sweep, sweep_commands
from tiedlm.config.naming import yaml_value

ROOT = Path(__file__).resolve().parents[1]


@contextlib.contextmanager
def raises_exactly(kind: type, match: str | None = None):
    """pytest.raises, and the error is of exactly this type (not a subclass)."""
    with pytest.raises(kind, match=match) as info:
        yield info
    assert info.type is kind, f"{info.type.__name__} raised, {kind.__name__} expected"


def write_grid(tmp_path: Path, grid_text: str) -> Path:
    (tmp_path / "configs").mkdir(exist_ok=True)
    (tmp_path / "configs" / "base.yaml").write_text(
        "name: base\nmodel:\n  n_layer: 2\n  n_head: 2\n  n_embd: 32\ntrain:\n  max_steps: 10\n")
    (tmp_path / "grids").mkdir(exist_ok=True)
    path = tmp_path / "grids" / "grid.yaml"
    path.write_text(grid_text)
    return path


GRID = """\
config: ../configs/base.yaml
set: ["train.max_steps=200"]
grid:
  model.tie_embeddings: [true, false]
  model.n_embd: [64, 128]
seeds: [0, 1, 2]
out: ../runs
"""


def test_dry_run_prints_one_command_per_run_that_parses_back(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    grid = load_grid(write_grid(tmp_path, GRID))
    buf = io.StringIO()
    summary = run_sweep(grid, dry_run=True, stream=buf)
    lines = buf.getvalue().splitlines()
    assert len(lines) == 12 == summary.total and summary.commands == lines
    expected = set()
    for tie in ("true", "false"):
        for n in (64, 128):
            for s in (0, 1, 2):
                expected.add(("tiedlm", "train", "--config", "configs/base.yaml",
                              "--set", "train.max_steps=200", "--set", f"model.tie_embeddings={tie}",
                              "--set", f"model.n_embd={n}", "--seed", str(s),
                              "--name", f"base-tie_embeddings={tie}-n_embd={n}-s{s}", "--out", "runs"))
    parsed = {tuple(shlex.split(line)) for line in lines}
    assert parsed == expected
    assert {tuple(c) for c in sweep_commands(grid)} == expected
    # each command's --set values resolve to the config its name says
    for cmd in parsed:
        sets = [cmd[i + 1] for i, a in enumerate(cmd) if a == "--set"]
        cfg = load_config(cmd[cmd.index("--config") + 1], sets, seed=int(cmd[cmd.index("--seed") + 1]))
        name = cmd[cmd.index("--name") + 1]
        assert name == f"base-tie_embeddings={'true' if cfg.model.tie_embeddings else 'false'}-n_embd={cfg.model.n_embd}-s{cfg.seed}"
        assert cfg.train.max_steps == 200


def test_names_are_unique_sanitised_and_values_quoted(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    grid = load_grid(write_grid(tmp_path, """\
config: ../configs/base.yaml
name: my_sweep
set: ["train.min_lr=0"]
grid:
  data.path: ["builtin:synthetic", "data/my corpus", "data/my_corpus", "it's"]
  train.lr: [1.0e-5, 0.001]
seeds: 2
"""))
    cmds = sweep_commands(grid)
    assert len(cmds) == 4 * 2 * 2
    names = [c[c.index("--name") + 1] for c in cmds]
    assert len(set(names)) == len(names)
    for name in names:
        assert "/" not in name and " " not in name and "'" not in name and not name.startswith(".")
    assert "my_sweep-path=builtin_synthetic-lr=1e-05-s0" in names
    buf = io.StringIO()
    run_sweep(grid, dry_run=True, stream=buf)
    values = set()
    for line in buf.getvalue().splitlines():
        args = shlex.split(line)
        sets = [args[i + 1] for i, a in enumerate(args) if a == "--set"]
        cfg = load_config(args[args.index("--config") + 1], sets)
        values.add((cfg.data.path, cfg.train.lr))
    assert values == {(p, lr) for p in ("builtin:synthetic", "data/my corpus", "data/my_corpus", "it's")
                      for lr in (1e-5, 0.001)}
    assert grid.out == Path("runs")  # default: the working directory's runs/


def test_yaml_value_round_trips():
    import yaml

    for v in (True, False, None, 3, 1e-5, 0.25, "abc", "true", "a: b", [0.1, 0.5], "1e-3"):
        assert yaml.safe_load(yaml_value(v)) == v


@pytest.mark.parametrize("text, message", [
    ("config: ../configs/base.yaml\ngrids: {}\n", "did you mean grid"),
    ("config: ../configs/base.yaml\ngrid:\n  model.n_emb: [1]\n", "did you mean model.n_embd"),
    ("config: ../configs/nope.yaml\n", "does not exist"),
    ("grid: {}\n", "config: must name"),
    ("config: ../configs/base.yaml\nseeds: [0, zero]\n", "seeds: must be a list"),
    ("config: ../configs/base.yaml\nseeds: [1, 1]\n", "repeats a seed"),
    ("config: ../configs/base.yaml\ngrid:\n  model.n_embd: []\n", "has no values"),
    ("config: ../configs/base.yaml\nset: [train.max_step=3]\n", "did you mean train.max_steps"),
    ("- just a list\n", "must be a mapping"),
    ("config: [unclosed\n", "invalid YAML"),
])
def test_load_grid_errors_say_what_is_wrong(tmp_path, text, message):
    with raises_exactly(ConfigError, match=message):
        load_grid(write_grid(tmp_path, text))


def test_invalid_grid_point_names_the_point(tmp_path):
    grid = load_grid(write_grid(tmp_path, "config: ../configs/base.yaml\ngrid:\n  model.n_embd: [64, 33]\n"))
    with raises_exactly(ConfigError, match=r"grid point model.n_embd=33: .*divisible"):
        sweep_commands(grid)
    with raises_exactly(ConfigError):
        load_grid(tmp_path / "missing.yaml")


@pytest.fixture
def fake_train():
    """A fake train_run, passed to run_sweep: writes a finished report through the report schema."""
    calls, fail = [], set()

    def train_run(cfg, out=Path("runs"), name=None, overwrite=False, progress=True, **_):
        calls.append(name)
        if name in fail:
            raise DataError(f"{name}: the validation split is empty")
        run = Path(out) / name
        run.mkdir(parents=True, exist_ok=True)
        report = RunReport(name=name, status="finished", seed=cfg.seed, config_hash=config_hash(cfg),
                           config=cfg)
        RunRecord(run, report).write()
        return run

    return types.SimpleNamespace(calls=calls, fail=fail, train=train_run)


def test_run_sweep_runs_in_order_survives_failures_and_skips_finished(tmp_path, fake_train, capsys):
    grid = load_grid(write_grid(tmp_path, GRID.replace("seeds: [0, 1, 2]", "seeds: [0, 1]")))
    bad = "base-tie_embeddings=false-n_embd=64-s1"
    fake_train.fail.add(bad)
    summary = run_sweep(grid, dry_run=False, progress=False, train=fake_train.train)
    # grid order (the file's keys, the last one fastest), then seeds
    assert fake_train.calls == [f"base-tie_embeddings={t}-n_embd={n}-s{s}"
                                for t in ("true", "false") for n in (64, 128) for s in (0, 1)]
    assert summary.failed == [bad] and summary.trained == 7 and summary.skipped == 0
    entry = next(r for r in summary.runs if r.name == bad)
    assert entry.status == "failed" and "validation split is empty" in entry.error
    assert entry.seed == 1 and entry.point == {"model.tie_embeddings": False, "model.n_embd": 64}
    assert entry.path == str(tmp_path / "runs" / bad)
    assert bad in capsys.readouterr().err  # failures are shown even without progress
    assert (tmp_path / "runs" / "base-tie_embeddings=true-n_embd=128-s1" / "report.json").exists()

    fake_train.calls.clear()
    fake_train.fail.clear()
    again = run_sweep(grid, dry_run=False, progress=False, train=fake_train.train)
    assert fake_train.calls == [bad]  # only the failed run is tried again
    assert again.skipped == 7 and again.trained == 1 and again.failed == []
    from tiedlm.experiment.sweep import format_sweep_summary

    assert "7 already finished" in format_sweep_summary(again)
    assert "failed" in format_sweep_summary(summary) and bad in format_sweep_summary(summary)


def test_shipped_example_grid_loads():
    if not (ROOT / "configs" / "base.yaml").exists():
        pytest.skip("configs/base.yaml, which the example grid names, is not in the tree yet")
    grid = load_grid(ROOT / "configs" / "sweep-example.yaml")
    assert grid.config == ROOT / "configs" / "base.yaml"
    assert grid.grid == {"model.tie_embeddings": [True, False], "model.n_embd": [64, 128]}
    assert grid.seeds == [0, 1, 2] and grid.out == ROOT / "runs"
    assert len(sweep_commands(grid)) == 12


def test_sweep_sh_loops_over_seeds_and_tying_then_compares(tmp_path):
    log = tmp_path / "calls.txt"
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "tiedlm"  # records its arguments, one call per line; fails for one run
    fake.write_text('#!/usr/bin/env bash\nprintf "%s\\t" "$@" >> "$TIEDLM_LOG"\necho >> "$TIEDLM_LOG"\n'
                    'case "$*" in *"--name tiny-untied-s0 "*) exit 1;; esac\n')
    fake.chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}", "TIEDLM_LOG": str(log)}
    proc = subprocess.run(["bash", str(ROOT / "scripts" / "sweep.sh"), "configs/tiny.yaml", "2", "out",
                           "--set", "train.max_steps=5"], env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1 and "failed: tiny-untied-s0" in proc.stderr
    calls = [line.rstrip("\t").split("\t") for line in log.read_text().splitlines()]
    trains = [c for c in calls if c[0] == "train"]
    assert len(trains) == 4  # the failure did not stop the loop
    names = {c[c.index("--name") + 1] for c in trains}
    assert names == {"tiny-tied-s0", "tiny-untied-s0", "tiny-tied-s1", "tiny-untied-s1"}
    for c in trains:
        tie = "true" if "-tied-" in c[c.index("--name") + 1] else "false"
        assert c[c.index("--config") + 1] == "configs/tiny.yaml"
        assert f"model.tie_embeddings={tie}" in c and "train.max_steps=5" in c
        assert c[c.index("--out") + 1] == "out"
    assert calls[-1] == ["compare", "out/tiny-tied-s*", "out/tiny-untied-s*", "--out", "out"]


def test_duplicate_keys_in_a_grid_file_are_refused(tmp_path):
    grid = tmp_path / "grid.yaml"
    grid.write_text("config: base.yaml\nseeds: [0]\ngrid:\n  model.n_embd: [64]\nseeds: [1, 2]\n")
    with raises_exactly(ConfigError, match=r"duplicate key 'seeds' \(lines 2 and 5\)"):
        load_grid(grid)


TINY_GRID = """\
config: ../configs/base.yaml
set: ["train.max_steps=3", "train.warmup_steps=1", "train.eval_every=0", "model.n_layer=1", "model.n_embd=16", "model.block_size=16",
      "train.batch_size=4", "data.synthetic.train_tokens=4000", "data.synthetic.validation_tokens=500",
      "data.synthetic.test_tokens=500", "train.device=cpu", "train.threads=1"]
grid:
  model.tie_embeddings: [true, false]
seeds: [0, 1]
out: ../runs
slurm: {partition: debug, time: "00:10:00"}
"""


def test_emit_slurm_is_one_array_task_per_run_and_runs_exactly_the_kth(tmp_path, monkeypatch):
    import os
    import subprocess

    from typer.testing import CliRunner

    from tiedlm.cli import app

    monkeypatch.chdir(tmp_path)
    grid = write_grid(tmp_path, TINY_GRID)
    r = CliRunner().invoke(app, ["sweep", str(grid), "--emit", "slurm", "--time", "01:00:00", "--gpus-per-task", "1"])
    assert r.exit_code == 0, r.output
    script = tmp_path / "job.sh"
    script.write_text(r.stdout)
    assert subprocess.run(["bash", "-n", str(script)]).returncode == 0
    lines = r.stdout.splitlines()
    assert "#SBATCH --array=0-3" in lines and "#SBATCH --partition=debug" in lines
    assert "#SBATCH --time=01:00:00" in lines and "#SBATCH --gpus-per-task=1" in lines  # the command line wins
    names = [ln.split("--name ")[1].split()[0] for ln in lines if ln.strip()[:2] in ("0)", "1)", "2)", "3)")]
    assert len(names) == 4 and len(set(names)) == 4
    env = {**os.environ, "SLURM_ARRAY_TASK_ID": "2", "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    done = subprocess.run(["bash", str(script)], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert sorted(p.name for p in (tmp_path / "runs").iterdir()) == [names[2]]  # that run and no other
    bad = subprocess.run(["bash", str(script)], env={**env, "SLURM_ARRAY_TASK_ID": "9"}, capture_output=True, text=True)
    assert bad.returncode == 2 and "no run for array task 9" in bad.stderr
    shell = CliRunner().invoke(app, ["sweep", str(grid), "--emit", "shell"])
    assert shell.exit_code == 0 and len(shell.stdout.strip().splitlines()) == 4
    wrong = CliRunner().invoke(app, ["sweep", str(grid), "--partition", "x"])
    assert wrong.exit_code == 2 and "only applies with --emit slurm" in wrong.stderr


def test_an_unquoted_slurm_time_is_refused_with_the_fix(tmp_path):
    from tiedlm.experiment.sweep import load_grid

    grid = write_grid(tmp_path, TINY_GRID.replace('time: "00:10:00"', "time: 2:00:00"))
    with pytest.raises(ConfigError, match='time must be quoted, e.g. time: "02:00:00"'):
        load_grid(grid)


def test_a_paired_axis_sets_its_keys_together(tmp_path):
    from tiedlm.experiment.sweep import expand, load_grid

    (tmp_path / "base.yaml").write_text("name: base\ntrain:\n  max_steps: 10\n")
    grid = tmp_path / "grid.yaml"
    grid.write_text("config: base.yaml\ngrid:\n  model.tie_embeddings: [true, false]\n  schedule:\n"
                    "    - {train.lr: 1.0e-3, train.warmup_steps: 2}\n    - {train.lr: 3.0e-3, train.warmup_steps: 4}\n")
    runs = expand(load_grid(grid))
    got = sorted((r.cfg.model.tie_embeddings, r.cfg.train.lr, r.cfg.train.warmup_steps) for r in runs)
    assert got == [(False, 1e-3, 2), (False, 3e-3, 4), (True, 1e-3, 2), (True, 3e-3, 4)]  # never 1e-3 with 4
    assert "base-tie_embeddings=true-lr=0.001-warmup_steps=2-s0" in [r.name for r in runs]


@pytest.mark.parametrize("body, message", [
    ("  s:\n    - {train.lr: 1.0e-3}\n    - {train.warmup_steps: 2}\n", "must each set the same keys"),
    ("  s:\n    - {train.lr: 1.0e-3}\n    - 2\n", "mixes mappings and single values"),
    ("  s:\n    - {train.lrr: 1.0e-3}\n", "train.lrr"),
    ("  train.lr: [1.0e-3]\n  s:\n    - {train.lr: 1.0e-3}\n", "on two axes"),
])
def test_a_bad_paired_axis_is_one_line(tmp_path, body, message):
    from tiedlm.errors import ConfigError
    from tiedlm.experiment.sweep import load_grid

    (tmp_path / "base.yaml").write_text("name: base\n")
    grid = tmp_path / "grid.yaml"
    grid.write_text("config: base.yaml\ngrid:\n" + body)
    with pytest.raises(ConfigError, match=message) as info:
        load_grid(grid)
    assert "\n" not in str(info.value)


def test_a_tuned_sweep_tunes_each_grid_point_and_trains_every_seed_at_its_choice(tmp_path, monkeypatch):
    """tune: in a grid file: each grid point is tuned on the first seed (a stand-in trainer with a
    known optimum per width), then every seed trains at the chosen value."""
    import math
    import shutil
    import types

    import tiedlm.data
    from tests.test_compare import V, make_run
    from tiedlm import runs as run_folder
    from tiedlm.experiment.sweep import format_sweep_summary

    best = {32: 1e-2, 64: 3e-3}
    trained = []

    def train(cfg, out, name, progress=True, overwrite=False, **_):
        run_dir = Path(out) / name
        if run_folder.existing_state(run_dir, cfg) == "finished":
            return run_dir
        trained.append(name)
        shutil.rmtree(run_dir, ignore_errors=True)
        val = 40 * (1 + math.log(cfg.train.lr / best[cfg.model.n_embd]) ** 2) + cfg.seed
        return make_run(Path(out), name, cfg.seed, val=val, cfg=cfg)

    monkeypatch.setattr(tiedlm.data, "prepare_data", lambda cfg, progress=True: types.SimpleNamespace(model_vocab_size=V))
    (tmp_path / "base.yaml").write_text("name: base\nmodel:\n  n_head: 2\ntrain:\n  max_steps: 10\n")
    grid = tmp_path / "grid.yaml"
    grid.write_text("config: base.yaml\ngrid:\n  model.n_embd: [32, 64]\nseeds: 2\nout: runs\n"
                    "tune:\n  train.lr: [1.0e-3, 3.0e-3, 1.0e-2]\n")
    summary = run_sweep(load_grid(grid), progress=False, train=train)
    chosen = {v.tag: v.chosen.point["train.lr"] for v in summary.tuning.variants}
    assert chosen == {"n_embd=32": 1e-2, "n_embd=64": 3e-3}
    assert summary.tuning.variant("n_embd=32").extensions == {"train.lr:+1": 1}  # 1e-2 was the edge: 3e-2 tried
    assert sorted(e.name for e in summary.runs) == ["base-n_embd=32-lr=0.01-s0", "base-n_embd=32-lr=0.01-s1",
                                                     "base-n_embd=64-lr=0.003-s0", "base-n_embd=64-lr=0.003-s1"]
    assert len(trained) == 3 + 1 + 3 + 2  # the grid (and one step past 32's edge), then seed 1 at each choice
    text = format_sweep_summary(summary)
    assert "n_embd=32: lr=0.01" in text and f"tiedlm compare {tmp_path / 'runs'}" in text
    import json

    record = json.loads((tmp_path / "runs" / "tuning.json").read_text())
    assert record["chosen"] == sorted(e.name for e in summary.runs) and record["keys"][0] == "train.lr"
    # compare on the folder: each point at its choice, the other tuning runs left out, the verdict on test
    from tiedlm.compare import compare_runs

    c = compare_runs([tmp_path / "runs"], out=tmp_path / "cmp")
    assert sorted(v.label for v in c.variants) == ["n_embd=32", "n_embd=64"] and c.primary == "test"
    assert sorted(s.name for s in c.skipped if "did not choose" in s.reason) == [
        "base-n_embd=32-lr=0.001-s0", "base-n_embd=32-lr=0.003-s0", "base-n_embd=32-lr=0.0333-s0",
        "base-n_embd=64-lr=0.001-s0", "base-n_embd=64-lr=0.01-s0"]
    assert any("tuned per variant on validation (" in n for n in c.notes)
    with pytest.raises(Exception, match="so the verdict is on test"):
        compare_runs([tmp_path / "runs"], out=tmp_path / "cmp", primary="validation")
    assert any(n.startswith("chosen: n_embd=32: lr=0.01; n_embd=64: lr=0.003") for n in c.notes)
    # runs named one by one are compared as given: the record speaks only for its whole folder
    some = sorted((tmp_path / "runs").glob("base-n_embd=32-*"))
    c = compare_runs([str(p) for p in some], out=tmp_path / "cmp2", primary="test")
    assert sorted(v.label for v in c.variants) == ["lr=0.001", "lr=0.003", "lr=0.01", "lr=0.0333"]
    # a chosen run that went missing is listed; a run the sweep did not train switches the record off
    shutil.rmtree(tmp_path / "runs" / "base-n_embd=64-lr=0.003-s1")
    c = compare_runs([tmp_path / "runs"], out=tmp_path / "cmp3")
    assert [s.reason for s in c.skipped if s.name == "base-n_embd=64-lr=0.003-s1"] == [
        "chosen by the tuning (tuning.json), but not there"]
    make_run(tmp_path / "runs", "stranger-s0", 0, val=50.0, cfg=load_config(tmp_path / "base.yaml"))
    c = compare_runs([tmp_path / "runs"], out=tmp_path / "cmp4", baseline="stranger-s0")
    assert not any("tuning.json" in n for n in c.notes) and c.primary == "validation"
    # a new tuned sweep removes the old record first: an interrupted one leaves none behind
    from tiedlm.experiment.tuning import check_record_target

    check_record_target(tmp_path / "runs")
    assert not (tmp_path / "runs" / "tuning.json").exists()
    with pytest.raises(Exception, match="chooses its runs as it goes"):
        run_sweep(load_grid(grid), dry_run=True)


@pytest.mark.parametrize("body, message", [
    ("grid:\n  train.lr: [0.1, 0.10]\n",
     "grid: train.lr repeats the value 0.1 (values are compared as numbers: 0.1 and 0.10, or 1 and 1.0, are one) — "
     "give each value once"),
    ("grid:\n  train.lr: [1, 1.0]\n", "grid: train.lr repeats the value 1 (as 1.0) (values are compared as numbers"),
    ("grid:\n  sched:\n    - {train.lr: 0.1, train.warmup_steps: 10}\n    - {train.lr: 0.10, train.warmup_steps: 10}\n",
     "grid: sched repeats the value"),
    ("grid:\n  model.n_kv_head: [null, null]\n", "grid: model.n_kv_head repeats the value null — give each value once"),
    ('out: ""\n', "out: is empty ('') — give the runs folder (relative to the grid file), or leave out: out for runs/ "
                  "in the working directory"),
    ('out: "  "\n', "out: is empty ('  ')"),
    ("seeds: 100000\n", "seeds: must be at most 1,000, got 100,000 (each seed trains every grid point once more) — "
                        "lower it"),
    (f"seeds: {list(range(1001))}\n", "seeds: lists 1,001 seeds, more than 1,000"),
])
def test_a_grid_that_would_train_a_run_twice_write_to_runs_or_queue_100000_seeds_is_refused(tmp_path, monkeypatch,
                                                                                            body, message):
    """One line, exit 2, nothing trained or written: [0.1, 0.10] was one run trained twice under two
    names; out: "" became runs/; seeds: 100000 was accepted (compare --config caps --seeds at 1,000)."""
    from typer.testing import CliRunner

    from tiedlm.cli import app

    monkeypatch.chdir(tmp_path)
    grid = write_grid(tmp_path, "config: ../configs/base.yaml\nset: [train.max_steps=1]\n" + body)
    r = CliRunner().invoke(app, ["sweep", str(grid), "--dry-run"])
    assert r.exit_code == 2, r.output
    assert r.stderr.strip().splitlines() == [r.stderr.strip()] and message in r.stderr
    assert "Traceback" not in r.output and r.stdout == ""
    assert not (tmp_path / "runs").exists()


def test_two_values_that_make_one_config_are_refused_naming_both_points(tmp_path):
    """n_kv_head equal to n_head is multi-head attention, the config's one form of n_kv_head unset."""
    grid = load_grid(write_grid(tmp_path, "config: ../configs/base.yaml\nset: [model.arch=llama, model.bias=false]\n"
                                          "grid:\n  model.n_kv_head: [null, 1, 2]\n"))
    with raises_exactly(ConfigError, match=r"grid points model.n_kv_head=null and model.n_kv_head=2 give one config — "
                                           r"the same run would train twice under two names; give each value once"):
        sweep_commands(grid)


def test_the_sweep_s_seed_cap_is_compare_s():
    from tiedlm.experiment import request, sweep

    assert sweep.SEEDS_LIMIT == request.SEEDS_LIMIT == 1000
