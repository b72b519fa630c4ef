"""A run's config.yaml edited after the run: every command that rebuilds the run from its folder
(eval, sample, export, analyze; compare where it reads config.yaml; train) refuses it in one line,
by the config hash report.json stores, and changes nothing; the keys outside the hash may still
change, and an older run folder, whose config runs/ brings up to date, still compares equal."""

import json
import shutil
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from tiedlm import runs
from tiedlm.cli import app
from tiedlm.config import load_config, to_yaml
from tiedlm.config.identity import config_hash
from tiedlm.errors import DamagedRunError
from tiedlm.train import train_run

from .conftest import TINY

runner = CliRunner()
LLAMA = TINY + ["model.arch=llama", "train.device=cpu"]
FIXTURE = Path(__file__).parent / "fixtures" / "report-0.1.json"  # written by tiedlm 0.1


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TIEDLM_CACHE", str(tmp_path_factory.mktemp("cache")))
        mp.setenv("HF_DATASETS_OFFLINE", "1")
        return train_run(load_config(None, LLAMA), out=tmp_path_factory.mktemp("runs"), name="r", progress=False)


@pytest.fixture
def run(trained, tmp_path):
    """A private copy of the trained run, free to edit."""
    return Path(shutil.copytree(trained, tmp_path / "runs" / trained.name))


def edit(run: Path, section: str, key: str, value) -> None:
    data = yaml.safe_load((run / runs.CONFIG).read_text())
    data[section][key] = value
    (run / runs.CONFIG).write_text(yaml.safe_dump(data))


def snapshot(folder: Path) -> dict:
    return {str(p.relative_to(folder)): p.read_bytes() if p.is_file() else None for p in sorted(folder.rglob("*"))}


def refused(result, code: int = 1, dashes: int = 1) -> str:
    """The one line; `dashes`: the " — " before the fix (compare's line holds each left-out run's too)."""
    lines = (result.stderr or "").strip().splitlines()
    assert result.exit_code == code, result.output
    assert len(lines) == 1 and lines[0].startswith("tiedlm: error: "), result.output
    assert "Traceback" not in result.output and lines[0].count(" — ") == dashes, lines[0]
    return lines[0]


def args_for(command: str, run: Path, tmp_path: Path) -> list[str]:
    return {"eval": ["eval", str(run)],
            "sample": ["sample", str(run), "--max-new-tokens", "3"],
            "export": ["export", str(run), "--out", str(tmp_path / "exported")],
            "analyze": ["analyze", str(run)]}[command]


@pytest.mark.parametrize("command", ("eval", "sample", "export", "analyze"))
def test_a_reader_refuses_a_config_yaml_edited_after_the_run(command, run, tmp_path):
    edit(run, "model", "rope_theta", 500.0)  # keeps every tensor's shape: the weights would load
    before = snapshot(run)
    line = refused(runner.invoke(app, args_for(command, run, tmp_path)))
    report = json.loads((run / runs.REPORT).read_text())
    assert f"{run / runs.CONFIG} was edited after the run (model.rope_theta differs from the config in report.json;" \
           in line
    assert f"is not the run's {report['config_hash']})" in line
    assert f"— restore it (the run's config is in report.json), or train the edited config as a run of its own: " \
           f"tiedlm train --config {run / runs.CONFIG} --out {run.parent} --name r-edited" in line
    assert snapshot(run) == before
    assert not (tmp_path / "exported").exists()


@pytest.mark.parametrize("section,key,value", [("model", "embed_scale", "sqrt_d"), ("model", "norm_eps", 1e-3),
                                               ("train", "lr", 0.5), ("eval", "stride", 8)])
def test_any_key_of_the_hash_counts(section, key, value, run):
    edit(run, section, key, value)
    line = refused(runner.invoke(app, ["eval", str(run)]))
    assert f"({section}.{key} differs from the config in report.json;" in line
    with pytest.raises(DamagedRunError):
        runs.read_config(run)


def test_the_keys_outside_the_hash_may_change(run):
    """How a run is carried out (threads, the evaluation's batch) is not what it trained: as on a resume."""
    edit(run, "train", "threads", 2)
    edit(run, "eval", "batch_size", 8)
    result = runner.invoke(app, ["eval", str(run)])
    assert result.exit_code == 0, result.output
    assert runs.read_config(run).train.threads == 2


def test_train_refuses_it_too_instead_of_calling_the_run_finished(run, tmp_path):
    """With the run's original config (before: "a different config") and with the edited file
    itself (before: "already finished with this config", exit 0): the run was not trained with it."""
    edit(run, "model", "rope_theta", 500.0)
    before = snapshot(run)
    original = tmp_path / "original.yaml"
    original.write_text(to_yaml(load_config(None, LLAMA)))
    for config in (original, run / runs.CONFIG):
        line = refused(runner.invoke(app, ["train", "--config", str(config), "--out", str(run.parent),
                                           "--name", run.name, "--quiet"]))
        assert "config.yaml was edited after the run (model.rope_theta differs" in line
        assert line.endswith("— restore it, or use --overwrite to start afresh with the config given")
    assert snapshot(run) == before


def test_the_suggested_retrain_trains_the_edited_config(run):
    edit(run, "model", "rope_theta", 500.0)
    result = runner.invoke(app, ["train", "--config", str(run / runs.CONFIG), "--out", str(run.parent),
                                 "--name", "r-edited", "--quiet"])
    assert result.exit_code == 0, result.output
    assert runs.read_config(run.parent / "r-edited").model.rope_theta == 500.0


def test_restored_it_reads_again(run):
    kept = (run / runs.CONFIG).read_text()
    edit(run, "model", "rope_theta", 500.0)
    (run / runs.CONFIG).write_text(kept)
    assert runner.invoke(app, ["eval", str(run)]).exit_code == 0


def test_compare_reading_config_yaml_leaves_an_edited_run_out(run, tmp_path):
    """compare reads config.yaml only for a report.json without a config; then the stored hash decides."""
    report = json.loads((run / runs.REPORT).read_text())
    del report["config"]
    (run / runs.REPORT).write_text(json.dumps(report))
    edit(run, "model", "rope_theta", 500.0)
    before = snapshot(run)
    line = refused(runner.invoke(app, ["compare", str(run), "--out", str(tmp_path / "cmp")]), dashes=2)
    assert "1 left out: r: unreadable config.yaml: " in line and "was edited after the run (its hash" in line
    assert f"is not the run's {report['config_hash']})" in line
    assert snapshot(run) == before


def test_an_older_run_folder_still_reads(tmp_path):
    """A run folder of tiedlm 0.1: its config.yaml lacks every key added since; runs/ reads them at
    their "as before" values, which the hash leaves out, so it matches the hash 0.1 stored."""
    report = json.loads(FIXTURE.read_text())
    (tmp_path / runs.REPORT).write_text(FIXTURE.read_text())
    (tmp_path / runs.CONFIG).write_text(yaml.safe_dump(report["config"], sort_keys=False))
    cfg = runs.read_config(tmp_path)
    assert config_hash(cfg) == report["config_hash"] == "538fe10e64ee2730"
    edit(tmp_path, "model", "embed_scale", "sqrt_d")
    with pytest.raises(DamagedRunError, match="model.embed_scale differs from the config in report.json"):
        runs.read_config(tmp_path)


def test_a_folder_without_a_report_has_nothing_to_compare(tmp_path):
    (tmp_path / runs.CONFIG).write_text(to_yaml(load_config(None, LLAMA)))
    assert runs.read_config(tmp_path).model.arch == "llama"
