"""Best checkpoint and early stopping (train/selection.py and the loop): the best periodic validation
evaluation recorded, the kept best weights reloading to it exactly, resume across their write,
early stopping at the evaluation an independent rule predicts, and the config keys around them."""

import json
import math
from pathlib import Path

import pytest

from tiedlm.runs import checkpoints
from tiedlm import runs
from tiedlm.config import load_config, to_dict
from tiedlm.config.identity import config_hash
from tiedlm.errors import ConfigError, Interrupted, RunError
from tiedlm.train.selection import OVERTRAINED_MARGIN, BestTracker
from tiedlm.train import train_run

# A tiny corpus memorised by a model with too much room for it: the validation loss falls for a
# few evaluations, then rises (the real case on a small corpus trained for many epochs).
MEMORISE = ["data.path=builtin:synthetic", "data.synthetic.train_tokens=3000", "data.synthetic.validation_tokens=4000",
            "data.synthetic.test_tokens=4000", "model.n_layer=1", "model.n_head=2", "model.n_embd=32",
            "model.block_size=32", "model.tie_embeddings=false", "train.batch_size=8", "train.max_steps=80",
            "train.eval_every=5", "train.eval_tokens=2000", "train.lr=2e-2", "train.warmup_steps=10",
            "train.checkpoint_every=20", "train.device=cpu", "train.threads=1"]


def train(tmp: Path, name: str, *extra: str, stop_after_step=None, overwrite=False) -> Path:
    cfg = load_config(None, MEMORISE + list(extra))
    return train_run(cfg, out=tmp, name=name, progress=False, stop_after_step=stop_after_step, overwrite=overwrite)


def report(run_dir: Path) -> dict:
    return json.loads((run_dir / runs.REPORT).read_text())


def evals(run_dir: Path) -> list[tuple[int, float]]:
    return [(r["step"], r["loss"]) for r in runs.read_metrics(run_dir) if r["kind"] == "eval"]


def tensors_of(folder: Path) -> dict:
    from safetensors.torch import load_file

    return load_file(str(folder / checkpoints.MODEL_FILE))


def same_tensors(a: dict, b: dict) -> bool:
    import torch

    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """The uninterrupted run with keep_best: what every other run here must reproduce."""
    return train(tmp_path_factory.mktemp("ref"), "ref", "train.keep_best=true")


# ------------------------------------------------------------------ the best evaluation


def test_the_best_step_is_the_lowest_periodic_validation_loss(reference):
    r = report(reference)
    points = evals(reference)
    assert [s for s, _ in points] == list(range(5, 81, 5))
    step, loss = min(points, key=lambda p: (p[1], p[0]))  # the first of equal losses
    best = r["best"]
    assert (best["step"], best["loss"]) == (step, loss)
    assert best["step"] < 80  # the loss did rise after it: the corpus is memorised
    last = points[-1][1]
    assert best["last_step"] == 80 and best["last_loss"] == last
    assert best["last_above_best"] == pytest.approx(math.exp(last) / math.exp(loss) - 1, rel=1e-12)
    assert best["overtrained"] is (best["last_above_best"] > OVERTRAINED_MARGIN)
    assert best["overtrained"]  # by a wide margin in this set-up
    assert best["tokens"] == best["step"] * 8 * 32
    assert best["perplexity"] == pytest.approx(math.exp(loss))
    assert best["eval_tokens"] == 2000  # train.eval_tokens targets of the slice, each scored once
    md = (reference / runs.REPORT_MD).read_text()
    pct = f"{100 * best['last_above_best']:.1f}%"
    assert f"over-trained: final {pct} above best at step {best['step']}" in md


def test_kept_best_weights_reload_to_the_recorded_best_loss_exactly(reference):
    from tiedlm.data import prepare_data
    from tiedlm.device import autocast_ctx
    from tiedlm.evaluate import evaluate_split
    from tiedlm.model.blocks import GPT, load_model_tensors

    r = report(reference)
    folders = checkpoints.best_weight_folders(reference)
    assert [f.name for f in folders] == [f"best-step-{r['best']['step']:07d}"]  # one extra copy, no more
    assert r["best"]["weights"] == f"checkpoints/{folders[0].name}"
    tensors, state, manifest = checkpoints.load_checkpoint(folders[0], with_state=False)
    assert state is None and manifest["kind"] == "best" and list(manifest["files"]) == [checkpoints.MODEL_FILE]
    cfg = load_config(None, MEMORISE + ["train.keep_best=true"])
    data = prepare_data(cfg, progress=False)
    model = GPT(cfg.model, data.model_vocab_size)
    load_model_tensors(model, tensors, tied=False)
    ev = evaluate_split(model, data.splits["validation"], 32, 32, cfg.eval.batch_size, "cpu",
                        autocast_ctx("cpu", "fp32"), max_tokens=cfg.train.eval_tokens)
    assert ev["loss"] == r["best"]["loss"]  # bit for bit: the same weights through the same code
    # the final evaluation of both: the best weights score better on validation than the last ones
    assert set(r["final_best"]) == set(r["final"]) == {"validation", "test"}
    assert r["final_best"]["validation"]["loss"] < r["final"]["validation"]["loss"]
    scored = {(m["split"], m.get("weights", "last")): m["loss"] for m in runs.read_metrics(reference)
              if m["kind"] == "final"}
    assert scored == {**{(s, "last"): r["final"][s]["loss"] for s in r["final"]},
                      **{(s, "best"): r["final_best"][s]["loss"] for s in r["final_best"]}}
    full = evaluate_split(model, data.splits["test"], 32, None, cfg.eval.batch_size, "cpu", autocast_ctx("cpu", "fp32"))
    assert full["loss"] == pytest.approx(r["final_best"]["test"]["loss"], rel=1e-12)
    md = (reference / runs.REPORT_MD).read_text()
    assert f"## Final evaluation of the best weights (step {r['best']['step']})" in md


def test_eval_best_scores_the_kept_weights_as_the_final_evaluation_did(reference, tmp_path):
    from typer.testing import CliRunner

    from tiedlm.cli import app

    r = report(reference)
    out = CliRunner().invoke(app, ["eval", str(reference), "--best", "--json", "--device", "cpu"])
    assert out.exit_code == 0, out.output
    scored = json.loads(out.stdout)
    assert {s: scored[s]["loss"] for s in scored} == {s: r["final_best"][s]["loss"] for s in r["final_best"]}
    last = json.loads(CliRunner().invoke(app, ["eval", str(reference), "--json", "--device", "cpu"]).stdout)
    assert {s: last[s]["loss"] for s in last} == {s: r["final"][s]["loss"] for s in r["final"]}
    plain = train(tmp_path, "plain", "train.max_steps=10")
    out = CliRunner().invoke(app, ["eval", str(plain), "--best"])
    assert out.exit_code == 2 and "kept no best weights" in out.stderr and len(out.stderr.strip().splitlines()) == 1


def test_every_run_records_its_best_even_without_keep_best(tmp_path, reference):
    run = train(tmp_path, "plain")
    r, ref = report(run), report(reference)
    assert {k: r["best"][k] for k in ("step", "loss", "last_loss")} == {k: ref["best"][k] for k in
                                                                       ("step", "loss", "last_loss")}
    assert "weights" not in r["best"] and "final_best" not in r
    assert checkpoints.best_weight_folders(run) == []


# ------------------------------------------------------------------ resume


def test_resume_across_the_best_weights_write_is_bit_identical(tmp_path, reference):
    ref = report(reference)
    stop = ref["best"]["step"] + 2  # just after the best weights were written, before the next checkpoint
    with pytest.raises(Interrupted):
        train(tmp_path, "r", "train.keep_best=true", stop_after_step=stop)
    assert [f.name for f in checkpoints.best_weight_folders(tmp_path / "r")] == [f"best-step-{ref['best']['step']:07d}"]
    run = train(tmp_path, "r", "train.keep_best=true")
    r = report(run)
    assert r["resumed_at_steps"] == [stop]
    for key in ("best", "final", "final_best"):
        assert r[key] == ref[key], key
    assert same_tensors(tensors_of(checkpoints.best_weight_folders(run)[0]),
                        tensors_of(checkpoints.best_weight_folders(reference)[0]))
    assert same_tensors(tensors_of(checkpoints.latest_checkpoint(run)), tensors_of(checkpoints.latest_checkpoint(reference)))


def test_best_weights_written_after_the_last_checkpoint_are_redone_on_resume(tmp_path, reference):
    """A kill between a best-weights write and the next checkpoint leaves weights the checkpoint
    does not know: the resumed run must not keep them (here: deliberately wrong ones)."""
    import torch

    ref = report(reference)
    best = ref["best"]["step"]
    with pytest.raises(Interrupted):
        train(tmp_path, "k", "train.keep_best=true", stop_after_step=best - 1)  # the checkpoint before the best
    wrong = {k: torch.zeros_like(v) for k, v in tensors_of(checkpoints.latest_checkpoint(tmp_path / "k")).items()}
    checkpoints.save_best_weights(tmp_path / "k", best, wrong, {"tied": False})  # as the killed attempt left it
    run = train(tmp_path, "k", "train.keep_best=true")
    r = report(run)
    assert r["best"] == ref["best"] and r["final_best"] == ref["final_best"]
    assert [f.name for f in checkpoints.best_weight_folders(run)] == [f"best-step-{best:07d}"]  # rewritten, not beside
    assert same_tensors(tensors_of(checkpoints.best_weight_folders(run)[0]),
                        tensors_of(checkpoints.best_weight_folders(reference)[0]))


def test_damaged_kept_best_weights_refuse_the_resume_and_touch_nothing(tmp_path, reference):
    ref = report(reference)
    with pytest.raises(Interrupted):
        train(tmp_path, "m", "train.keep_best=true", stop_after_step=ref["best"]["step"] + 2)
    folder = checkpoints.best_weight_folders(tmp_path / "m")[0]
    (folder / checkpoints.MODEL_FILE).write_bytes(b"damaged")
    before = sorted(p.name for p in (tmp_path / "m" / runs.CHECKPOINTS).iterdir())
    with pytest.raises(RunError, match="does not match its SHA-256"):
        train(tmp_path, "m", "train.keep_best=true")
    assert sorted(p.name for p in (tmp_path / "m" / runs.CHECKPOINTS).iterdir()) == before


# ------------------------------------------------------------------ early stopping


def expected_stop(points: list[tuple[int, float]], patience: int, min_delta: float) -> int | None:
    """The rule, written out independently: stop at the evaluation that makes `patience` in a row
    without a loss below (the last improving loss − min_delta)."""
    ref, stale = None, 0
    for step, loss in points:
        if ref is None or loss < ref - min_delta:
            ref, stale = loss, 0
        else:
            stale += 1
            if stale >= patience:
                return step
    return None


@pytest.mark.parametrize("patience,min_delta", [(3, 0.0), (2, 0.05)])
def test_early_stopping_stops_at_the_right_evaluation(tmp_path, reference, patience, min_delta):
    points = evals(reference)
    stop = expected_stop(points, patience, min_delta)
    assert stop is not None and stop < 80
    run = train(tmp_path, "e", f"train.early_stop_patience={patience}", f"train.early_stop_min_delta={min_delta}")
    r = report(run)
    assert r["status"] == "finished" and r["steps"] == stop and r["total_steps"] == 80
    assert r["stopped_early"]["step"] == stop and r["stopped_early"]["of_steps"] == 80
    assert f"{patience} validation evaluation" in r["stopped_early"]["reason"]
    assert evals(run) == [p for p in points if p[0] <= stop]  # the same run up to there
    lrs = {m["step"]: m["lr"] for m in runs.read_metrics(reference) if m["kind"] == "train"}
    assert all(lrs[m["step"]] == m["lr"] for m in runs.read_metrics(run) if m["kind"] == "train")  # same schedule
    assert checkpoints.latest_checkpoint(run).name == f"step-{stop:07d}"
    assert set(r["final"]) == {"validation", "test"} and "final_best" not in r
    assert f"stopped early at step {stop} of 80" in (run / runs.REPORT_MD).read_text()


def test_an_early_stopped_run_resumed_from_its_last_checkpoint_trains_no_further(tmp_path, reference):
    stop = expected_stop(evals(reference), 3, 0.0)
    with pytest.raises(Interrupted):  # interrupted at the very step early stopping ended it
        train(tmp_path, "s", "train.early_stop_patience=3", stop_after_step=stop)
    run = train(tmp_path, "s", "train.early_stop_patience=3")
    r = report(run)
    assert r["status"] == "finished" and r["steps"] == stop and r["stopped_early"]["step"] == stop


def test_untie_at_best_weights_kept_while_tied_score_in_the_untied_model(tmp_path):
    """Weights kept before an untie_at split are one matrix; scoring them after the split puts it in both."""
    from tiedlm.data import prepare_data
    from tiedlm.device import autocast_ctx
    from tiedlm.evaluate import evaluate_split
    from tiedlm.model.blocks import GPT, load_model_tensors

    extra = ["model.tie_embeddings=true", "model.untie_at=0.75", "train.keep_best=true"]
    run = train(tmp_path, "u", *extra)
    r = report(run)
    assert r["best"]["step"] < r["untied_at_step"] == 60
    tensors, _, manifest = checkpoints.load_checkpoint(checkpoints.best_weight_folders(run)[0], with_state=False)
    assert manifest["tied"] is True and "lm_head.weight" not in tensors
    cfg = load_config(None, MEMORISE + extra)
    data = prepare_data(cfg, progress=False)
    model = GPT(cfg.model, data.model_vocab_size)  # tied, as it was at the best step
    load_model_tensors(model, tensors, tied=True)
    ev = evaluate_split(model, data.splits["validation"], 32, None, 16, "cpu", autocast_ctx("cpu", "fp32"))
    assert ev["loss"] == pytest.approx(r["final_best"]["validation"]["loss"], rel=1e-12)


# ------------------------------------------------------------------ the tracker alone


def test_tracker_best_min_delta_and_non_finite_losses():
    t = BestTracker()
    seq = [(1, 5.0), (2, 4.0), (3, 3.95), (4, float("nan")), (5, 3.9), (6, 3.96)]
    news = [t.observe(s, s * 10, loss, min_delta=0.1) for s, loss in seq]
    assert news == [True, True, True, False, True, False]  # the best takes any fall
    assert (t.step, t.loss) == (5, 3.9)
    assert t.stale == 4 and t.stop_loss == 4.0  # falls of 0.05 and 0.1 are not more than min_delta
    assert t.should_stop(4) and not t.should_stop(5) and not t.should_stop(0)
    assert BestTracker.from_state(json.loads(json.dumps(t.to_state()))) == t


def test_tracker_summary_states_the_overtraining_margin():
    t = BestTracker()
    for step, loss in ((10, 4.0), (20, 3.5), (30, 3.5 + math.log(1.12))):
        t.observe(step, step, loss)
    s = t.summary()
    assert s["last_above_best"] == pytest.approx(0.12) and s["overtrained"] and s["step"] == 20
    t.observe(40, 40, 3.5 + math.log(1.01))
    assert t.summary()["overtrained"] is False and BestTracker().summary() is None


# ------------------------------------------------------------------ config


def test_selection_keys_need_periodic_evaluations():
    for key in ("train.keep_best=true", "train.early_stop_patience=3"):
        with pytest.raises(ConfigError, match="train.eval_every is 0"):
            load_config(None, MEMORISE + [key, "train.eval_every=0"])
    with pytest.raises(ConfigError, match="only applies with early stopping"):
        load_config(None, MEMORISE + ["train.early_stop_min_delta=0.01"])
    with pytest.raises(ConfigError, match="must not be negative"):
        load_config(None, MEMORISE + ["train.early_stop_patience=-1"])


def test_the_new_keys_leave_older_runs_their_hash_and_resume():
    cfg = load_config(None, MEMORISE)
    old = to_dict(cfg)
    for leaf in ("keep_best", "early_stop_patience", "early_stop_min_delta"):
        del old["train"][leaf]  # a config written before these keys existed
    from tiedlm.config import from_dict

    assert config_hash(from_dict(old)) == config_hash(cfg)
    assert config_hash(cfg) == "41ab7c1512ffb7ad"  # what tiedlm computed for this config before the keys existed
    assert config_hash(load_config(None, MEMORISE + ["train.keep_best=true"])) != config_hash(cfg)


def test_with_selection_on_the_evaluation_interval_is_part_of_the_variant():
    plain = [load_config(None, MEMORISE + [f"train.eval_every={n}"]) for n in (5, 10)]
    assert config_hash(plain[0]) == config_hash(plain[1])  # operational: the same training either way
    for key in ("train.keep_best=true", "train.early_stop_patience=2"):
        a, b = (load_config(None, MEMORISE + [key, f"train.eval_every={n}"]) for n in (5, 10))
        assert config_hash(a) != config_hash(b), key  # it decides where training stops or what is kept
