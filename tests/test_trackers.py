"""Experiment trackers (train.log_to: wandb, mlflow, trackio; tiedlm/trackers/): each run read back
through the tracker's own files or client holds what metrics.jsonl and report.json hold, a resumed
run continues the same tracker run with each step once, a failing tracker leaves the run finished,
a missing package names its extra, and compare logs a summary run. Offline: W&B in offline mode
(its .wandb record files read with W&B's own protobuf), MLflow on a local file store, Trackio in
a local folder."""

import json
import struct
import sys
from pathlib import Path

import pytest

from tiedlm import runs
from tiedlm.config import load_config
from tiedlm.errors import ConfigError, Interrupted
from tiedlm.trackers.base import STATE
from tiedlm.trackers.mlflow import MlflowTracker
from tiedlm.train import train_run
from tiedlm.config.identity import config_hash

from .test_tensorboard import CFG, HASH_BEFORE_LOG_TO

ALL = "train.log_to=[wandb, mlflow, trackio]"


def tracker_env(mp: pytest.MonkeyPatch, root: Path) -> None:
    """Every tracker writes under root and reaches no network."""
    for key, value in {"WANDB_MODE": "offline", "WANDB_SILENT": "true", "WANDB_DIR": root / "wandb",
                       "WANDB_CONFIG_DIR": root / "wandb-config", "WANDB_CACHE_DIR": root / "wandb-cache",
                       "WANDB_DATA_DIR": root / "wandb-data", "MLFLOW_TRACKING_URI": (root / "mlruns").as_uri(),
                       "MLFLOW_ALLOW_FILE_STORE": "true", "TRACKIO_DIR": root / "trackio"}.items():
        mp.setenv(key, str(value))
    if "trackio" in sys.modules:  # Trackio reads its folder once, on import
        mp.setattr("trackio.utils.TRACKIO_DIR", root / "trackio", raising=False)


def train(out: Path, name: str, *extra: str, stop_after_step=None) -> Path:
    return train_run(load_config(None, CFG + list(extra)), out=out, name=name, progress=False,
                     stop_after_step=stop_after_step)


@pytest.fixture(scope="module")
def resumed(tmp_path_factory):
    """A run logged to all three trackers, interrupted at step 10 and resumed: (run folder, the
    ids trackers.json held after the interruption)."""
    root = tmp_path_factory.mktemp("trackers")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TIEDLM_CACHE", str(root / "cache"))
        tracker_env(mp, root)
        with pytest.raises(Interrupted):
            train(root / "runs", "r", ALL, stop_after_step=10)
        first = json.loads((root / "runs" / "r" / STATE).read_text())
        run = train(root / "runs", "r", ALL)
        yield run, first, root


def series(metrics: list[dict], kind: str, field: str) -> list[tuple[int, float]]:
    return [(r["step"], r[field]) for r in metrics if r["kind"] == kind]


# ------------------------------------------------------------------ W&B's offline record files


def wandb_records(path: Path):
    """The protobuf Records of one .wandb file (LevelDB's log format: 32 KiB blocks of chunks,
    each with a 7-byte header of checksum, length and type; the file opens with W&B's 7 bytes)."""
    from wandb.proto import wandb_internal_pb2 as pb

    data, pos, chunk, block = path.read_bytes(), 7, b"", 32768
    while pos + 7 <= len(data):
        left = block - pos % block
        _, size, kind = struct.unpack("<IHB", data[pos:pos + 7]) if left >= 7 else (0, 0, 0)
        if left < 7 or (size == 0 and kind == 0):
            pos += left
            continue
        chunk += data[pos + 7:pos + 7 + size]
        pos += 7 + size
        if kind in (1, 4):  # a full record, or the last chunk of one
            record = pb.Record()
            record.ParseFromString(chunk)
            chunk = b""
            yield record


def wandb_run(run_dir: Path, run_id: str) -> dict:
    """Every attempt's files of one W&B run: its history rows, config, summary and run records."""
    files = sorted(run_dir.glob(f"wandb/offline-run-*-{run_id}/run-{run_id}.wandb"))
    out = {"attempts": len(files), "history": [], "config": {}, "summary": {}, "group": None}
    for f in files:
        for r in wandb_records(f):
            kind = r.WhichOneof("record_type")
            if kind == "history":
                row = {(i.key or "/".join(i.nested_key)): json.loads(i.value_json) for i in r.history.item}
                out["history"].append((r.history.step.num, row))
            elif kind == "run":
                out["group"] = r.run.run_group
                out["config"].update({i.key: json.loads(i.value_json) for i in r.run.config.update})
            elif kind == "summary":
                out["summary"].update({(i.key or "/".join(i.nested_key)): json.loads(i.value_json)
                                       for i in r.summary.update})
    return out


def test_wandb_holds_one_series_across_the_resume(resumed):
    run, first, _ = resumed
    state = json.loads((run / STATE).read_text())
    assert state["wandb"]["id"] == first["wandb"]["id"] and first["wandb"]["step"] == 9  # logged up to the flush
    w = wandb_run(run, state["wandb"]["id"])
    assert w["attempts"] == 2 and w["group"] == runs.read_report(run).config.name  # grouped by the config's name
    metrics = runs.read_metrics(run)
    got = [(step, row["train/loss"]) for step, row in w["history"] if "train/loss" in row]
    assert got == series(metrics, "train", "loss")  # steps 3..24, each once, the record's values
    assert [s for s, row in w["history"] if "val/perplexity" in row] == [6, 12, 18, 24]
    assert all("train/lr" in row and "train/tokens_per_s" in row for _, row in w["history"] if "train/loss" in row)
    report = runs.read_report(run)
    assert w["config"]["model"]["n_embd"] == 32 and w["config"]["params"]["total"] == report.params["total"]
    assert w["config"]["ledger"] == json.loads(json.dumps(report.ledger))
    assert w["summary"]["final/test/perplexity"] == pytest.approx(report.final["test"]["perplexity"])


def test_mlflow_holds_one_series_across_the_resume(resumed):
    from mlflow import MlflowClient

    run, first, root = resumed
    state = json.loads((run / STATE).read_text())
    assert state["mlflow"]["id"] == first["mlflow"]["id"]
    client = MlflowClient(tracking_uri=(root / "mlruns").as_uri())
    got = client.get_run(state["mlflow"]["id"])
    metrics = runs.read_metrics(run)
    history = [(m.step, m.value) for m in client.get_metric_history(got.info.run_id, "train/loss")]
    assert sorted(history) == series(metrics, "train", "loss")
    val = sorted((m.step, m.value) for m in client.get_metric_history(got.info.run_id, "val/perplexity"))
    assert val == series(metrics, "eval", "perplexity")
    report = runs.read_report(run)
    assert got.info.status == "FINISHED" and got.info.run_name == "r"
    assert got.data.params["model.n_embd"] == "32" and got.data.params["params.total"] == str(report.params["total"])
    assert got.data.metrics["final/test/loss"] == pytest.approx(report.final["test"]["loss"])
    assert {a.path for a in client.list_artifacts(got.info.run_id)} >= {"ledger.json", "config.json", "params.md"}
    assert client.get_experiment(got.info.experiment_id).name == report.config.name


def test_trackio_holds_one_series_across_the_resume(resumed):
    from trackio.sqlite_storage import SQLiteStorage

    run, first, _ = resumed
    state = json.loads((run / STATE).read_text())
    logs = SQLiteStorage.get_logs(project=state["trackio"]["project"], run=state["trackio"]["id"])
    got = [(row["step"], row["train/loss"]) for row in logs if row.get("train/loss") is not None]
    assert got == series(runs.read_metrics(run), "train", "loss")
    report = runs.read_report(run)
    finals = [row for row in logs if row.get("final/test/loss") is not None]
    assert len(finals) == 1 and finals[0]["final/test/loss"] == pytest.approx(report.final["test"]["loss"])


def test_a_failing_tracker_is_said_once_and_the_run_finishes(tmp_path, monkeypatch, capsys):
    tracker_env(monkeypatch, tmp_path)

    def broken(self, items):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(MlflowTracker, "scalars", broken)
    run = train(tmp_path / "runs", "full", "train.log_to=[mlflow]")
    report = runs.read_report(run)
    assert report.status == "finished" and (run / report.checkpoint).is_dir()
    assert [r["step"] for r in runs.read_metrics(run) if r["kind"] == "eval"] == [6, 12, 18, 24]
    lines = [line for line in capsys.readouterr().err.splitlines() if "MLflow logging stopped" in line]
    assert len(lines) == 1 and "No space left on device" in lines[0]


@pytest.mark.parametrize("name", ["wandb", "mlflow", "trackio"])
def test_a_missing_package_names_its_extra_and_writes_nothing(tmp_path, monkeypatch, name):
    monkeypatch.setitem(sys.modules, name, None)  # `import name` raises ImportError
    with pytest.raises(ConfigError) as err:
        train(tmp_path, "nopkg", f"train.log_to=[tensorboard, {name}]")
    assert str(err.value) == f"train.log_to: {name} needs the {name} package — pip install 'tiedlm[{name}]'"
    assert list(tmp_path.iterdir()) == []


def test_the_trackers_leave_the_config_hash_alone():
    assert config_hash(load_config(None, CFG + [ALL])) == HASH_BEFORE_LOG_TO
    assert load_config(None, CFG + ["train.log_to=[tensorboard, trackio]"]).train.log_to == ["tensorboard", "trackio"]
    with pytest.raises(ConfigError, match="'comet' is not a logger .* use tensorboard, wandb, mlflow, trackio"):
        load_config(None, CFG + ["train.log_to=[comet]"])


def test_compare_logs_a_summary_run_grouped_with_its_runs(resumed, monkeypatch):
    from mlflow import MlflowClient

    from tiedlm.compare import compare_runs

    run, _, root = resumed
    tracker_env(monkeypatch, root)
    untied = train(run.parent, "u", "train.log_to=[mlflow]", "model.tie_embeddings=false")
    c = compare_runs([run, untied], out=root / "cmp")
    client = MlflowClient(tracking_uri=(root / "mlruns").as_uri())
    experiment = client.get_experiment_by_name(load_config(None, CFG).name)
    found = {r.info.run_name: r for r in client.search_runs([experiment.experiment_id])}
    assert {"r", "u", "cmp"} <= set(found)  # the summary run beside the runs it compares
    summary = found["cmp"]
    assert summary.info.status == "FINISHED"
    artifacts = {a.path for a in client.list_artifacts(summary.info.run_id)}
    assert {"verdict.json", "verdict.md", "interval.md", "comparison.md"} <= artifacts
    assert {Path(p).name for p in c.files.values() if p.endswith(".png")} <= artifacts
    table = json.loads(Path(client.download_artifacts(summary.info.run_id, "verdict.json", str(root))).read_text())
    variants = [row[0] for row in table["data"]]
    assert sorted(variants) == sorted(v.label for v in c.variants)
    tied = next(v for v in c.to_json()["variants"] if v["vs_baseline"])
    assert summary.data.metrics[f"effect/{tied['label']}"] == pytest.approx(tied["vs_baseline"][c.primary]["relative"])
    w = [f for f in (root / "cmp").glob("wandb/offline-run-*/run-*.wandb")]
    assert len(w) == 1  # the W&B summary run, in the comparison's folder


def test_compare_log_to_takes_only_known_trackers(tmp_path):
    from typer.testing import CliRunner

    from tiedlm.cli import app

    r = CliRunner().invoke(app, ["compare", str(tmp_path), "--log-to", "comet"])
    assert r.exit_code == 2 and r.stderr.strip().splitlines() == [
        "tiedlm: error: --log-to: 'comet' is not a logger tiedlm writes to — use tensorboard, wandb, mlflow, trackio "
        "(or [] for metrics.jsonl alone)"]
