"""TensorBoard logging (train.log_to: [tensorboard], tiedlm/trackers/tensorboard.py): the event files
written as a run trains hold exactly what metrics.jsonl and report.json hold; a resumed run has
each step once; back-filling a run trained without TensorBoard writes the same; a missing
package, an unknown logger and a failed write are handled; the new key leaves the hash alone."""

import sys
from pathlib import Path

import numpy as np
import pytest

from tiedlm import runs
from tiedlm.config import from_dict, load_config, to_dict
from tiedlm.config.identity import config_hash, variant_dict
from tiedlm.errors import ConfigError, Interrupted, RunError
from tiedlm.trackers.tensorboard import TB, EventWriter, backfill, backfill_many
from tiedlm.train import train_run

# A tiny tied model on a tiny synthetic corpus; eval_every divides max_steps, so the periodic
# evaluations fall at 6, 12, 18, 24 and the last step is both logged and evaluated.
CFG = ["data.path=builtin:synthetic", "data.synthetic.train_tokens=3000", "data.synthetic.validation_tokens=2000",
       "data.synthetic.test_tokens=2000", "model.n_layer=1", "model.n_head=2", "model.n_embd=32",
       "model.block_size=32", "train.batch_size=8", "train.max_steps=24", "train.log_every=3",
       "train.eval_every=6", "train.eval_tokens=1000", "train.lr=1e-2", "train.warmup_steps=4",
       "train.checkpoint_every=6", "train.device=cpu", "train.threads=1", "eval.batch_size=16"]
TB_ON = "train.log_to=[tensorboard]"
# config_hash(load_config(None, CFG)) as computed by tiedlm before train.log_to existed
HASH_BEFORE_LOG_TO = "3989962a0cb4ac65"


def train(out: Path, name: str, *extra: str, stop_after_step=None) -> Path:
    return train_run(load_config(None, CFG + list(extra)), out=out, name=name, progress=False,
                     stop_after_step=stop_after_step)


def events(run_dir: Path):
    """The run's tb/ read back with TensorBoard's own reader: ({tag: [(step, value)]}, {tag: text})."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(run_dir / TB), size_guidance={"scalars": 0, "tensors": 0})
    acc.Reload()
    scalars = {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}
    texts = {tag: b"".join(acc.Tensors(tag)[-1].tensor_proto.string_val).decode()
             for tag in acc.Tags()["tensors"]}
    return scalars, texts


def f32(pairs):
    return [(step, float(np.float32(value))) for step, value in pairs]


def expected_scalars(run_dir: Path) -> dict:
    """What metrics.jsonl and report.json say TensorBoard must show, at float32 precision."""
    metrics = runs.read_metrics(run_dir)
    out = {
        "train/loss": [(r["step"], r["loss"]) for r in metrics if r["kind"] == "train"],
        "train/lr": [(r["step"], r["lr"]) for r in metrics if r["kind"] == "train"],
        "val/loss": [(r["step"], r["loss"]) for r in metrics if r["kind"] == "eval"],
        "val/perplexity": [(r["step"], r["perplexity"]) for r in metrics if r["kind"] == "eval"],
    }
    report = runs.read_report(run_dir)
    for split, res in report.final.items():
        out[f"final/{split}/loss"] = [(report.steps, res["loss"])]
        out[f"final/{split}/perplexity"] = [(report.steps, res["perplexity"])]
    return {tag: f32(pairs) for tag, pairs in out.items()}


@pytest.fixture(scope="module")
def logged(tmp_path_factory):
    """A run trained with TensorBoard logging, uninterrupted: the reference of every test here."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TIEDLM_CACHE", str(tmp_path_factory.mktemp("cache")))
        return train(tmp_path_factory.mktemp("runs"), "logged", TB_ON)


def test_a_logged_run_writes_what_its_metrics_and_report_say(logged):
    scalars, texts = events(logged)
    want = expected_scalars(logged)
    assert [s for s, _ in want["val/loss"]] == [6, 12, 18, 24]
    assert [s for s, _ in want["train/loss"]] == [3, 6, 9, 12, 15, 18, 21, 24]
    for tag, pairs in want.items():
        assert f32(scalars[tag]) == pairs, tag
    assert {"train/grad_norm", "train/tokens_per_s", "final/test/loss", "final/validation/perplexity"} <= set(scalars)
    assert not any(tag.startswith("final_best/") for tag in scalars)  # no keep_best: no best weights scored
    report = runs.read_report(logged)
    assert f"| total | {report.params['total']:,} |" in texts["params/text_summary"]
    assert "**logged** — tied input/output embeddings" in texts["run/text_summary"]
    assert len(list((logged / TB).iterdir())) == 1  # one event file


def test_a_resumed_run_logs_each_step_once_with_the_uninterrupted_values(logged, tmp_path):
    with pytest.raises(Interrupted):
        train(tmp_path, "r", TB_ON, stop_after_step=10)  # flushed at 10: steps 3..9 logged, eval at 6
    partial, _ = events(tmp_path / "r")
    assert [s for s, _ in partial["train/loss"]] == [3, 6, 9]
    assert "final/test/loss" not in partial
    run = train(tmp_path, "r", TB_ON)  # resumes from the checkpoint at step 10
    assert runs.read_report(run).resumed_at_steps == [10]
    scalars, _ = events(run)
    ref, _ = events(logged)
    for tag in ("train/loss", "train/lr", "val/loss", "final/test/loss"):
        steps = [s for s, _ in scalars[tag]]
        assert len(steps) == len(set(steps)), tag  # no step twice
        assert scalars[tag] == ref[tag], tag  # exact resume on CPU: the same numbers, once each
    assert len(list((run / TB).iterdir())) == 1


def test_the_kept_best_weights_final_evaluation_is_logged_at_their_step(tmp_path):
    run = train(tmp_path, "best", TB_ON, "train.keep_best=true")
    report = runs.read_report(run)
    best = report.best["step"]
    assert best != report.steps  # the best weights scored in a second pass (this config's curve)
    scalars, _ = events(run)
    for split, res in report.final_best.items():
        assert f32(scalars[f"final_best/{split}/loss"]) == f32([(best, res["loss"])])
        assert f32(scalars[f"final_best/{split}/perplexity"]) == f32([(best, res["perplexity"])])
        assert scalars[f"final_best/{split}/loss"] != scalars[f"final/{split}/loss"]


def test_backfill_writes_what_a_logged_run_wrote(logged, tmp_path):
    plain = train(tmp_path, "plain")  # the same run without TensorBoard
    assert not (plain / TB).exists()
    assert backfill(plain) == plain / TB
    scalars, texts = events(plain)
    ref_scalars, ref_texts = events(logged)
    speed = "train/tokens_per_s"  # measured, so not the same twice: as each run's metrics.jsonl says
    assert f32(scalars.pop(speed)) == f32([(r["step"], r["tokens_per_s"]) for r in runs.read_metrics(plain)
                                           if r["kind"] == "train"])
    ref_scalars.pop(speed)
    assert set(scalars) >= {"train/loss", "train/grad_norm", "val/perplexity", "final/test/perplexity"}
    assert scalars == ref_scalars
    assert texts["params/text_summary"] == ref_texts["params/text_summary"]
    assert texts["run/text_summary"] == ref_texts["run/text_summary"].replace("**logged**", "**plain**")
    (plain / TB / "notes.txt").write_text("x")  # not tiedlm's: left alone (test_hardening_writes.py)
    left_alone = []
    assert backfill_many([tmp_path], left_alone) == [plain / TB]  # a folder of runs stands for its runs
    assert left_alone == [plain / TB / "notes.txt"] and (plain / TB / "notes.txt").read_text() == "x"
    assert len([p for p in (plain / TB).iterdir() if p.name.startswith("events.")]) == 1  # replaced
    assert {tag: v for tag, v in events(plain)[0].items() if tag != speed} == ref_scalars


def test_backfill_of_an_unfinished_run_has_its_steps_and_no_final(tmp_path):
    with pytest.raises(Interrupted):
        train(tmp_path, "u", stop_after_step=7)
    backfill(tmp_path / "u")
    scalars, _ = events(tmp_path / "u")
    assert [s for s, _ in scalars["train/loss"]] == [3, 6]
    assert [s for s, _ in scalars["val/loss"]] == [6]
    assert not any(tag.startswith("final") for tag in scalars)


def test_backfill_refuses_what_is_not_a_run_with_metrics(tmp_path):
    with pytest.raises(RunError, match="is not a tiedlm run folder"):
        backfill(tmp_path)
    with pytest.raises(RunError, match="is not a tiedlm run folder"):
        backfill(tmp_path / "missing")
    run = tmp_path / "empty"
    run.mkdir()
    (run / runs.CONFIG).write_text("name: x\n")
    with pytest.raises(RunError, match="has no metrics.jsonl"):
        backfill(run)
    with pytest.raises(RunError, match="has no metrics.jsonl"):
        backfill_many([run])
    (tmp_path / "none").mkdir()
    with pytest.raises(RunError, match="holds no tiedlm runs"):
        backfill_many([tmp_path / "none"])
    assert not (run / TB).exists()


def test_a_missing_tensorboard_package_is_a_config_error_that_writes_nothing(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "tensorboard", None)  # `import tensorboard` raises ImportError
    with pytest.raises(ConfigError) as err:
        train(tmp_path, "nopkg", TB_ON)
    assert str(err.value) == ("train.log_to: tensorboard needs the tensorboard package — "
                              "pip install 'tiedlm[tensorboard]'")
    assert list(tmp_path.iterdir()) == []  # no run folder, not even an empty one


def test_a_failed_tensorboard_write_does_not_fail_the_run(tmp_path, monkeypatch, capsys):
    def broken(self, records):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(EventWriter, "records", broken)
    run = train(tmp_path, "full", TB_ON)
    assert runs.read_report(run).status == "finished"
    assert [r["step"] for r in runs.read_metrics(run) if r["kind"] == "eval"] == [6, 12, 18, 24]
    lines = [line for line in capsys.readouterr().err.splitlines() if "TensorBoard logging stopped" in line]
    assert len(lines) == 1 and "No space left on device" in lines[0]


def test_log_to_takes_only_known_loggers_each_once():
    assert load_config(None, CFG + [TB_ON]).train.log_to == ["tensorboard"]
    assert load_config(None, CFG).train.log_to == []
    with pytest.raises(ConfigError, match=r"train.log_to: 'comet' is not a logger .* use tensorboard"):
        load_config(None, CFG + ["train.log_to=[comet]"])
    with pytest.raises(ConfigError, match="names a logger twice"):
        load_config(None, CFG + ["train.log_to=[tensorboard, tensorboard]"])
    with pytest.raises(ConfigError, match="train.log_to must be a list of a string"):
        load_config(None, CFG + ["train.log_to=tensorboard"])


def test_log_to_leaves_the_config_hash_and_older_runs_alone(tmp_path):
    cfg = load_config(None, CFG)
    assert config_hash(cfg) == HASH_BEFORE_LOG_TO
    assert config_hash(load_config(None, CFG + [TB_ON])) == HASH_BEFORE_LOG_TO  # how a run is recorded only
    old = to_dict(cfg)
    del old["train"]["log_to"]  # a config written before the key existed
    assert config_hash(from_dict(old)) == HASH_BEFORE_LOG_TO
    run = tmp_path / "old"
    run.mkdir()
    import yaml

    # as tiedlm writes it (YAML 1.1 reads JSON's 1e-05, model.norm_eps, as a string; yaml writes 1.0e-05)
    (run / runs.CONFIG).write_text(yaml.safe_dump(old))
    assert variant_dict(runs.read_config(run)) == variant_dict(cfg)  # read back as the same variant
    assert runs.existing_state(run, load_config(None, CFG + [TB_ON])) == "resume"


def test_cli_train_compare_and_backfill_write_event_files(tmp_path):
    import yaml
    from typer.testing import CliRunner

    from tiedlm.cli import app
    from tiedlm.config import apply_overrides

    config = tmp_path / "tiny.yaml"
    config.write_text(yaml.safe_dump(apply_overrides({"name": "t"}, CFG)))
    root = tmp_path / "runs"
    r = CliRunner().invoke(app, ["train", "-c", str(config), "--tensorboard", "--out", str(root), "-q"])
    assert r.exit_code == 0, r.output
    assert events(root / "t-s0")[0]["val/loss"] == f32(expected_scalars(root / "t-s0")["val/loss"])
    r = CliRunner().invoke(app, ["train", "-c", str(config), "--seed", "1", "--out", str(root), "-q"])
    assert not (root / "t-s1" / TB).exists()
    r = CliRunner().invoke(app, ["compare", "--out", str(root), "--tensorboard"])
    assert r.exit_code == 0, r.output
    assert f"tensorboard --logdir {root}" in r.stdout
    assert events(root / "t-s1")[0]["train/loss"] == expected_scalars(root / "t-s1")["train/loss"]
    # the comparison written elsewhere: the command names where the runs' tb/ folders are, not --out
    elsewhere = tmp_path / "elsewhere"
    r = CliRunner().invoke(app, ["compare", str(root / "t-s0"), str(root / "t-s1"), "--out", str(elsewhere),
                                 "--tensorboard"])
    assert r.exit_code == 0, r.output
    assert f"runs: tensorboard --logdir {root}\n" in r.stdout and f"--logdir {elsewhere}" not in r.stdout
    r = CliRunner().invoke(app, ["tensorboard", str(root / "t-s*")])
    assert r.exit_code == 0 and r.stdout.count("wrote ") == 2 and f"--logdir {root}" in r.stdout
    r = CliRunner().invoke(app, ["tensorboard", str(tmp_path)])
    assert r.exit_code == 2 and len(r.stderr.strip().splitlines()) == 1


def test_the_soft_modes_distance_is_a_scalar_where_it_is_logged():
    from tiedlm.trackers.tensorboard import record_scalars

    row = {"kind": "train", "step": 7, "loss": 3.0, "lr": 1e-3, "grad_norm": 0.5, "tokens_per_s": 10.0,
           "w_out_minus_e": 0.25, "tie_penalty": 0.01}
    tags = {tag: value for tag, value, _ in record_scalars(row)}
    assert tags["train/w_out_minus_e"] == 0.25 and tags["train/tie_penalty"] == 0.01
    del row["w_out_minus_e"], row["tie_penalty"]  # a tied or untied run: no such scalar
    assert not any("w_out" in tag or "penalty" in tag for tag, _, _ in record_scalars(row))
