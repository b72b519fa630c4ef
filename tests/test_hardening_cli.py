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

from .conftest import TINY, comparison_dir

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
    from tiedlm.config import from_dict
    from tiedlm.config.identity import config_hash

    cfg = yaml.safe_load((run / "config.yaml").read_text())
    cfg["train"]["device"] = "cuda"
    (run / "config.yaml").write_text(yaml.safe_dump(cfg))
    report = json.loads((run / "report.json").read_text())  # as training on CUDA writes it: the same config
    report["config"]["train"]["device"] = "cuda"
    report["config_hash"] = config_hash(from_dict(report["config"]))
    (run / "report.json").write_text(json.dumps(report))
    result = runner.invoke(app, ["sample", str(run), "--max-new-tokens", "2"])
    assert result.exit_code == 2
    line = one_line(result)
    assert "train.device is cuda" in line and "--device auto" in line


# ------------------------------------------------------------ variant labels (item 10)


def test_labels_show_each_runs_real_values_for_operational_keys():
    from tiedlm.compare.variants import label_variants

    plain = load_config(None, TINY + ["train.eval_every=10", "train.eval_tokens=2048"])
    kept = load_config(None, TINY + ["train.eval_every=5", "train.eval_tokens=512", "train.keep_best=true"])
    labels, keys = label_variants([plain, kept])
    assert "train.keep_best" in keys and "train.eval_every" in keys
    assert "null" not in " ".join(labels)
    assert "eval_every=10" in labels[0] and "keep_best=false" in labels[0]
    assert "eval_every=5" in labels[1] and "eval_tokens=512" in labels[1] and "keep_best=true" in labels[1]


def test_labels_of_an_older_run_without_the_added_keys_show_their_defaults(tmp_path):
    """An older run's config.yaml lacks the keys added since: runs.read_config reads them at their
    "as before" values, and the label shows those."""
    from tiedlm import runs
    from tiedlm.compare.variants import label_variants
    from tiedlm.config import to_dict

    old = to_dict(load_config(None, TINY))
    for key in ("keep_best", "early_stop_patience", "early_stop_min_delta", "log_to"):
        old["train"].pop(key)
    (tmp_path / runs.CONFIG).write_text(json.dumps(old))  # JSON is YAML
    new = load_config(None, TINY + ["train.keep_best=true"])
    labels, _ = label_variants([runs.read_config(tmp_path), new])
    assert "null" not in " ".join(labels) and "keep_best=false" in labels[0]


def test_a_matched_setting_shows_each_keys_real_value_everywhere(tmp_path):
    """tied vs untied at the default evaluation, and a tied run that keeps its best weights (where
    eval_every, eval_tokens and keep_best are part of the variant): the matched setting of the pair
    takes its values from a member run's whole config, never null, in every output."""
    import tiedlm.compare as C

    from .test_compare import TIED, UNTIED, make_run

    runs_dir = tmp_path / "runs"
    kept = ["train.eval_every=6", "train.keep_best=true", "train.eval_tokens=128"]
    for seed in (0, 1):
        make_run(runs_dir, f"tiny-untied-s{seed}", seed, UNTIED, val=60.0 + seed)
        make_run(runs_dir, f"tiny-s{seed}", seed, TIED, val=58.0 + seed)
        make_run(runs_dir, f"k03-s{seed}", seed, TIED + kept, val=57.0 + seed)
    default = load_config(None, ["train.max_steps=100"]).train
    want = {"train.eval_every": default.eval_every, "train.eval_tokens": default.eval_tokens,
            "train.keep_best": False}
    assert None not in want.values()
    result = C.compare_runs(runs_dir=runs_dir)
    assert result.mode == "matched" and len(result.matched) == 1
    m = result.matched[0]
    assert m.tied == "tied, eval_every=%d, eval_tokens=%d, keep_best=false" % (default.eval_every,
                                                                               default.eval_tokens)
    assert m.setting == want and "null" not in m.label
    assert m.label == f"eval_every={default.eval_every}, eval_tokens={default.eval_tokens}, keep_best=false"
    assert "null" not in C.format_terminal_table(result)
    out = comparison_dir(runs_dir)
    data = json.loads((out / "comparison.json").read_text())
    assert data["matched"][0]["setting"] == want
    md = (out / "comparison.md").read_text()
    assert f"| {m.label} |" in md and "null" not in md.split("## Tying effect per setting")[1].split("\n## ")[0]


# ------------------------------------------------------------ torchrun's environment and errors


def test_a_hand_set_or_malformed_launch_environment_is_always_said(tiny_yaml, tmp_path):
    """RANK / WORLD_SIZE without torchrun, or malformed: the process may be the only one, so its
    refusal is printed, whatever rank it claims (it used to exit 2 in silence)."""
    base = {"TORCHELASTIC_RUN_ID": None, "MASTER_ADDR": None, "LOCAL_RANK": None}
    for env, words in (({"WORLD_SIZE": "2", "RANK": "1"}, "MASTER_ADDR is not"),
                       ({"WORLD_SIZE": "2", "RANK": "x"}, "must be integers"),
                       ({"WORLD_SIZE": "2", "RANK": "5", "MASTER_ADDR": "127.0.0.1"}, "not within WORLD_SIZE"),
                       # under torchrun's own variable, a malformed environment is still said
                       ({"WORLD_SIZE": "2", "RANK": "5", "MASTER_ADDR": "127.0.0.1", "TORCHELASTIC_RUN_ID": "r"},
                        "not within WORLD_SIZE")):
        result = runner.invoke(app, ["train", "-c", str(tiny_yaml), "--out", str(tmp_path / "runs"), "-q"],
                               env={**base, **env})
        assert result.exit_code == 2, result.output
        assert words in one_line(result) and "launch" in one_line(result)
        assert not (tmp_path / "runs").exists()
    # a well-formed environment set by hand (no torchrun): a config error is said, not left to a rank 0
    hand = {**base, "WORLD_SIZE": "2", "RANK": "1", "MASTER_ADDR": "127.0.0.1"}
    result = runner.invoke(app, ["train", "-c", str(tiny_yaml), "--set", "model.n_layer=0"], env=hand)
    assert result.exit_code == 2 and "model.n_layer" in one_line(result)


def test_under_torchrun_rank_0_alone_says_an_error_every_rank_meets(tiny_yaml, monkeypatch):
    from tiedlm import distributed

    torchrun = {"WORLD_SIZE": "2", "RANK": "1", "LOCAL_RANK": "1", "MASTER_ADDR": "127.0.0.1",
                "TORCHELASTIC_RUN_ID": "none"}
    args = ["train", "-c", str(tiny_yaml), "--set", "model.n_layer=0"]
    result = runner.invoke(app, args, env=torchrun)
    assert result.exit_code == 2 and result.stderr == ""  # rank 0 says it
    result = runner.invoke(app, args, env={**torchrun, "RANK": "0", "LOCAL_RANK": "0"})
    assert result.exit_code == 2 and "model.n_layer" in one_line(result)
    # once this process started its process group, it is a rank of several whatever the environment says
    monkeypatch.setattr(distributed, "_started_rank", 1)
    result = runner.invoke(app, args, env={"WORLD_SIZE": "2", "RANK": "1", "TORCHELASTIC_RUN_ID": None})
    assert result.exit_code == 2 and result.stderr == ""
    monkeypatch.setattr(distributed, "_started_rank", 0)
    result = runner.invoke(app, args, env={"WORLD_SIZE": "2", "RANK": "1", "TORCHELASTIC_RUN_ID": None})
    assert result.exit_code == 2 and "model.n_layer" in one_line(result)
    assert distributed.leaves_errors_to_rank_0({"WORLD_SIZE": "2", "RANK": "1", "MASTER_ADDR": "x"}) is False


# ------------------------------------------------------------------------ tensorboard


def test_tensorboard_of_a_run_that_never_logged_is_a_usage_error(tmp_path):
    from .test_compare import make_run

    run_dir = make_run(tmp_path / "runs", "t-s0", 0)
    (run_dir / "metrics.jsonl").unlink()
    result = runner.invoke(app, ["tensorboard", str(run_dir)])
    assert result.exit_code == 2, result.output
    assert "has no metrics.jsonl" in one_line(result) and not (run_dir / "tb").exists()


def test_tensorboard_names_a_logdir_even_for_a_run_of_the_working_directory(tmp_path, monkeypatch):
    from .test_compare import make_run

    make_run(tmp_path / "runs", "t-s0", 0)
    make_run(tmp_path / "runs", "u-s0", 0)
    monkeypatch.chdir(tmp_path / "runs")
    for args in (["t-s0"], ["t-s0", "u-s0"], ["."]):
        result = runner.invoke(app, ["tensorboard", *args])
        assert result.exit_code == 0, result.output
        assert result.stdout.splitlines()[-1] == "view them side by side: tensorboard --logdir .", result.stdout
    monkeypatch.chdir(tmp_path)
    result = runner.invoke(app, ["tensorboard", "runs/t-s0"])
    assert result.stdout.splitlines()[-1] == "view them side by side: tensorboard --logdir runs"
