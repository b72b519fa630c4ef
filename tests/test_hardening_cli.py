"""The commands that read runs (eval, analyze, sample, export, tensorboard, compare) held to the
CLI's contract: a user-caused error exits 2, a hint names an option of the command that printed
it, a damaged run is said in one line, and variant labels show each run's real values."""

import json
import re
import shutil

import pytest
import typer
from typer.testing import CliRunner

from tiedlm.cli import app
from tiedlm.config import load_config

from .conftest import TINY

runner = CliRunner()

READERS = ("eval", "analyze", "sample", "export", "tensorboard", "compare")


def options_of(command: str) -> set[str]:
    """Every option name the command accepts (its own, and the group's --debug)."""
    group = typer.main.get_command(app)
    names = {"--debug"}
    for param in group.commands[command].params:
        names.update(o for o in param.opts + param.secondary_opts if o.startswith("--"))
    return names


def args_for(command: str, run, tmp_path) -> list[str]:
    """The least a command needs to read `run`."""
    if command == "export":
        return ["export", str(run), "--out", str(tmp_path / "exported")]
    if command == "sample":
        return ["sample", str(run), "--max-new-tokens", "3"]
    if command == "compare":
        return ["compare", str(run), "--out", str(tmp_path / "cmp")]
    return [command, str(run)]


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    from tiedlm.train import train_run

    root = tmp_path_factory.mktemp("runs")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TIEDLM_CACHE", str(tmp_path_factory.mktemp("cache")))
        return train_run(load_config(None, TINY), out=root, progress=False)


@pytest.fixture
def run(trained, tmp_path):
    """A private copy of the trained run, free to damage."""
    copy = tmp_path / "runs" / trained.name
    shutil.copytree(trained, copy)
    return copy


def one_line(result) -> str:
    err = (result.stderr or "").strip()
    assert len(err.splitlines()) == 1 and err.startswith("tiedlm: error: "), err
    assert "Traceback" not in result.output
    return err


# ------------------------------------------------------------------------ exit codes (item 13)


@pytest.mark.parametrize("command", READERS)
def test_a_missing_run_is_a_usage_error(command, tmp_path):
    result = runner.invoke(app, args_for(command, tmp_path / "runs" / "nope", tmp_path))
    assert result.exit_code == 2, result.output
    assert "nope" in one_line(result)


@pytest.mark.parametrize("command", READERS)
def test_a_folder_that_is_not_a_run_is_a_usage_error(command, tmp_path):
    (tmp_path / "runs" / "empty").mkdir(parents=True)
    result = runner.invoke(app, args_for(command, tmp_path / "runs" / "empty", tmp_path))
    assert result.exit_code == 2, result.output
    one_line(result)


@pytest.mark.parametrize("command", ("eval", "analyze", "sample", "export"))
def test_a_run_without_a_checkpoint_is_a_usage_error(command, run, tmp_path):
    shutil.rmtree(run / "checkpoints")
    result = runner.invoke(app, args_for(command, run, tmp_path))
    assert result.exit_code == 2, result.output
    assert "checkpoint" in one_line(result)


def test_export_of_a_checkpoint_the_run_lacks_is_a_usage_error(run, tmp_path):
    result = runner.invoke(app, ["export", str(run), "--checkpoint", "bogus", "--out", str(tmp_path / "x")])
    assert result.exit_code == 2
    assert "'bogus'" in one_line(result)
    assert not (tmp_path / "x").exists()


def test_eval_best_on_a_run_without_kept_weights_is_a_usage_error(run):
    result = runner.invoke(app, ["eval", str(run), "--best"])
    assert result.exit_code == 2
    assert "--best" in one_line(result)


@pytest.mark.parametrize("command", ("export", "analyze", "compare"))
def test_an_out_that_is_a_file_is_a_usage_error(command, run, tmp_path):
    afile = tmp_path / "afile"
    afile.write_text("mine\n")
    args = {"export": ["export", str(run), "--out", str(afile)],
            "analyze": ["analyze", str(run), "--out", str(afile)],
            "compare": ["compare", str(run), "--out", str(afile)]}[command]
    result = runner.invoke(app, args)
    assert result.exit_code == 2, result.output
    assert "afile" in one_line(result)
    assert afile.read_text() == "mine\n"


# ------------------------------------------------------------------- hints that exist (item 12)


def _damage(run, what: str) -> None:
    if what == "checkpoint":
        weights = next((run / "checkpoints").glob("step-*/model.safetensors"))
        data = bytearray(weights.read_bytes())
        data[-1] ^= 0xFF
        weights.write_bytes(bytes(data))
    elif what == "config":
        (run / "config.yaml").write_text("model: [unclosed\n")
    elif what == "report":
        (run / "report.json").write_text("{not json")


@pytest.mark.parametrize("what", ("checkpoint", "config", "report"))
@pytest.mark.parametrize("command", READERS)
def test_a_damaged_run_gets_a_hint_the_command_can_follow(command, what, run, tmp_path):
    _damage(run, what)
    result = runner.invoke(app, args_for(command, run, tmp_path))
    if result.exit_code == 0:  # these read the metrics and report.json's config, not the weights or config.yaml
        assert what in ("checkpoint", "config") and command in ("tensorboard", "compare")
        return
    line = one_line(result)
    own = re.sub(r"tiedlm (?!error)\w+[^—,()]*", "", line)  # a whole command (tiedlm train --seed N) is fine
    named = set(re.findall(r"(?<![\w-])--[a-z][a-z-]*", own))
    assert named <= options_of(command), f"{command} has no {named - options_of(command)}: {line}"


@pytest.mark.parametrize("command", ("eval", "sample"))
def test_an_unavailable_device_names_the_commands_own_option(command, run):
    import torch

    if torch.cuda.is_available():
        pytest.skip("a CUDA device is visible here")
    result = runner.invoke(app, [command, str(run), "--device", "cuda"])
    assert result.exit_code == 2
    line = one_line(result)
    assert "--device auto" in line and "--set" not in line


def test_a_run_trained_on_cuda_sampled_here_names_the_device_option(run):
    import torch
    import yaml

    if torch.cuda.is_available():
        pytest.skip("a CUDA device is visible here")
    cfg = yaml.safe_load((run / "config.yaml").read_text())
    cfg["train"]["device"] = "cuda"
    (run / "config.yaml").write_text(yaml.safe_dump(cfg))
    result = runner.invoke(app, ["sample", str(run), "--max-new-tokens", "2"])
    assert result.exit_code == 2
    line = one_line(result)
    assert "train.device is cuda" in line and "--device auto" in line


# ------------------------------------------------------------ variant labels (item 10)


def test_labels_show_each_runs_real_values_for_operational_keys():
    from tiedlm.compare.variants import label_variants
    from tiedlm.config import to_dict

    plain = to_dict(load_config(None, TINY + ["train.eval_every=10", "train.eval_tokens=2048"]))
    kept = to_dict(load_config(None, TINY + ["train.eval_every=5", "train.eval_tokens=512", "train.keep_best=true"]))
    labels, keys = label_variants([plain, kept])
    assert "train.keep_best" in keys and "train.eval_every" in keys
    assert "null" not in " ".join(labels)
    assert "eval_every=10" in labels[0] and "keep_best=false" in labels[0]
    assert "eval_every=5" in labels[1] and "eval_tokens=512" in labels[1] and "keep_best=true" in labels[1]


def test_labels_of_an_older_run_without_the_added_keys_show_their_defaults():
    from tiedlm.compare.variants import label_variants
    from tiedlm.config import to_dict

    old = to_dict(load_config(None, TINY))
    for key in ("keep_best", "early_stop_patience", "early_stop_min_delta", "log_to"):
        old["train"].pop(key)
    new = to_dict(load_config(None, TINY + ["train.keep_best=true"]))
    labels, _ = label_variants([json.loads(json.dumps(old)), new])
    assert "null" not in " ".join(labels) and "keep_best=false" in labels[0]
