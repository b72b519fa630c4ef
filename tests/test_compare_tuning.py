"""compare --config with tuning: a stand-in trainer whose validation loss has a known optimum per
variant (a parabola in log lr), so that each variant's choice, the grid's extension at an edge, its
limit, resumption and the verdict on test can be checked exactly; the spec's parsing and refusals."""

import json
import math
import shutil
import struct
import types
from pathlib import Path

import pytest

import tiedlm.compare as C
import tiedlm.experiment as E
from tests.test_compare import V, make_run
from tiedlm import runs as run_folder
from tiedlm.experiment.tuning_spec import extend_value, spec_from_block, spec_from_options
from tiedlm.errors import ConfigError, Interrupted
from .conftest import comparison_dir

OPTIMUM = {True: 1e-3, False: 3e-3}  # tied, untied: each variant's own best lr


def val_ppl(tied: bool, lr: float, seed: int) -> float:
    return 50.0 * (1.0 + 0.5 * math.log(lr / OPTIMUM[tied]) ** 2) + 0.1 * seed + (0.0 if tied else 1.0)


@pytest.fixture
def stand_in(monkeypatch):
    """A train_run stand-in: a finished run folder whose validation perplexity follows val_ppl and
    whose test perplexity is `poison(cfg)` (default: validation + 1). Records what it trained."""
    import tiedlm.data

    state = types.SimpleNamespace(calls=[], poison=None, stop_after=None)

    def train_run(cfg, out=Path("runs"), name=None, overwrite=False, progress=True, **_):
        run_dir = Path(out) / name
        if run_folder.existing_state(run_dir, cfg) == "finished":
            return run_dir
        if state.stop_after is not None and len(state.calls) >= state.stop_after:
            raise Interrupted("interrupted at step 3 of 10")
        state.calls.append(name)
        shutil.rmtree(run_dir, ignore_errors=True)
        val = val_ppl(cfg.model.tie_embeddings, cfg.train.lr, cfg.seed)
        test = state.poison(cfg) if state.poison else val + 1.0
        return make_run(Path(out), name, cfg.seed, val=val, test=test, cfg=cfg)

    monkeypatch.setattr(tiedlm.data, "prepare_data", lambda cfg, progress=True: types.SimpleNamespace(model_vocab_size=V))
    state.train = train_run
    return state


def config(tmp_path: Path, tune: str = "") -> Path:
    tmp_path.mkdir(parents=True, exist_ok=True)
    path = tmp_path / "tiny.yaml"
    path.write_text("name: tiny\nmodel:\n  n_layer: 2\n  n_head: 2\n  n_embd: 64\n  block_size: 64\n"
                    "train:\n  max_steps: 20\n  warmup_steps: 2\n  lr: 3.0e-3\n  min_lr: 3.0e-4\n" + tune)
    return path


def run(tmp_path, stand_in, tune, seeds=1, **kw):
    return E.compare_config(config(tmp_path, kw.pop("block", "")), [], seeds=seeds, runs_dir=tmp_path / "runs",
                            progress=False, train=stand_in.train, tune=tune, **kw)


def chosen(c) -> dict:
    return {v.tag: v.chosen.point["train.lr"] for v in c.tuning.variants}


def test_each_variant_gets_its_own_optimum(tmp_path, stand_in):
    c = run(tmp_path, stand_in, ["train.lr=3e-4,1e-3,3e-3,1e-2"], seeds=3)
    assert chosen(c) == {"tied": 1e-3, "untied": 3e-3}
    assert all(not v.extensions and v.edge is None for v in c.tuning.variants)
    # the tuning seed's runs at the chosen values are reused; two more seeds each at the chosen value
    assert len(stand_in.calls) == 2 * 4 + 2 * 2
    assert sorted(r.name for r in c.runs) == sorted(
        [f"tiny-tied-lr=0.001-s{s}" for s in range(3)] + [f"tiny-untied-lr=0.003-s{s}" for s in range(3)])
    assert [v.label for v in c.variants] == ["untied", "tied"]  # the tuned key is not a label
    assert c.primary == "test"
    # the tuning table: validation perplexity of every point, from the stand-in's formula
    table = {(v.tag, p.point["train.lr"]): p.perplexity for v in c.tuning.variants for p in v.points}
    assert table[("tied", 3e-4)] == pytest.approx(val_ppl(True, 3e-4, 0))
    assert table[("untied", 1e-2)] == pytest.approx(val_ppl(False, 1e-2, 0))


def test_the_grid_extends_at_an_edge_until_the_choice_is_interior(tmp_path, stand_in):
    c = run(tmp_path, stand_in, ["train.lr=1e-4,3e-4"])
    tied = c.tuning.variant("tied")
    assert [p.point["train.lr"] for p in tied.points] == [1e-4, 3e-4, 9e-4, 2.7e-3]
    assert tied.chosen.point["train.lr"] == 9e-4 and tied.extensions == {"train.lr:+1": 2} and tied.edge is None
    untied = c.tuning.variant("untied")  # optimum 3e-3: 9e-4, 2.7e-3, 8.1e-3
    assert untied.chosen.point["train.lr"] == 2.7e-3 and untied.extensions == {"train.lr:+1": 3}


def test_the_extension_stops_at_its_limit_and_says_so(tmp_path, stand_in):
    c = run(tmp_path, stand_in, ["train.lr=1e-6,2e-6", "extend_limit=2"])
    for v in c.tuning.variants:
        assert v.extensions == {"train.lr:+1": 2} and v.chosen.point["train.lr"] == 8e-6
        assert "largest value tried" in v.edge and "the limit" in v.edge
    text = C.format_terminal_table(c)
    assert "Edge: train.lr 8e-06 is the largest value tried" in text


def test_without_extension_an_edge_is_reported(tmp_path, stand_in):
    c = run(tmp_path, stand_in, ["train.lr=1e-2,3e-2", "extend=false"])
    assert all(v.chosen.point["train.lr"] == 1e-2 and "smallest value tried" in v.edge and "tune.extend is off" in v.edge
               for v in c.tuning.variants)
    assert len(stand_in.calls) == 4


def test_poisoned_test_losses_never_change_a_choice(tmp_path, stand_in):
    first = chosen(run(tmp_path / "a", stand_in, ["train.lr=3e-4,1e-3,3e-3,1e-2"]))
    # test perplexity best exactly where validation is worst
    stand_in.poison = lambda cfg: 1.0 + 1e4 / val_ppl(cfg.model.tie_embeddings, cfg.train.lr, cfg.seed)
    second = chosen(run(tmp_path / "b", stand_in, ["train.lr=3e-4,1e-3,3e-3,1e-2"]))
    assert first == second == {"tied": 1e-3, "untied": 3e-3}


def test_an_interrupted_tuning_resumes_and_a_rerun_trains_nothing(tmp_path, stand_in):
    stand_in.stop_after = 3
    with pytest.raises(Interrupted):
        run(tmp_path, stand_in, ["train.lr=3e-4,1e-3,3e-3"], seeds=2)
    assert len(stand_in.calls) == 3
    stand_in.stop_after = None
    c = run(tmp_path, stand_in, ["train.lr=3e-4,1e-3,3e-3"], seeds=2)
    # 3 points each, one step past untied's edge (9e-3), a second seed at each choice; none trained twice
    assert len(stand_in.calls) == 2 * 3 + 1 + 2 and len(set(stand_in.calls)) == len(stand_in.calls)
    before = len(stand_in.calls)
    again = run(tmp_path, stand_in, ["train.lr=3e-4,1e-3,3e-3"], seeds=2)
    assert len(stand_in.calls) == before and chosen(again) == chosen(c)


def test_the_shared_value_verdict_stands_beside_the_tuned_one(tmp_path, stand_in):
    c = run(tmp_path, stand_in, ["train.lr=1e-3,3e-3,1e-2", "shared_seeds=true"], seeds=2)
    shared = c.tuning.shared
    assert shared["point"] == {"train.lr": 3e-3} and shared["seeds"] == [0, 1] and shared["split"] == "test"
    tied = lambda s: val_ppl(True, 3e-3, s) + 1.0  # noqa: E731 (the stand-in's test perplexity)
    untied = lambda s: val_ppl(False, 3e-3, s) + 1.0  # noqa: E731
    expect = math.exp(sum(math.log(tied(s) / untied(s)) for s in (0, 1)) / 2) - 1
    assert shared["relative"] == pytest.approx(expect)
    text = C.format_terminal_table(c)
    assert "At the config's own lr=0.003 for both variants: tied" in text and "each at its own best: tied" in text


@pytest.mark.figures
def test_the_schedule_keeps_its_shape_and_the_report_has_the_tuning(tmp_path, stand_in):
    c = run(tmp_path, stand_in, ["train.lr=3e-4,1e-3,3e-3,1e-2"])
    assert c.tuning.schedule == ["train.min_lr_ratio=0.1", "train.min_lr=0.0001"]
    cfg = run_folder.read_config(tmp_path / "runs" / "tiny-tied-lr=0.001-s0")
    assert cfg.train.lr == 1e-3 and cfg.train.min_lr_ratio == 0.1
    data = json.loads((comparison_dir(tmp_path / "runs") / "comparison.json").read_text())
    assert data["tuning"]["selected_on"] == "validation" and data["tuning"]["keys"] == ["train.lr"]
    assert [v["chosen"]["point"]["train.lr"] for v in data["tuning"]["variants"]] == [1e-3, 3e-3]
    assert data["tuning"]["cost"]["runs"] == 8
    png = (comparison_dir(tmp_path / "runs") / "tune_curves.png").read_bytes()
    assert png[:4] == b"\x89PNG" and min(struct.unpack(">II", png[16:24])) > 100  # drawn: width, height
    md = (comparison_dir(tmp_path / "runs") / "comparison.md").read_text()
    assert "## Each variant at its own setting" in md and "1.0e" not in md


def test_a_paired_axis_sets_its_keys_together(tmp_path, stand_in):
    block = ("tune:\n  schedule:\n    - {train.lr: 1.0e-3, train.warmup_steps: 2}\n"
             "    - {train.lr: 3.0e-3, train.warmup_steps: 4}\n")
    c = run(tmp_path, stand_in, None, block=block)
    assert {v.tag: v.chosen.point for v in c.tuning.variants} == {
        "tied": {"train.lr": 1e-3, "train.warmup_steps": 2}, "untied": {"train.lr": 3e-3, "train.warmup_steps": 4}}
    assert run_folder.read_config(tmp_path / "runs" / "tiny-untied-lr=0.003_warmup_steps=4-s0").train.warmup_steps == 4


def test_extend_value_follows_the_grids_own_step():
    assert extend_value([3e-4, 1e-3, 3e-3], 3e-3, +1) == 9e-3
    assert extend_value([3e-4, 1e-3, 3e-3], 3e-4, -1) == 9e-5
    assert extend_value([0, 100, 200], 0, -1) == -100  # not positive: the difference
    assert extend_value([64, 128], 128, +1) == 256 and isinstance(extend_value([64, 128], 128, +1), int)
    assert extend_value([1e-3], 1e-3, +1) is None


@pytest.mark.parametrize("items, message", [
    (["train.lr"], "must look like KEY=V1,V2"),
    (["train.lr="], "must look like KEY=V1,V2"),
    (["train.lrr=1e-3"], "train.lrr"),
    (["train.lr=1e-3,abc"], "must list numbers"),
    (["train.lr=1e-3,1e-3"], "repeats a value"),
    (["model.tie_embeddings=0,1"], "cannot be tuned"),
    (["seed=0,1"], "cannot be tuned"),
    (["train.lr=1e-3", "extend_limit=99"], "extend_limit"),
    (["train.lr=1e-3", "seeds=-1"], "seed"),
    (["train.lr=nan"], "must list numbers"),
    (["extend=false"], "names no setting"),
    (["train.lr=1e-3,3e-3", "train.lr=1e-2,3e-2"],
     r"--tune train.lr is given twice \(1e-3,3e-3 and 1e-2,3e-2\) — give its values once, e.g. --tune "
     r"train.lr=1e-3,3e-3,1e-2,3e-2"),
])
def test_a_bad_tune_option_is_one_line(items, message):
    with pytest.raises(ConfigError, match=message) as info:
        spec_from_options(items)
    assert "\n" not in str(info.value)


def test_the_block_and_the_options_combine():
    block = spec_from_block({"train.lr": [1e-3, 3e-3], "seeds": [1], "extend": False}, "cfg.yaml")
    spec = spec_from_options(["train.warmup_steps=2,4"], block)
    assert spec.axes == {"train.lr": [1e-3, 3e-3], "train.warmup_steps": [2, 4]} and spec.seeds == [1]
    assert spec.extend is False and spec_from_options([], block) is block
    assert spec_from_options(["train.lr=1e-2"], block).axes["train.lr"] == [1e-2]  # the block's axis replaced
    with pytest.raises(ConfigError, match="on two axes"):
        spec_from_block({"train.lr": [1e-3], "s": [{"train.lr": 1e-3, "train.warmup_steps": 1}]}, "x")


def test_tuning_refuses_validation_as_the_primary_endpoint(tmp_path, stand_in):
    with pytest.raises(ConfigError, match="verdict is on test"):
        run(tmp_path, stand_in, ["train.lr=1e-3,3e-3"], primary="validation")
    assert stand_in.calls == []


def test_when_every_variant_chooses_the_configs_own_value_the_report_says_so(tmp_path, stand_in, monkeypatch):
    monkeypatch.setitem(OPTIMUM, True, 3e-3)  # both variants' optimum is the config's lr
    c = run(tmp_path, stand_in, ["train.lr=1e-3,3e-3,1e-2"])
    assert chosen(c) == {"tied": 3e-3, "untied": 3e-3}
    assert "Every variant chose the config's own lr=0.003" in C.format_terminal_table(c)


def test_the_shared_value_verdict_pairs_the_seeds_both_variants_have_there(tmp_path, stand_in):
    # untied chooses 3e-3 (the config's own value) and trains seeds 0-2 there; tied chose 1e-3 and has
    # only its tuning seed at 3e-3: the shared verdict is on seed 0 alone, paired
    c = run(tmp_path, stand_in, ["train.lr=1e-3,3e-3,1e-2"], seeds=3)
    shared = c.tuning.shared
    assert shared["seeds"] == [0]
    expect = (val_ppl(True, 3e-3, 0) + 1.0) / (val_ppl(False, 3e-3, 0) + 1.0) - 1
    assert shared["relative"] == pytest.approx(expect)
    assert "(seed 0 only: no interval)" in C.format_terminal_table(c)


def test_n_kv_head_at_n_head_is_a_bound_not_an_edge_to_step_past(tmp_path, stand_in):
    """model.n_kv_head can be no more than model.n_head (it divides it): a choice there is final,
    said as a bound, and no step past it is tried (it used to report an edge 'beyond' n_head)."""
    trained = []

    def train(cfg, out=Path("runs"), name=None, **_):  # more key/value heads, better
        trained.append(name)
        val = {1: 60.0, 2: 50.0}[cfg.model.kv_heads] + (0.0 if cfg.model.tie_embeddings else 1.0)
        return make_run(Path(out), name, cfg.seed, val=val, cfg=cfg)

    c = E.compare_config(config(tmp_path), ["model.arch=llama", "model.bias=false"], seeds=1,
                         runs_dir=tmp_path / "runs", progress=False, train=train, tune=["model.n_kv_head=1,2"])
    for v in c.tuning.variants:
        assert v.chosen.point["model.n_kv_head"] == 2 and v.edge is None and not v.extensions
        assert v.bound == ("model.n_kv_head 2 is the highest value it can take (model.n_kv_head is at most "
                           "model.n_head, 2, and must divide it): the choice is final there")
    assert len(trained) == 4  # the grid only: n_kv_head=4 was never tried
    text = C.format_terminal_table(c)
    assert "Bound: model.n_kv_head 2 is the highest value" in text and "may lie beyond" not in text


def test_a_tuned_tie_strength_is_the_pull_variants_alone(tmp_path, stand_in):
    """--tune model.tie_strength with model.tie_mode pull: the untied variant has no strength, so it
    is trained once per seed with none (never handed the tuned value, which its config refuses), and
    its runs are named without the key; the pull variant tries each value."""
    c = E.compare_config(config(tmp_path), ["model.tie_mode=pull", "model.tie_strength=1"], seeds=2,
                         runs_dir=tmp_path / "runs", progress=False, train=stand_in.train,
                         tune=["model.tie_strength=1,10"])
    pull, untied = (c.tuning.variant(t) for t in ("pull-l1", "untied"))
    assert {1, 10} <= set(pull.axes["model.tie_strength"]) and untied.axes["model.tie_strength"] == [None]
    assert [p.label for p in untied.points] == ["(no tie_strength)"]
    untied_runs = [n for n in stand_in.calls if "untied" in n]
    prefix = "tiny-tie_mode=pull_tie_strength=1"
    assert untied_runs == [f"{prefix}-untied-s0", f"{prefix}-untied-s1"]  # the tuning run reused for seed 0
    for name in untied_runs:
        cfg = run_folder.read_config(tmp_path / "runs" / name)
        assert cfg.model.tie.label == "untied" and not cfg.model.tie.strengthened
    assert {r.name for r in c.runs} >= set(untied_runs)
