"""Hostile input that used to cost more than it should: shell code smuggled into an emitted Slurm
script, a gradient-accumulation count that grows memory without bound (and a signal that could not
stop it), and YAML that expands exponentially through anchors and aliases. Each is refused with
exit 2 and one line before anything is written, or, for the signal, stops the run at once with an
exact resume."""

import gc
import json
import os
import shlex
import signal
import subprocess
import time
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from tiedlm.runs import checkpoints
from tiedlm import runs
from tiedlm.cli import app
from tiedlm.config import apply_overrides
from tiedlm.errors import ConfigError, Interrupted

from .conftest import TINY
from .test_train import metric_rows, weights

runner = CliRunner()


def refused(r, *words: str) -> str:
    """The result is one `tiedlm: error:` line with exit 2, no traceback; returns the line."""
    lines = r.stderr.strip().splitlines()
    assert r.exit_code == 2, f"exit {r.exit_code}: {r.output} {r.exception!r}"
    assert len(lines) == 1 and lines[0].startswith("tiedlm: error:"), r.stderr
    assert "Traceback" not in r.output
    for word in words:
        assert word in lines[0], lines[0]
    return lines[0]


def files_under(folder: Path) -> set[str]:
    return {p.relative_to(folder).as_posix() for p in folder.rglob("*")}


# ------------------------------------------------------------------ 1. --emit slurm: no injection

SWEEP_SET = ["train.max_steps=3", "train.eval_every=0", "model.n_layer=1", "model.n_embd=16", "model.block_size=16",
             "train.batch_size=4", "data.synthetic.train_tokens=4000", "data.synthetic.validation_tokens=500",
             "data.synthetic.test_tokens=500", "train.device=cpu", "train.threads=1"]


def write_grid(tmp_path: Path, **extra) -> Path:
    (tmp_path / "base.yaml").write_text(yaml.safe_dump(apply_overrides({}, TINY)))
    data = {"config": "base.yaml", "set": SWEEP_SET, "grid": {"model.tie_embeddings": [True, False]},
            "seeds": [0], "out": "runs", **extra}
    path = tmp_path / "grid.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


# Shell code and malformed values: none may reach the script.
SHELL = ["gpu\ntouch PWNED", "gpu;touch PWNED", "$(touch PWNED)", "`touch PWNED`", "gpu'x", 'gpu"x', "gpu x",
         "gpu\\", "gpu\r", "#x", ""]
HOSTILE = {
    "partition": SHELL + ["gpu,", ",gpu", "gpu,,cpu", "gp/u"],
    "account": SHELL + ["a,b", "a/b"],
    "time": SHELL + ["-1", "abc", "1:2:3:4", "02:75:00", "1-25", "1-2:3:4:5", "1h", "1.5", "UNLIMITEDx",
                     "1" + "0" * 30, "4294967294", "2982616-16:00", "9" * 5000],  # past Slurm's 32-bit minutes
    "gpus_per_task": SHELL + ["-1", "a", "0", "1.5", "a100:0", "a100:", ":2", "a100:2:3", "01", "1" + "0" * 30,
                              "a100:65535"],
    "cpus_per_task": SHELL + ["-1", "a", "0", "1.5", "01", "65535"],
    "mem": SHELL + ["-1", "abc", "12X", "1.5G", "G", "9" * 30 + "T"],
}
CLI_OPTIONS = {"partition": "--partition", "time": "--time", "gpus_per_task": "--gpus-per-task"}


@pytest.mark.parametrize("key, value", [(k, v) for k in CLI_OPTIONS for v in HOSTILE[k]], ids=repr)
def test_a_hostile_command_line_slurm_option_is_refused(key, value, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    grid = write_grid(tmp_path)
    before = files_under(tmp_path)
    r = runner.invoke(app, ["sweep", str(grid), "--emit", "slurm", CLI_OPTIONS[key], value])
    refused(r, f"{CLI_OPTIONS[key]} must be", "— give a")
    assert r.stdout == ""  # no script
    assert files_under(tmp_path) == before


@pytest.mark.parametrize("key, value", [(k, v) for k in HOSTILE for v in HOSTILE[k]], ids=repr)
def test_a_hostile_grid_file_slurm_value_is_refused(key, value, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    grid = write_grid(tmp_path, slurm={key: value})
    before = files_under(tmp_path)
    r = runner.invoke(app, ["sweep", str(grid), "--emit", "slurm"])
    refused(r, f"grid.yaml: slurm: {key} must be")
    assert r.stdout == ""
    assert files_under(tmp_path) == before


@pytest.mark.parametrize("value", [True, 1.5, -2, [1], {"a": 1}], ids=repr)
def test_a_grid_file_slurm_value_of_the_wrong_yaml_type_is_refused(value, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    grid = write_grid(tmp_path, slurm={"cpus_per_task": value})
    refused(runner.invoke(app, ["sweep", str(grid), "--emit", "slurm"]), "slurm: cpus_per_task")


def test_an_empty_slurm_option_without_emit_slurm_is_refused(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    grid = write_grid(tmp_path)
    refused(runner.invoke(app, ["sweep", str(grid), "--partition", ""]), "--partition only applies with --emit slurm")


@pytest.mark.parametrize("key, value", [
    ("time", "30"), ("time", "0"), ("time", "30:00"), ("time", "02:00:00"), ("time", "100:00:00"), ("time", "1-0"),
    ("time", "1-12:30"), ("time", "2-00:00:00"), ("time", "UNLIMITED"), ("time", "infinite"),
    ("partition", "gpu"), ("partition", "gpu,debug"), ("partition", "a100-80gb.long_q"),
    ("account", "proj_42"), ("gpus_per_task", "1"), ("gpus_per_task", "a100:2"), ("gpus_per_task", 8),
    ("cpus_per_task", 16), ("mem", "32G"), ("mem", "4000"), ("mem", "0"), ("mem", "1t"),
    ("time", "4294967293"), ("gpus_per_task", "65534"), ("cpus_per_task", "65534"),  # Slurm's largest
])
def test_slurm_values_of_slurms_grammar_are_taken(key, value):
    from tiedlm.experiment.sweep import check_slurm_option

    assert check_slurm_option(key, value, key) == str(value)


@pytest.mark.parametrize("key, value", [
    ("mem", "16GB"), ("mem", "512mb"), ("mem", "1Tb"), ("mem", "4KB"),  # sbatch takes a B after the unit
    ("gpus_per_task", "a100:1,v100:1"), ("gpus_per_task", "1,a100:2"),  # a comma-separated list of [type:]count
])
def test_slurm_values_that_were_wrongly_refused_are_taken(key, value, tmp_path, monkeypatch):
    from tiedlm.experiment.sweep import check_slurm_option

    assert check_slurm_option(key, value, key) == value
    monkeypatch.chdir(tmp_path)
    r = runner.invoke(app, ["sweep", str(write_grid(tmp_path, slurm={key: value})), "--emit", "slurm"])
    assert r.exit_code == 0, r.output
    assert f"#SBATCH --{key.replace('_', '-')}={value}" in r.stdout.splitlines()


@pytest.mark.parametrize("key, value", [("mem", "16GBB"), ("mem", "16B"), ("mem", "9" * 30 + "TB"),
                                        ("gpus_per_task", "a100:1,"), ("gpus_per_task", "a100:1,,v100:1"),
                                        ("gpus_per_task", "a100:1,v100:65535")])
def test_slurm_values_just_past_the_grammar_are_still_refused(key, value):
    from tiedlm.experiment.sweep import check_slurm_option

    with pytest.raises(ConfigError, match=f"^{key} must be"):
        check_slurm_option(key, value, key)


def test_a_slurm_value_is_checked_only_when_a_script_is_emitted(tmp_path, monkeypatch):
    """A grid's slurm: block is for --emit slurm: a value Slurm's grammar refuses keeps the grid from
    emitting a script, but not from being listed or run; a newline or a non-scalar is refused always."""
    monkeypatch.chdir(tmp_path)
    grid = write_grid(tmp_path, slurm={"mem": "lots", "partition": "gpu;x"})
    for args in (["--dry-run"], ["--emit", "shell"]):
        r = runner.invoke(app, ["sweep", str(grid), *args])
        assert r.exit_code == 0, r.output
        assert r.stdout.count("tiedlm train") == 2
    refused(runner.invoke(app, ["sweep", str(grid), "--emit", "slurm"]), "grid.yaml: slurm: mem must be")
    for bad, words in (({"partition": "gpu\ntouch PWNED"}, "slurm: partition must be one line"),
                       ({"mem": [1]}, "slurm: mem must be one value"),
                       ({"time": 120}, "time must be quoted")):
        grid = write_grid(tmp_path, slurm=bad)
        for args in (["--dry-run"], ["--emit", "slurm"]):
            refused(runner.invoke(app, ["sweep", str(grid), *args]), words)
    assert not (tmp_path / "runs").exists() and not list(tmp_path.glob("PWNED*"))


def test_a_valid_slurm_script_holds_exactly_the_expected_lines_and_parses(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    grid = write_grid(tmp_path, slurm={"partition": "debug", "time": "UNLIMITED", "account": "proj_42",
                                       "cpus_per_task": 8, "mem": "32G", "gpus_per_task": 1})
    r = runner.invoke(app, ["sweep", str(grid), "--emit", "slurm", "--partition", "gpu,debug",
                            "--time", "1-12:30:00", "--gpus-per-task", "a100:2"])
    assert r.exit_code == 0, r.output
    script = tmp_path / "job.sh"
    script.write_text(r.stdout)
    assert subprocess.run(["bash", "-n", str(script)], capture_output=True).returncode == 0

    def command(tie: str) -> str:
        sets = [a for s in SWEEP_SET + [f"model.tie_embeddings={tie}"] for a in ("--set", s)]
        return shlex.join(["tiedlm", "train", "--config", "base.yaml", *sets, "--seed", "0",
                           "--name", f"tiny-tie_embeddings={tie}-s0", "--out", "runs"])

    expected = [
        "#!/bin/bash",
        "#SBATCH --job-name=tiny",
        "#SBATCH --array=0-1",
        "#SBATCH --output=%x-%A_%a.out",
        "#SBATCH --partition=gpu,debug",  # the command line wins over the grid file
        "#SBATCH --time=1-12:30:00",
        "#SBATCH --account=proj_42",
        "#SBATCH --cpus-per-task=8",
        "#SBATCH --mem=32G",
        "#SBATCH --gpus-per-task=a100:2",
        '# 2 runs of "grid.yaml", one per array task. Submit with: sbatch THIS_FILE',
        "# Re-submitting is safe: finished runs are skipped, interrupted ones resume from their last checkpoint.",
        "set -euo pipefail",
        f"cd {shlex.quote(str(tmp_path))}",
        'case "${SLURM_ARRAY_TASK_ID:?not in a job array}" in',
        f"  0) {command('true')} ;;",
        f"  1) {command('false')} ;;",
        '  *) echo "no run for array task $SLURM_ARRAY_TASK_ID" >&2; exit 2 ;;',
        "esac",
    ]
    assert sorted(r.stdout.splitlines()) == sorted(expected)
    assert len(r.stdout.splitlines()) == len(expected)


def run_task(script: Path, task: int, cwd: Path) -> list[str]:
    """The arguments the script's case line for `task` passes to tiedlm, with tiedlm a stub."""
    stub = 'tiedlm() { printf "%s\\0" "$@"; }; source "$0"'
    env = {"PATH": os.environ["PATH"], "SLURM_ARRAY_TASK_ID": str(task)}
    done = subprocess.run(["bash", "-c", stub, str(script)], cwd=cwd, env=env, capture_output=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout.decode().split("\0")[:-1]


def test_shell_metacharacters_in_grid_values_and_names_stay_quoted(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    values = ["$(touch PWNED1)", "`touch PWNED2`; touch PWNED3", "x' ; touch PWNED4 ; '", "a\ntouch PWNED5",
              'x" && touch PWNED6 && "', "$HOME *"]
    grid = write_grid(tmp_path, name="n", grid={"data.path": values},  # a name such as n$(…) is refused
                      set=SWEEP_SET + ["data.name=$(touch PWNED8)"])
    r = runner.invoke(app, ["sweep", str(grid), "--emit", "slurm"])
    assert r.exit_code == 0, r.output
    script = tmp_path / "job.sh"
    script.write_text(r.stdout)
    assert subprocess.run(["bash", "-n", str(script)], capture_output=True).returncode == 0
    header = r.stdout.split("set -euo pipefail")[0]
    assert all(ln.startswith("#") for ln in header.splitlines())  # nothing bash runs before `set`
    for task, value in enumerate(values):
        args = run_task(script, task, tmp_path)
        assert args[:2] == ["train", "--config"]
        sets = [args[i + 1] for i, a in enumerate(args) if a == "--set"]
        assert yaml.safe_load(sets[-1].split("=", 1)[1]) == value  # the value itself, as tiedlm will read it
        assert "data.name=$(touch PWNED8)" in sets
        name = args[args.index("--name") + 1]
        assert name.startswith("n-path=") and "$" not in name and "`" not in name
    assert not list(tmp_path.glob("PWNED*"))


def test_a_hostile_grid_path_cannot_break_out_of_its_comment(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    write_grid(tmp_path)
    evil = tmp_path / "g\ntouch PWNED\n.yaml"
    evil.write_text((tmp_path / "grid.yaml").read_text())
    r = runner.invoke(app, ["sweep", str(evil), "--emit", "slurm"])
    assert r.exit_code == 0, r.output
    script = tmp_path / "job.sh"
    script.write_text(r.stdout)
    assert "touch PWNED" not in r.stdout.splitlines()
    assert len(run_task(script, 0, tmp_path)) > 5
    assert not (tmp_path / "PWNED").exists()


# ------------------------------------------------------------------ 2. gradient accumulation


def tiny_yaml_file(tmp_path: Path) -> Path:
    path = tmp_path / "tiny.yaml"
    path.write_text(yaml.safe_dump(apply_overrides({}, TINY)))
    return path


def test_a_huge_number_of_tokens_per_step_is_refused_before_anything_is_created(tmp_path):
    config = tiny_yaml_file(tmp_path)
    out = tmp_path / "runs"
    r = runner.invoke(app, ["train", "--config", str(config), "--set", "train.grad_accum=100000000",
                            "--set", "train.max_steps=1", "--out", str(out), "--quiet"])
    refused(r, "tokens per optimizer step", "134,217,728", "4 x 100,000,000 x 16 = 6,400,000,000",
            "lower train.grad_accum")
    assert not out.exists()
    refused(runner.invoke(app, ["params", "--config", str(config), "--set", "train.grad_accum=100000000"]),
            "tokens per optimizer step")


def test_the_tokens_per_step_limit_is_the_product(tiny):
    from tiedlm.config.checks import TOKENS_PER_STEP_LIMIT

    at_limit = TOKENS_PER_STEP_LIMIT // (4 * 16)  # TINY: batch_size 4, block_size 16
    assert tiny(f"train.grad_accum={at_limit}").train.grad_accum == at_limit
    for extra in ([f"train.grad_accum={at_limit + 1}"], [f"train.grad_accum={at_limit}", "train.batch_size=5"],
                  [f"train.grad_accum={at_limit}", "model.block_size=17"]):
        with pytest.raises(ConfigError, match="tokens per optimizer step"):
            tiny(*extra)


def test_the_step_sums_the_loss_without_keeping_a_tensor_per_micro_batch(tiny):
    import torch

    from tiedlm.model.blocks import GPT
    from tiedlm.train.step import build_optimizer
    from tiedlm.train.step import train_step

    torch.manual_seed(0)
    cfg = tiny("train.grad_accum=6")  # each look walks every object alive (gc.get_objects): few of them
    model = GPT(cfg.model, 60)
    optimizer = build_optimizer(model, cfg.train)
    x = torch.randint(0, 60, (4, 16))
    live = []

    def next_batch():
        gc.collect()
        live.append(sum(1 for o in gc.get_objects() if issubclass(type(o), torch.Tensor)))
        return x, x

    loss, norm = train_step(model, optimizer, list(model.parameters()), next_batch, None, cfg.train, 1e-3)
    assert type(loss) is float and type(norm) is float and loss > 0
    assert len(live) == 6
    assert live[2:] == [live[2]] * 4  # the same tensors alive at every micro-batch: nothing accumulates
    # asked to stop after two micro-batches: no update, no gradients left, nothing returned
    before = {k: v.clone() for k, v in model.state_dict().items()}
    live.clear()
    assert train_step(model, optimizer, list(model.parameters()), next_batch, None, cfg.train, 1e-3,
                      stop=lambda: len(live) >= 2) is None
    assert len(live) == 2
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert all(p.grad is None for p in model.parameters())


@pytest.mark.parametrize("stop_in_step", [1, 3, 5], ids=lambda s: f"step{s}")
def test_a_signal_between_micro_batches_abandons_the_step_and_resumes_exactly(tiny, tmp_path, monkeypatch,
                                                                              stop_in_step):
    """SIGTERM during the 2nd of 50 micro-batches of a step: the step is abandoned (no update), the
    last completed step is checkpointed (step 0 before any; at 5 the step-4 checkpoint is kept),
    the run is `interrupted` with exit 143, and resuming ends with the uninterrupted run's weights
    and metrics, bit for bit (dropout on, so the RNG state matters)."""
    import torch

    import tiedlm.train
    from tiedlm.train import train_run
    from tiedlm.train.step import BatchSampler

    accum = 50
    cfg = tiny(f"train.grad_accum={accum}", "train.max_steps=6", "train.eval_every=0", "model.dropout=0.1")
    ref = train_run(cfg, out=tmp_path / "a", progress=False)

    calls = {"n": 0}
    draw = BatchSampler.__call__

    class Signalling(BatchSampler):
        def __call__(self):
            calls["n"] += 1
            if calls["n"] == (stop_in_step - 1) * accum + 2:  # the 2nd micro-batch of that step
                os.kill(os.getpid(), signal.SIGTERM)
            return draw(self)

    monkeypatch.setattr(tiedlm.train, "BatchSampler", Signalling)
    with pytest.raises(Interrupted) as info:
        train_run(cfg, out=tmp_path / "b", progress=False)
    monkeypatch.setattr(tiedlm.train, "BatchSampler", BatchSampler)
    assert info.value.exit_code == 143
    assert calls["n"] < stop_in_step * accum  # the step did not run to its end
    assert f"interrupted during step {stop_in_step} of 6" in str(info.value)
    run = tmp_path / "b" / "tiny-s0"
    report = json.loads((run / "report.json").read_text())
    assert report["status"] == "interrupted" and report["interrupted_at_step"] == stop_in_step - 1
    latest = checkpoints.latest_checkpoint(run)
    assert latest.name == f"step-{stop_in_step - 1:07d}"
    steps = [r["step"] for r in runs.read_metrics(run) if r["kind"] == "train"]
    assert steps == list(range(1, stop_in_step))

    assert train_run(cfg, out=tmp_path / "b", progress=False) == run
    assert json.loads((run / "report.json").read_text())["status"] == "finished"
    wa, wb = weights(ref), weights(run)
    assert wa.keys() == wb.keys()
    for k in wa:
        assert torch.equal(wa[k], wb[k]), k
    assert metric_rows(ref) == metric_rows(run)
    fa = json.loads((ref / "report.json").read_text())["final"]
    fb = json.loads((run / "report.json").read_text())["final"]
    assert fa == fb


# ------------------------------------------------------------------ 3. YAML that expands exponentially


def laughs(levels: int = 9) -> list[str]:
    """`a0` ten strings, each next level ten aliases of the one below: 10**levels values in a few
    hundred bytes."""
    lines = ["a0: &a0 [lol, lol, lol, lol, lol, lol, lol, lol, lol, lol]"]
    lines += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 10)}]" for i in range(1, levels)]
    return lines


def laughs_flow(levels: int = 9) -> str:
    """The same as one flow sequence, for a --set value or a grid value."""
    parts = ["&a0 [lol, lol, lol, lol, lol, lol, lol, lol, lol, lol]"]
    parts += [f"&a{i} [{', '.join([f'*a{i - 1}'] * 10)}]" for i in range(1, levels)]
    return "[" + ", ".join(parts) + "]"


EXPANDS = "the YAML expands to more than 100,000 values through anchors and aliases — write the values out"


def timed(args: list[str]):
    t0 = time.perf_counter()
    r = runner.invoke(app, args)
    return r, time.perf_counter() - t0


def test_a_billion_laughs_config_is_refused_by_train_and_params(tmp_path):
    config = tmp_path / "laughs.yaml"
    config.write_text("\n".join(laughs() + ["name: *a8"]) + "\n")
    assert config.stat().st_size < 1000
    out = tmp_path / "runs"
    r, took = timed(["train", "--config", str(config), "--out", str(out), "--quiet"])
    assert refused(r, EXPANDS).startswith(f"tiedlm: error: {config}: ")
    assert took < 5 and not out.exists()
    r, took = timed(["params", "--config", str(config)])
    refused(r, f"{config}: {EXPANDS}")
    assert took < 5


def test_a_billion_laughs_in_a_base_file_is_refused(tmp_path):
    (tmp_path / "base.yaml").write_text("\n".join(laughs() + ["data: {data_files: *a8}"]) + "\n")
    config = tmp_path / "child.yaml"
    config.write_text("base: base.yaml\nname: child\n")
    r, took = timed(["params", "--config", str(config)])
    refused(r, EXPANDS, "base.yaml")
    assert took < 5


def test_a_billion_laughs_set_value_is_refused(tmp_path):
    config = tiny_yaml_file(tmp_path)
    out = tmp_path / "runs"
    r, took = timed(["train", "--config", str(config), "--set", f"data.data_files={laughs_flow()}",
                     "--out", str(out), "--quiet"])
    refused(r, f"--set data.data_files: {EXPANDS}")
    assert took < 5 and not out.exists()


def test_a_billion_laughs_grid_file_is_refused(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    grid = write_grid(tmp_path)
    # one grid value, the whole nested list (each grid point's --set would hold it all)
    text = grid.read_text().replace("grid:\n", f"grid:\n  data.data_files: [{laughs_flow()}]\n", 1)
    grid.write_text(text)
    for args in (["--emit", "slurm"], ["--emit", "shell"], []):
        r, took = timed(["sweep", str(grid), *args])
        refused(r, f"{grid}: {EXPANDS}")
        assert took < 5
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize("bad", ["laughs", "duplicate"])
def test_a_damaged_runs_config_yaml_is_one_clean_sentence_with_one_fix(bad, tmp_path):
    """A run's own config.yaml that expands through aliases (or repeats a key) is a damaged run: the
    problem, then train's fix or a reader's, never also the fix meant for a config one writes."""
    config = tiny_yaml_file(tmp_path)
    out = tmp_path / "runs"
    run_dir = out / "tiny-s0"
    run_dir.mkdir(parents=True)
    text = "\n".join(laughs() + ["name: *a8"]) if bad == "laughs" else "name: a\nname: b"
    (run_dir / runs.CONFIG).write_text(text + "\n")
    line = refused_any(runner.invoke(app, ["train", "--config", str(config), "--out", str(out), "--quiet"]))
    problem = (f"{run_dir / runs.CONFIG}: the YAML expands to more than 100,000 values through anchors and aliases"
               if bad == "laughs" else f"{run_dir / runs.CONFIG}: duplicate key 'name' (lines 1 and 2)")
    assert line == f"tiedlm: error: {problem} (the run folder is damaged) — use --overwrite to start afresh"
    line = refused_any(runner.invoke(app, ["eval", str(run_dir)]))
    assert line == f"tiedlm: error: {problem} (the run folder is damaged) — restore it, or retrain the run"


def refused_any(r) -> str:
    """One `tiedlm: error:` line, whatever the exit code (a damaged run is exit 1); returns it."""
    lines = r.stderr.strip().splitlines()
    assert r.exit_code != 0 and len(lines) == 1 and lines[0].startswith("tiedlm: error:"), r.output
    assert "Traceback" not in r.output and lines[0].count(" — ") == 1, lines[0]
    return lines[0]


def test_a_self_referencing_yaml_is_refused_too(tmp_path):
    config = tmp_path / "loop.yaml"
    config.write_text("name: &a [*a]\n")
    refused(runner.invoke(app, ["params", "--config", str(config)]), EXPANDS)


def test_an_ordinary_config_with_aliases_still_loads(tmp_path):
    from tiedlm.config import load_config

    config = tmp_path / "aliases.yaml"
    config.write_text("name: aliased\nmodel: {n_layer: 1, n_head: 2, n_embd: 16, block_size: 16}\n"
                      "train: {batch_size: &b 4, max_steps: *b}\n")
    cfg = load_config(config)
    assert cfg.model.n_layer == 1 and cfg.train.max_steps == 4
