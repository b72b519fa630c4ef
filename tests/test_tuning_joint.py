"""Tuning the regularisation with the lr (lr × dropout, lr × weight decay) as an ordinary two-key
tune: the grid is the product of the axes, a step past an edge grows each axis on its own and never
leaves the key's range (dropout in [0, 1), weight decay ≥ 0), and the report reads from the tuning
runs which key moved the tied/untied effect on validation. A stand-in trainer whose validation
perplexity is a known product of a parabola in log lr and one in the other key, per variant."""

import json
import math
import shutil
import types
from pathlib import Path

import pytest

import tiedlm.compare as C
import tiedlm.experiment as E
from tests.test_compare import V, make_run
from tiedlm import runs as run_folder
from tiedlm.experiment.tuning_spec import extend_value
from tiedlm.experiment.tuning_spec import BOUNDS
from .conftest import comparison_dir

# each variant's own optimum: lr, and the other key (dropout or weight decay)
OPTIMUM = {True: {"lr": 1e-3, "reg": 0.0}, False: {"lr": 3e-3, "reg": 0.1}}


def val_ppl(tied: bool, lr: float, reg: float) -> float:
    o = OPTIMUM[tied]
    return 50.0 * (1.0 + 0.5 * math.log(lr / o["lr"]) ** 2) * (1.0 + 2.0 * (reg - o["reg"]) ** 2) + (0 if tied else 1)


@pytest.fixture
def trainer(monkeypatch):
    """train_run's stand-in: validation perplexity val_ppl(tied, lr, the key in state.reg), test one
    more; records every run it trains and the config it trained."""
    import tiedlm.data

    state = types.SimpleNamespace(calls=[], configs=[], reg="model.dropout")

    def train_run(cfg, out=Path("runs"), name=None, overwrite=False, progress=True, **_):
        run_dir = Path(out) / name
        if run_folder.existing_state(run_dir, cfg) == "finished":
            return run_dir
        state.calls.append(name)
        state.configs.append(cfg)
        shutil.rmtree(run_dir, ignore_errors=True)
        section, key = state.reg.split(".")
        val = val_ppl(cfg.model.tie_embeddings, cfg.train.lr, getattr(getattr(cfg, section), key))
        return make_run(Path(out), name, cfg.seed, val=val, test=val + 1.0, cfg=cfg)

    monkeypatch.setattr(tiedlm.data, "prepare_data", lambda cfg, progress=True: types.SimpleNamespace(model_vocab_size=V))
    state.train = train_run
    return state


def compare(tmp_path: Path, trainer, tune, block: str = "", dropout: float = 0.1, weight_decay: float = 0.1):
    tmp_path.mkdir(parents=True, exist_ok=True)
    path = tmp_path / "tiny.yaml"
    path.write_text(f"name: tiny\nmodel:\n  n_layer: 2\n  n_head: 2\n  n_embd: 64\n  block_size: 64\n  dropout: {dropout}\n"
                    f"train:\n  max_steps: 20\n  warmup_steps: 2\n  lr: 3.0e-3\n  min_lr: 3.0e-4\n  weight_decay: {weight_decay}\n" + block)
    return E.compare_config(path, [], seeds=1, runs_dir=tmp_path / "runs", progress=False, train=trainer.train,
                            tune=tune)


def ratio(a: tuple, b: tuple) -> float:
    """The effect of tied at point a vs untied at point b: the ratio of perplexities less one."""
    return val_ppl(True, *a) / val_ppl(False, *b) - 1


def neighbours_tried(v) -> bool:
    """Every chosen point has a tried neighbour on each side along each axis (or sits at a bound)."""
    for axis in v.axes:
        x = v.chosen.point[axis]
        line = {p.point[axis] for p in v.points
                if all(p.point[k] == v.chosen.point[k] for k in v.chosen.point if k != axis)}
        lo, lo_in, _, _ = BOUNDS[axis]
        if not (min(line) < x or (lo_in and x == lo)) or not max(line) > x:
            return False
    return True


def test_two_keys_tune_their_product_and_the_choice_is_read_per_key(tmp_path, trainer):
    c = compare(tmp_path, trainer, ["train.lr=3e-4,1e-3,3e-3,1e-2", "model.dropout=0,0.1,0.2"])
    for v in c.tuning.variants:  # the 4 × 3 product, no step past an edge (tied's dropout 0 is its bound)
        assert len(v.points) == 12 and v.extensions == {} and v.edge is None
    tied, untied = c.tuning.variant("tied"), c.tuning.variant("untied")
    assert tied.chosen.point == {"train.lr": 1e-3, "model.dropout": 0} and untied.chosen.point == {
        "train.lr": 3e-3, "model.dropout": 0.1}
    assert tied.bound == ("model.dropout 0 is the lowest value it can take (model.dropout is in [0, 1)): the choice is "
                          "final there")
    assert all(cfg.model.dropout >= 0 for cfg in trainer.configs)
    j = c.tuning.joint
    assert (j.variant, j.reference, j.other, j.held, j.seeds) == ("tied", "untied", "model.dropout", 0.1, [0])
    assert j.config.effect == pytest.approx(ratio((3e-3, 0.1), (3e-3, 0.1)))
    assert j.lr_alone.effect == pytest.approx(ratio((1e-3, 0.1), (3e-3, 0.1)))  # each at its best lr, dropout 0.1
    assert j.joint.effect == pytest.approx(ratio((1e-3, 0.0), (3e-3, 0.1)))
    assert j.lr_alone.labels == {"tied": "lr=0.001,dropout=0.1", "untied": "lr=0.003,dropout=0.1"}
    assert j.moved_by == "train.lr"  # the parabola in log lr is the steeper one here
    # the record in comparison.json, the text on the terminal and in comparison.md
    out = comparison_dir(tmp_path / "runs")
    record = json.loads((out / "comparison.json").read_text())["tuning"]
    assert record["joint"]["split"] == "validation" and record["joint"]["interval"] is None
    assert record["joint"]["lr_alone"]["relative"] == pytest.approx(j.lr_alone.effect)
    assert record["joint"]["moved_by"] == "train.lr" and record["config"] == {"train.lr": 3e-3, "model.dropout": 0.1}
    assert record["variants"][0]["bound"] == tied.bound
    pct = lambda x: f"{x * 100:+.1f}%".replace("-", "−")  # noqa: E731
    sentence = (f"Tuning model.dropout moved the tied/untied effect from {pct(j.lr_alone.effect)} (each at its best "
                f"lr, model.dropout 0.1) to {pct(j.joint.effect)} (the joint best); lr alone: from "
                f"{pct(j.config.effect)} (both at the config's own point) to {pct(j.lr_alone.effect)}. train.lr moved "
                "it more. These effects are on validation, the split that chose")
    text = C.format_terminal_table(c)
    assert sentence in text and "one run per point, so each is a point estimate with no interval" in text
    md = (out / "comparison.md").read_text()
    assert "### Which key moved the verdict" in md and sentence in md
    assert "| its best lr, model.dropout at 0.1 | lr=0.001,dropout=0.1 | lr=0.003,dropout=0.1 |" in md
    # two keys: a table per variant, lr down, dropout across, the choice starred
    assert "| tied (lr ↓, dropout →) | dropout=0 | dropout=0.1 | dropout=0.2 |" in md
    assert f"| lr=0.001 | {val_ppl(True, 1e-3, 0):.2f}* |" in md


def test_each_axis_grows_past_its_own_edge_and_the_lines_are_filled(tmp_path, trainer, monkeypatch):
    monkeypatch.setitem(OPTIMUM, False, {"lr": 4e-3, "reg": 0.35})
    c = compare(tmp_path, trainer, ["train.lr=1e-3,2e-3", "model.dropout=0.1,0.2"])
    untied = c.tuning.variant("untied")
    assert untied.chosen.point == {"train.lr": 4e-3, "model.dropout": 0.4} and untied.edge is None
    assert untied.extensions == {"train.lr:+1": 2, "model.dropout:+1": 2}  # 4e-3 and 8e-3; 0.4 and 0.8
    assert untied.axes == {"train.lr": [1e-3, 2e-3, 4e-3, 8e-3], "model.dropout": [0.1, 0.2, 0.4, 0.8]}
    # a step trains the line through the choice, not a row: fewer points than the product
    assert len(untied.points) < 16 and neighbours_tried(untied)
    tied = c.tuning.variant("tied")  # lr 1e-3 at its low edge: one step down; dropout down to its bound, 0
    assert tied.chosen.point == {"train.lr": 1e-3, "model.dropout": 0} and tied.edge is None
    assert tied.axes["model.dropout"] == [0, 0.1, 0.2] and "lowest value it can take" in tied.bound
    assert neighbours_tried(tied)
    j = c.tuning.joint  # the config's lr 3e-3 is off the grid: what lr alone did is not known
    assert j.config is None and j.lr_alone.at_edge == ["untied"]  # at dropout 0.1 untied's lr stops at 4e-3
    assert j.lr_alone.labels == {"tied": "lr=0.001,dropout=0.1", "untied": "lr=0.004,dropout=0.1"}
    text = C.format_terminal_table(c)
    assert "at the config's own point: not in every variant's grid" in text
    assert "lr alone: not known, as the config's own point is not in every variant's grid" in text
    assert "untied's best lr is the end of the lr values tried there" in text


def test_a_held_value_outside_the_grid_is_said(tmp_path, trainer):
    c = compare(tmp_path, trainer, ["train.lr=1e-3,3e-3,1e-2", "model.dropout=0,0.2"], dropout=0.05)
    j = c.tuning.joint
    assert j.lr_alone is None and j.config is None and j.joint.effect is not None
    text = C.format_terminal_table(c)
    assert ("The config's model.dropout 0.05 is not in every variant's grid (0, 0.2), so the tied/untied effect at "
            "each variant's best lr with model.dropout held at the config's value cannot be read") in text
    assert "| the config's own point | not in every variant's grid |" in (tmp_path / "runs/compare-tiny/comparison.md").read_text()


def test_dropout_grows_up_to_its_open_bound_never_onto_it(tmp_path, trainer, monkeypatch):
    monkeypatch.setitem(OPTIMUM, True, {"lr": 1e-3, "reg": 0.999})
    c = compare(tmp_path, trainer, ["train.lr=3e-4,1e-3,3e-3", "model.dropout=0.5,0.9", "extend_limit=2"])
    tied = c.tuning.variant("tied")
    assert tied.axes["model.dropout"] == [0.5, 0.9, 0.95, 0.975] and tied.chosen.point["model.dropout"] == 0.975
    assert "the limit (tune.extend_limit)" in tied.edge and tied.bound is None
    assert max(cfg.model.dropout for cfg in trainer.configs) < 1


def test_lr_with_weight_decay_a_block_of_two_keys(tmp_path, trainer):
    trainer.reg = "train.weight_decay"
    block = "tune:\n  train.lr: [1.0e-3, 3.0e-3, 1.0e-2]\n  train.weight_decay: [0.0, 0.1, 0.2]\n"
    c = compare(tmp_path, trainer, None, block=block)
    tied = c.tuning.variant("tied")
    assert tied.chosen.point == {"train.lr": 1e-3, "train.weight_decay": 0.0}
    assert "train.weight_decay 0.0 is the lowest value it can take (train.weight_decay is in [0, ∞))" in tied.bound
    assert all(cfg.train.weight_decay >= 0 for cfg in trainer.configs)
    j = c.tuning.joint
    assert j.other == "train.weight_decay" and j.held == 0.1
    assert j.joint.effect == pytest.approx(ratio((1e-3, 0.0), (3e-3, 0.1)))


def test_one_key_has_no_decomposition(tmp_path, trainer):
    c = compare(tmp_path, trainer, ["train.lr=1e-3,3e-3,1e-2"])
    assert c.tuning.joint is None
    assert "Which key moved" not in (tmp_path / "runs/compare-tiny/comparison.md").read_text()
    assert json.loads((tmp_path / "runs/compare-tiny/comparison.json").read_text())["tuning"]["joint"] is None


def test_extend_value_keeps_to_the_keys_range():
    dropout = BOUNDS["model.dropout"]
    assert extend_value([0.5, 0.9], 0.9, +1, False, dropout) == 0.95  # halfway to 1, which dropout cannot be
    assert extend_value([0, 0.2], 0, -1, False, dropout) is None  # 0 is the bound: nothing below
    assert extend_value([0, 0.2], 0.2, +1, False, dropout) == 0.4
    assert extend_value([0.99, 0.999], 0.999, +1, False, BOUNDS["train.beta2"]) == 0.9995  # more digits, not 1
    assert extend_value([0.5, 0.8], 0.8, +1, False, BOUNDS["train.min_lr_ratio"]) == 1.0  # 1 is allowed
    assert extend_value([2, 4], 2, -1, True, BOUNDS["model.n_layer"]) == 1
    assert extend_value([1, 2], 1, -1, True, BOUNDS["model.n_layer"]) is None
    assert extend_value([0.0, 0.1], 0.0, -1, False, BOUNDS["train.weight_decay"]) is None
    # down towards a range that starts at 0, the grid's difference, so that 0 itself is tried
    assert extend_value([0.01, 0.1], 0.01, -1, False, BOUNDS["train.weight_decay"]) == 0.0
    assert extend_value([0.3, 0.4], 0.3, -1, False, dropout) == 0.2
    assert extend_value([3e-4, 1e-3], 3e-4, -1, False, BOUNDS["train.lr"]) == 9e-5  # lr > 0: still the ratio


def test_a_step_the_config_refuses_is_said_with_its_reason(tmp_path, trainer, monkeypatch):
    monkeypatch.setitem(OPTIMUM, False, {"lr": 4.0, "reg": 0.5})
    trainer.reg = "train.weight_decay"
    c = compare(tmp_path, trainer, ["train.lr=0.25,0.5", "extend_limit=2"], weight_decay=0.5)
    untied = c.tuning.variant("untied")  # 0.5 -> 1.0 (1.0 x 0.5 < 1), then 2.0 would decay every weight to 0
    assert untied.axes["train.lr"] == [0.25, 0.5, 1.0] and untied.chosen.point["train.lr"] == 1.0
    assert "the config refuses 2.0: train.lr x train.weight_decay must be below 1" in untied.edge
    assert max(cfg.train.lr for cfg in trainer.configs) == 1.0


def test_with_a_matched_variant_the_reading_is_tied_against_untied():
    from tiedlm.compare.tuned import TunedPoint, Tuning, TuneSpec, VariantTuning

    spec = TuneSpec(axes={"train.lr": [1e-3, 3e-3], "model.dropout": [0.0, 0.1]})

    def variant(tag, best):  # validation loss 1 at its best point, 2 elsewhere; tied-matched best everywhere
        pts = [TunedPoint(point={"train.lr": lr, "model.dropout": d}, label=f"lr={lr},dropout={d}", runs={0: "r"},
                          loss=1.0 if (lr, d) == best else 2.0) for lr in (1e-3, 3e-3) for d in (0.0, 0.1)]
        v = VariantTuning(tag=tag, overrides=[], axes=dict(spec.axes), points=pts)
        v.chosen = min(pts, key=lambda p: p.loss)
        return v

    tuning = Tuning(spec=spec, keys=spec.keys, seeds=[0], selection="final weights", schedule=[],
                    variants=[variant("tied", (1e-3, 0.0)), variant("untied", (3e-3, 0.1)),
                              variant("tied-matched", (1e-3, 0.1))], config={"train.lr": 3e-3, "model.dropout": 0.1})
    j = tuning.joint
    assert (j.variant, j.reference) == ("tied", "untied")
    assert j.joint.effect == 0.0 and j.config.effect == pytest.approx(math.e - 1)  # tied 2 vs untied 1 there
    assert j.lr_alone.labels == {"tied": "lr=0.001,dropout=0.1", "untied": "lr=0.003,dropout=0.1"}
    assert j.lr_alone.effect == pytest.approx(math.e - 1) and j.moved_by == "model.dropout"


def test_the_configs_own_point_is_found_by_value_not_by_label(tmp_path, trainer, monkeypatch):
    # the config's dropout 0.0 is the grid's 0: the shared-value verdict and the config's reading find it
    monkeypatch.setitem(OPTIMUM, False, {"lr": 3e-3, "reg": 0.0})
    c = compare(tmp_path, trainer, ["train.lr=3e-4,1e-3,3e-3,1e-2", "model.dropout=0,0.2"], dropout=0.0)
    assert c.tuning.shared["point"] == {"train.lr": 3e-3, "model.dropout": 0}
    assert c.tuning.shared["label"] == "lr=0.003,dropout=0"  # the grid's own runs, reused, not trained again
    j = c.tuning.joint
    assert j.config.labels == {"tied": "lr=0.003,dropout=0", "untied": "lr=0.003,dropout=0"}
    assert j.config.effect == pytest.approx(ratio((3e-3, 0.0), (3e-3, 0.0)))
    assert j.lr_alone.effect == pytest.approx(ratio((1e-3, 0.0), (3e-3, 0.0)))
    assert len(trainer.calls) == len(set(trainer.calls)) == sum(len(v.points) for v in c.tuning.variants)
    assert j.held == 0 and isinstance(j.held, int)  # as the grid spells it
    assert ("Every variant chose the config's model.dropout 0, so tuning model.dropout moved nothing: the "
            f"tied/untied effect is {j.joint.effect * 100:+.1f}% at the joint best".replace("-", "−")) in C.format_terminal_table(c)
