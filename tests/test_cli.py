"""The command line, through typer's CliRunner and one real subprocess."""

import json
import subprocess
import sys

import pytest
import yaml
from typer.testing import CliRunner

from tiedlm import __version__
from tiedlm.cli import app

runner = CliRunner()


def invoke(*args):
    return runner.invoke(app, [str(a) for a in args])


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
    assert r.exit_code == 1 and "no config.yaml" in r.stderr


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


def test_eval_stride_out_of_range(tiny_yaml, tmp_path):
    assert invoke("train", "--config", tiny_yaml, "--out", tmp_path, "--quiet").exit_code == 0
    for stride in (0, 17, -1):
        r = invoke("eval", tmp_path / "tiny-s0", "--stride", stride)
        assert r.exit_code == 2 and "--stride must be between 1" in r.stderr


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
    assert "tied" in r.stdout and "untied" in r.stdout and "paired over 2 seeds" in r.stdout
    assert (out / "compare" / "comparison.md").exists()
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
    assert r.exit_code == 2 and "need --config" in r.stderr

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
    assert r.exit_code == 1 and "does not exist" in r.stderr and len(r.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "runs" / "tiny-s0").exists()
