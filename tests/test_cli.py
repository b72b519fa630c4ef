"""The command line, through typer's CliRunner and one real subprocess."""

import json
import subprocess
import sys

import pytest
import yaml
from typer.testing import CliRunner

from tiedlm import __version__
from tiedlm.cli import app
from .conftest import comparison_dir

runner = CliRunner()


def invoke(*args):
    return runner.invoke(app, [str(a) for a in args])


def assert_one_line_error(r, message, code=2):
    """The error design: one `tiedlm: error:` line on stderr naming the problem, no traceback."""
    lines = r.stderr.strip().splitlines()
    assert r.exit_code == code, r.output
    assert len(lines) == 1 and lines[0].startswith("tiedlm: error:") and message in lines[0], r.stderr
    assert "Traceback" not in r.output and isinstance(r.exception, SystemExit)  # not a crash


def test_version():
    r = invoke("--version")
    assert r.exit_code == 0 and r.output.strip() == f"tiedlm {__version__}"


def test_train_writes_the_run_folder_and_eval_reproduces_it(tiny_yaml, tmp_path):
    r = invoke("train", "--config", tiny_yaml, "--out", tmp_path, "--quiet", "--seed", "3")
    assert r.exit_code == 0, r.output
    run = tmp_path / "tiny-s3"
    assert r.stdout.strip() == str(run / "report.md")
    report = json.loads((run / "report.json").read_text())
    assert report["seed"] == 3 and report["status"] == "finished"
    r = invoke("eval", run, "--json")
    assert r.exit_code == 0, r.output
    again = json.loads(r.stdout)
    for split in ("validation", "test"):
        assert again[split]["loss"] == pytest.approx(report["final"][split]["loss"], rel=1e-9)
    # a second identical command has nothing to do
    r = invoke("train", "--config", tiny_yaml, "--out", tmp_path, "--quiet", "--seed", "3")
    assert r.exit_code == 0 and "nothing to do" in r.output


def test_print_config_round_trips(tiny_yaml):
    r = invoke("train", "--config", tiny_yaml, "--set", "model.n_embd=32", "--print-config")
    assert r.exit_code == 0
    data = yaml.safe_load(r.stdout)
    assert data["model"]["n_embd"] == 32 and data["name"] == "tiny"


@pytest.mark.parametrize("args, message", [
    (["--set", "model.n_emb=3"], "unknown key model.n_emb — did you mean model.n_embd?"),
    (["--set", "model.n_embd=big"], "model.n_embd must be an integer"),
    (["--set", "train.lr=-1"], "train.lr must be positive"),
    (["--set", "model.n_head=3"], "divisible"),
])
def test_config_errors_exit_2_with_one_line(tiny_yaml, tmp_path, args, message):
    r = invoke("train", "--config", tiny_yaml, "--out", tmp_path / "runs", *args)
    assert r.exit_code == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0] and lines[0].startswith("tiedlm: error:")
    assert "Traceback" not in r.output
    assert not (tmp_path / "runs").exists()


def test_missing_config_file(tmp_path):
    r = invoke("train", "--config", tmp_path / "nope.yaml")
    assert r.exit_code == 2 and "does not exist" in r.stderr


def test_params_side_by_side(tiny_yaml):
    r = invoke("params", "--config", tiny_yaml, "--vocab-size", 100, "--json")
    assert r.exit_code == 0
    out = json.loads(r.stdout)
    assert out["untied"]["total"] - out["tied"]["total"] == 100 * 16
    r = invoke("params", "--config", tiny_yaml, "--vocab-size", 100)
    assert "saved by tying" in r.stdout and "tying saves 1,600 parameters" in r.stdout


def test_eval_of_a_missing_run(tmp_path):
    r = invoke("eval", tmp_path / "nothing")
    assert r.exit_code == 2 and "does not exist" in r.stderr  # the user named a path that is not a run


def test_real_subprocess_train(tiny_yaml, tmp_path):
    proc = subprocess.run([sys.executable, "-m", "tiedlm", "train", "--config", str(tiny_yaml), "--out",
                           str(tmp_path), "--name", "sub"], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    run = tmp_path / "sub"
    assert {"config.yaml", "metrics.jsonl", "report.json", "report.md", "tokenizer", "checkpoints"} <= {
        p.name for p in run.iterdir()}
    assert json.loads((run / "report.json").read_text())["status"] == "finished"
    bad = subprocess.run([sys.executable, "-m", "tiedlm", "train", "--config", str(tiny_yaml), "--set",
                          "model.n_emb=1"], capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "Traceback" not in bad.stderr


def test_eval_option_values_are_one_line_errors(tiny_yaml, tmp_path):
    """Bad --stride, --split and --device on a real run: exit 2, one line, before the model is loaded
    (--device bogus used to reach torch.device and end in a traceback)."""
    assert invoke("train", "--config", tiny_yaml, "--out", tmp_path, "--quiet").exit_code == 0
    run = tmp_path / "tiny-s0"
    for args, message in ((["--stride", 0], "--stride must be positive, got 0"),
                          (["--stride", -1], "--stride must be positive, got -1"),
                          (["--stride", 17], "--stride must be between 1 and the run's block_size (16)"),
                          (["--device", "bogus"], "--device must be auto, cpu, cuda, cuda:N or mps, got 'bogus'"),
                          (["--device", "cuda:x"], "--device must be auto"),
                          (["--split", "dev"], "--split: 'dev' must be train, validation or test")):
        r = invoke("eval", run, *args)
        assert_one_line_error(r, message)


def test_unwritable_out_is_one_line(tiny_yaml, tmp_path):
    blocker = tmp_path / "afile"
    blocker.write_text("x")
    r = invoke("train", "--config", tiny_yaml, "--out", blocker / "runs", "--quiet")
    assert r.exit_code == 1
    assert "Traceback" not in r.output and len(r.stderr.strip().splitlines()) == 1
    assert "check the path" in r.stderr


def test_compare_and_sweep_through_the_cli(tiny_yaml, tmp_path):
    """compare --config, compare of folders, sweep --dry-run and a real sweep, end to end."""
    import shlex

    out = tmp_path / "runs"
    r = invoke("compare", "--config", tiny_yaml, "--seeds", 2, "--out", out, "--quiet")
    assert r.exit_code == 0, r.output
    assert "tied" in r.stdout and "untied" in r.stdout
    data = json.loads((comparison_dir(out) / "comparison.json").read_text())
    contrast = next(v for v in data["variants"] if v["label"] == "tied")["vs_baseline"]["validation"]
    assert contrast["test"] == "paired" and contrast["n"] == 2
    # the tiny runs may not beat their unigram model: then the guard says so and no verdict is drawn
    at_chance = any("nothing can be concluded about tying" in w for w in data["warnings"])
    assert ("no verdict" in r.stdout) is at_chance and ("paired over 2 seeds" in r.stdout) is not at_chance
    # comparing the folders again gives the same numbers, without training
    again = invoke("compare", str(out / "tiny-*"), "--out", out)
    assert again.exit_code == 0 and again.stdout.splitlines()[:4] == r.stdout.splitlines()[:4]
    # a broken run is left out with its reason, not a crash
    (out / "broken-s0").mkdir()
    (out / "broken-s0" / "report.json").write_text("{not json")
    r = invoke("compare", "--out", out)
    assert r.exit_code == 0 and "broken-s0" in r.output
    # --set without --config is a usage error
    r = invoke("compare", "--set", "model.n_embd=8", "--out", out)
    assert r.exit_code == 2 and "--set only applies with --config" in r.stderr

    grid = tmp_path / "grid.yaml"
    grid.write_text(f"config: {tiny_yaml.name}\nset: [train.max_steps=4]\n"
                    "grid: {model.tie_embeddings: [true, false]}\nseeds: 1\nout: sweep-runs\n")
    r = invoke("sweep", grid, "--dry-run")
    assert r.exit_code == 0
    commands = [shlex.split(line) for line in r.stdout.strip().splitlines()]
    assert len(commands) == 2 and all(c[:2] == ["tiedlm", "train"] for c in commands)
    r = invoke("sweep", grid, "--quiet")
    assert r.exit_code == 0, r.output
    assert "2 trained" in r.stdout
    finished = [p for p in (tmp_path / "sweep-runs").iterdir() if (p / "report.json").exists()]
    assert len(finished) == 2
    r = invoke("sweep", grid, "--quiet")  # again: nothing left to do
    assert r.exit_code == 0 and "0 trained, 2 already finished" in r.stdout


def test_ctrl_c_and_data_errors_while_preparing_write_nothing(tiny_yaml, tmp_path, monkeypatch):
    import tiedlm.data

    def interrupted(cfg, progress=True):
        raise KeyboardInterrupt

    monkeypatch.setattr(tiedlm.data, "prepare_data", interrupted)
    r = invoke("train", "--config", tiny_yaml, "--out", tmp_path / "runs", "--quiet")
    assert r.exit_code == 130 and r.stderr.strip() == "tiedlm: error: interrupted"
    assert not (tmp_path / "runs" / "tiny-s0").exists()
    monkeypatch.undo()
    r = invoke("train", "--config", tiny_yaml, "--out", tmp_path / "runs", "--quiet",
               "--set", "data.path=./no/such/folder")
    assert r.exit_code == 2 and "does not exist" in r.stderr and len(r.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "runs" / "tiny-s0").exists()


# ------------------------------------------------------------------ hardening of options and files


@pytest.fixture
def no_training(monkeypatch):
    """Make a run that slips past validation fail at once instead of training."""
    import tiedlm.train

    def refuse(*args, **kwargs):
        raise AssertionError("train_run was reached: the value should have been refused before")

    monkeypatch.setattr(tiedlm.train, "train_run", refuse)


def test_duplicate_keys_in_a_config_file_are_refused(tmp_path, no_training):
    """Two `train:` blocks used to train with the second one only."""
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text("name: dup\nmodel:\n  n_layer: 2\ntrain:\n  max_steps: 5\n  lr: 0.01\n"
                   "eval:\n  batch_size: 4\ntrain:\n  max_steps: 7\n")
    r = invoke("train", "--config", cfg, "--out", tmp_path / "runs")
    assert_one_line_error(r, "cfg.yaml: duplicate key 'train' (lines 4 and 9) — keep one of them")
    assert not (tmp_path / "runs").exists()


def test_duplicate_nested_keys_in_a_base_file_are_refused(tmp_path, no_training):
    (tmp_path / "base.yaml").write_text("model:\n  n_embd: 64\n  n_head: 2\n  n_embd: 32\n")
    (tmp_path / "top.yaml").write_text("base: base.yaml\ntrain:\n  max_steps: 3\n")
    r = invoke("params", "--config", tmp_path / "top.yaml")
    assert_one_line_error(r, "base.yaml: duplicate key 'n_embd' (lines 2 and 4)")


def test_yaml_merge_keys_are_not_duplicates(tmp_path):
    cfg = tmp_path / "merge.yaml"
    cfg.write_text("common: &m {n_layer: 2, n_head: 2, n_embd: 32}\n"
                   "model:\n  <<: *m\n  n_layer: 3\ntrain: {max_steps: 2}\n")
    from tiedlm.config.yamlsafe import load_yaml

    data = load_yaml(cfg.read_text(), "merge.yaml")
    assert data["model"] == {"n_layer": 3, "n_head": 2, "n_embd": 32}


@pytest.mark.parametrize("args, message", [
    (["train", "--seed", "-1"], "--seed must not be negative, got -1"),
    (["train", "--seed", str(2**64)], "--seed must be below 2**64"),
    (["train", "--seed", "abc"], "Invalid value for '--seed'"),  # click's own check, one line too
    (["train", "--name", "-rf"], "--name '-rf' starts with '-'"),
    (["train", "--name", " lead"], "--name ' lead' holds ' '"),
    (["train", "--name", "two\nlines"], "holds '\\n'"),
    (["train", "--name", ".hidden"], "starts with '.'"),
    (["train", "--name", ".."], "starts with '.'"),
    (["train", "--name", "a/b"], "holds '/'"),
    (["train", "--name", ""], "--name '' is empty"),
    (["train", "--name", "x" * 300], "is 300 characters long"),
    (["train", "--set", "name=a b"], "name 'a b' holds ' '"),
    (["train", "--set", "name=-x"], "name '-x' starts with '-'"),
    (["params", "--vocab-size", "0"], "--vocab-size must be positive, got 0"),
    (["params", "--vocab-size", "-5"], "--vocab-size must be positive, got -5"),
    (["params", "--vocab-size", "100", "--data"], "--vocab-size and --data contradict each other"),
    (["compare", "--seeds", "0"], "--seeds must be positive, got 0"),
    (["compare", "--seeds", "-2"], "--seeds must be positive"),
    (["compare", "--seeds", "1001"], "--seeds must be at most 1,000, got 1,001"),
    (["compare", "--match", "flops"], "--match 'flops' is not known"),
])
def test_bad_option_values_are_one_line_errors_and_create_nothing(tiny_yaml, tmp_path, monkeypatch, no_training,
                                                                     args, message):
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)  # the default --out is ./runs: nothing may appear here
    r = invoke(*args[:1], "--config", tiny_yaml, *args[1:])
    assert_one_line_error(r, message)
    assert not list(work.iterdir())


@pytest.mark.parametrize("args, message", [
    (["compare", "--seeds", "3"], "--seeds only applies with --config"),  # was silently ignored
    (["compare", "--match", "params", "--overwrite"], "--match, --overwrite only apply with --config"),
    (["eval", "somewhere", "--device", "gpu"], "--device must be auto, cpu, cuda, cuda:N or mps, got 'gpu'"),
    (["eval", "somewhere", "--split", "dev"], "--split: 'dev' must be train, validation or test"),
    (["eval", "somewhere", "--stride", "0"], "--stride must be positive, got 0"),
    (["trian"], "No such command 'trian'"),
    (["train"], "Missing option '--config'"),
])
def test_usage_errors_without_a_config_are_one_line(tmp_path, monkeypatch, args, message):
    monkeypatch.chdir(tmp_path)
    assert_one_line_error(invoke(*args), message)
    assert not list(tmp_path.iterdir())


def test_option_errors_come_before_heavy_imports(tmp_path):
    """A bad option is refused before torch is imported (instantly), in a real process."""
    code = ("import sys\nfrom tiedlm.cli import app\n"
            "try:\n    app(sys.argv[1:], prog_name='tiedlm')\n"
            "except SystemExit as e:\n    print(e.code, 'torch' in sys.modules)\n")
    for args in (["eval", str(tmp_path), "--device", "bogus"], ["compare", "--seeds", "0", "--config", "x.yaml"],
                 ["train", "--config", "x.yaml", "--name", "-x"]):
        proc = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=60,
                              cwd=tmp_path)
        assert proc.stdout.split() == ["2", "False"], (args, proc.stdout, proc.stderr)
        assert proc.stderr.count("\n") == 1 and proc.stderr.startswith("tiedlm: error:")


def test_names_tiedlm_builds_follow_the_run_name_rule(tiny_yaml):
    """compare and sweep put '=' and '+' into folder names: the rule for --name allows them, so a
    folder tiedlm made can always be named again with --name (and checked by the same rule)."""
    from tiedlm.config.checks import check_run_name
    from tiedlm.config.naming import override_tag as _override_tag

    for tag in (_override_tag(["model.n_embd=256", "train.lr=2e-3"]), _override_tag(["eval.buckets=[0.2, 0.6]"]),
                _override_tag(["train.lr=1e+3"])):
        check_run_name(f"base{tag}-untied-s0")
    r = invoke("train", "--config", tiny_yaml, "--name", "base-n_embd=256,lr=0.002-tied-s0", "--print-config")
    assert_one_line_error(r, "holds ','")
    r = invoke("train", "--config", tiny_yaml, "--name", "base-n_embd=256_lr=1e+3-tied-s0", "--print-config")
    assert r.exit_code == 0, r.output


@pytest.mark.parametrize("args, code", [
    (["train", "--set", "model.n_head=3"], 2),  # a ConfigError
    (["eval", "{tmp}/nothing"], 2),  # a path that is not a run
    (["train", "--out", "{tmp}/afile/runs", "--quiet"], 1),  # a runs folder under a file: an OSError
])
def test_debug_shows_the_traceback_and_keeps_the_exit_code(tiny_yaml, tmp_path, args, code):
    """--debug made every exit code 1 (the exception left the command uncaught)."""
    (tmp_path / "afile").write_text("x")
    args = [a.format(tmp=tmp_path) for a in args]
    if args[0] == "train":
        args[1:1] = ["--config", str(tiny_yaml)]
    plain = subprocess.run([sys.executable, "-m", "tiedlm", *args], capture_output=True, text=True, timeout=120)
    debug = subprocess.run([sys.executable, "-m", "tiedlm", "--debug", *args], capture_output=True, text=True,
                           timeout=120)
    assert plain.returncode == code and "Traceback" not in plain.stderr, plain.stderr
    assert debug.returncode == code, debug.stderr
    assert "Traceback (most recent call last)" in debug.stderr and "tiedlm: error:" not in debug.stderr


@pytest.mark.parametrize("inside", [False, True])
@pytest.mark.parametrize("command", ["list", "clear"])
def test_a_token_cache_that_is_a_file_is_refused_in_one_line(tmp_path, monkeypatch, command, inside):
    """TIEDLM_CACHE at a file (or under one) listed "(empty)" and cleared "0 items"; the file is kept."""
    blocker = tmp_path / "afile"
    blocker.write_text("keep")
    root = blocker / "cache" if inside else blocker
    monkeypatch.setenv("TIEDLM_CACHE", str(root))
    r = invoke("cache", command)
    assert_one_line_error(r, f"the token cache {root} is not a folder (it, or a folder above it, is a file) — point "
                             "TIEDLM_CACHE at a folder (made if missing), or unset it for ~/.cache/tiedlm")
    assert r.stdout == "" and blocker.read_text() == "keep"


def test_a_missing_token_cache_is_an_empty_one(tmp_path, monkeypatch):
    monkeypatch.setenv("TIEDLM_CACHE", str(tmp_path / "not-yet"))
    r = invoke("cache", "list")
    assert r.exit_code == 0 and "(empty)" in r.stdout
    assert invoke("cache", "clear").exit_code == 0


def test_help_lists_compare_first_as_training_both_and_shows_flags_as_flags():
    from typer.testing import CliRunner

    from tiedlm.cli import app

    out = CliRunner().invoke(app, ["--help"], terminal_width=200).stdout
    commands = out.split("Commands", 1)[1]
    names = [line.strip("│ ").split()[0] for line in commands.splitlines()
             if line.startswith("│ ") and line.strip("│ ") and not line.startswith("│  ")]
    assert names[0] == "compare" and "train" in names[1:]
    assert "Train a config tied and untied and compare them" in commands
    assert "--debug  " in out and "--debug <bool>" not in out.replace("  ", " ").replace("  ", " ")
    commands = [[c.name or c.callback.__name__] for c in app.registered_commands] + [["cache", "list"], ["cache"]]
    assert len(commands) >= 10
    for command in commands:  # no flag shown as taking a value, --help included, in any command's help
        text = CliRunner().invoke(app, [*command, "--help"], terminal_width=200).stdout
        assert "--help " in text, command
        flags = [line for line in text.splitlines() if "<bool>" in line]
        assert flags == [], (command, flags)
    text = CliRunner().invoke(app, ["train", "--help"], terminal_width=200).stdout
    assert "(train.log_to: [tensorboard])" in " ".join(text.replace("│", " ").split())  # no markup eaten
    text = CliRunner().invoke(app, ["compare", "--help"], terminal_width=200).stdout
    assert text.count("tiedlm compare ") >= 2  # two examples
