"""compare_config (compare --config): training the tied and untied variants, reusing finished runs,
failures, --match params; with a fake `train` passed in (count_params_config and prepare_data
patched), and once for real on a tiny config."""

import shutil
import types
from pathlib import Path

import pytest

import tiedlm.compare as C
import tiedlm.experiment as E
from tiedlm.compare.matching import match_layers
from tests.test_compare import (
    BUDGET,
    PNG,
    TIED,
    V,
    dloss,
    edit_report,
    gpt2_params,
    make_run,
    no_nan,
    raises_exactly,
)
from tiedlm import runs as run_folder
from tiedlm.config import load_config
from tiedlm.errors import ConfigError, DivergedError, RunError
from .conftest import comparison_dir

# ------------------------------------------------------------------ compare --config


@pytest.fixture
def fake_training(monkeypatch):
    """A fake train_run (passed to compare_config) that writes a finished run folder, and refuses a
    folder holding another config the way the real one does (runs.existing_state); the parameter
    count and the data preparation patched. Records the runs trained."""
    import tiedlm.data

    calls: list[str] = []
    fail: set[str] = set()

    def train_run(cfg, out=Path("runs"), name=None, overwrite=False, progress=True, **_):
        name = name or f"{cfg.name}-s{cfg.seed}"
        run_dir = Path(out) / name
        if overwrite and run_dir.exists():
            shutil.rmtree(run_dir)
        if run_folder.existing_state(run_dir, cfg) == "finished":  # ConfigMismatchError for another config
            return run_dir
        calls.append(name)
        if name in fail:
            raise DivergedError(f"{name}: loss is nan at step 3")
        shutil.rmtree(run_dir, ignore_errors=True)
        extra_layers = cfg.model.n_layer - 2
        val = 60.0 - (1.5 if cfg.model.tie_embeddings else 0.0) - 0.7 * extra_layers + 0.4 * cfg.seed
        run = make_run(Path(out), name, cfg.seed, val=val, cfg=cfg)
        edit_report(run, flops_per_token=fake_flops(cfg.model))  # deeper costs more, as model/blocks.py counts
        return run

    monkeypatch.setattr(tiedlm.data, "prepare_data", lambda cfg, progress=True: types.SimpleNamespace(model_vocab_size=V))
    return types.SimpleNamespace(calls=calls, fail=fail, train=train_run)


def fake_flops(model_cfg) -> dict:
    """FLOPs per token, 2N forward and 6N train with N the matmul parameters (blocks and W_out)."""
    n = 12 * model_cfg.n_layer * model_cfg.n_embd ** 2 + V * model_cfg.n_embd
    return {"forward": 2 * n, "train": 6 * n}


def write_config(tmp_path: Path) -> Path:
    path = tmp_path / "tiny.yaml"
    path.write_text("name: tiny\nmodel:\n  n_layer: 2\n  n_head: 2\n  n_embd: 64\n  block_size: 64\n"
                    "train:\n  max_steps: 20\n  warmup_steps: 2\n")
    return path


def test_compare_config_trains_both_variants_and_reuses_finished_runs(tmp_path, fake_training):
    cfg_path = write_config(tmp_path)
    runs = tmp_path / "runs"
    result = E.compare_config(cfg_path, ["train.lr=2e-3"], seeds=2, match=None, runs_dir=runs, progress=False,
                              train=fake_training.train)
    # --set overrides name the runs, so they never clash with the plain config's runs
    assert fake_training.calls == ["tiny-lr=2e-3-tied-s0", "tiny-lr=2e-3-tied-s1",
                                   "tiny-lr=2e-3-untied-s0", "tiny-lr=2e-3-untied-s1"]
    assert [v.label for v in result.variants] == ["untied", "tied"]
    assert result.variant("tied").config.train.lr == 2e-3  # --set applies to every variant
    assert (comparison_dir(runs) / "comparison.md").exists()
    d = result.variant("tied").contrast("validation")
    assert d.test == "paired" and d.difference == pytest.approx(dloss([58.5, 58.9], [60.0, 60.4]))  # on the loss

    fake_training.calls.clear()
    make_run(runs, "unrelated-s0", 0, TIED + ["model.n_layer=3"])  # compares exactly its own runs
    again = E.compare_config(cfg_path, ["train.lr=2e-3"], seeds=3, match=None, runs_dir=runs, progress=False,
                             train=fake_training.train)
    assert fake_training.calls == ["tiny-lr=2e-3-tied-s2", "tiny-lr=2e-3-untied-s2"]  # seeds 0, 1 reused
    assert sorted(r.name for r in again.runs) == sorted(
        f"tiny-lr=2e-3-{t}-s{s}" for t in ("tied", "untied") for s in range(3))


def test_compare_config_seeds_offset_from_config_seed_and_failures_listed(tmp_path, fake_training):
    cfg_path = write_config(tmp_path)
    fake_training.fail.add("tiny-untied-s5")
    result = E.compare_config(cfg_path, ["seed=4"], seeds=2, match=None, runs_dir=tmp_path / "r", progress=False,
                              train=fake_training.train)
    assert fake_training.calls == ["tiny-tied-s4", "tiny-tied-s5", "tiny-untied-s4", "tiny-untied-s5"]
    assert result.train_failures == [C.TrainFailure("tiny-untied-s5", "tiny-untied-s5: loss is nan at step 3")]
    skipped = {s.name: s.reason for s in result.skipped}
    assert "loss is nan" in skipped["tiny-untied-s5"]
    assert "training failed" in C.format_terminal_table(result)
    with raises_exactly(ConfigError, match="--seeds must be positive, got 0"):
        E.compare_config(cfg_path, [], seeds=0, match=None, runs_dir=tmp_path / "r", progress=False,
                         train=fake_training.train)
    with raises_exactly(ConfigError, match="--match 'flops' is not known"):
        E.compare_config(cfg_path, [], seeds=1, match="flops", runs_dir=tmp_path / "r", progress=False,
                         train=fake_training.train)


@pytest.mark.parametrize("options, message", [
    ({"seeds": 1001}, "--seeds must be at most 1,000, got 1,001"),
    ({"seeds": "three"}, "--seeds must be a whole number or auto"),
    ({"match": "flops", "tune": ["train.lr=1e-3,2e-3"]}, "--match 'flops' is not known"),
    ({"primary": "dev"}, "--primary: 'dev' must be train, validation or test"),
    ({"select": "worst"}, "--select 'worst' is not known"),
    ({"baseline": " "}, "--baseline ' ' names no variant"),
])
def test_compare_config_checks_its_options_as_the_command_does(tmp_path, fake_training, options, message):
    """The library checks every option (the CLI only parses them), before the config is read or a run trained."""
    with raises_exactly(ConfigError, match=message):
        E.compare_config(tmp_path / "no-such.yaml", runs_dir=tmp_path / "r", progress=False,
                         train=fake_training.train, **options)
    assert fake_training.calls == [] and not (tmp_path / "r").exists()


def test_compare_runs_checks_the_baseline_before_reading_runs(tmp_path):
    with raises_exactly(ConfigError, match=r"--baseline 'a\\nb' names no variant"):
        C.compare_runs(runs_dir=tmp_path / "r", baseline="a\nb")
    assert not (tmp_path / "r").exists()


def test_compare_config_refuses_an_edited_config_until_overwrite(tmp_path, fake_training):
    """Runs of an older config are left out, never compared as the new one; --overwrite retrains them."""
    cfg_path = write_config(tmp_path)
    runs = tmp_path / "runs"
    E.compare_config(cfg_path, [], seeds=1, runs_dir=runs, progress=False, train=fake_training.train)
    cfg_path.write_text(cfg_path.read_text().replace("max_steps: 20", "max_steps: 30"))
    fake_training.calls.clear()
    with raises_exactly(RunError, match="no finished runs.*training this run failed.*different config"):
        E.compare_config(cfg_path, [], seeds=1, runs_dir=runs, progress=False, train=fake_training.train)
    assert fake_training.calls == []
    again = E.compare_config(cfg_path, [], seeds=1, runs_dir=runs, progress=False, overwrite=True,
                             train=fake_training.train)
    assert fake_training.calls == ["tiny-tied-s0", "tiny-untied-s0"] and again.train_failures == []
    assert {v.config.train.max_steps for v in again.variants} == {30}


def test_match_layers_reproduces_gpt2_small_counts():
    cfg = load_config(None, BUDGET + ["model.n_layer=12", "model.n_head=12", "model.n_embd=768",
                                      "model.block_size=1024"]).model
    m = match_layers(cfg, 50257, count=gpt2_params)
    assert m.tied_total == 124_439_808 and m.untied_total == 163_037_184  # GPT-2 small
    assert m.matched_n_layer == 17  # 38.6M saved / 7.09M per layer = 5.4 more layers
    assert abs(m.matched_total - m.untied_total) <= m.layer_params / 2
    assert m.adds_a_variant and m.note is None and "note" not in m.to_json()


def test_match_params_adds_a_tied_variant_within_one_layer_of_untied(tmp_path, fake_training):
    cfg_path = write_config(tmp_path)
    runs = tmp_path / "runs"
    result = E.compare_config(cfg_path, [], seeds=2, match="params", runs_dir=runs, progress=False,
                              train=fake_training.train)
    assert fake_training.calls[-2:] == ["tiny-tied-matched-s0", "tiny-tied-matched-s1"]
    m = result.match
    d = 64
    layer = 12 * d * d + 13 * d
    assert m.layer_params == layer and m.vocab_size == V
    assert m.untied_total - m.tied_total == V * d
    assert abs(m.matched_total - m.untied_total) <= layer
    assert m.matched_n_layer == 2 + round(V * d / layer)
    labels = sorted(v.label for v in result.variants)
    assert labels == ["tied, n_layer=2", f"tied, n_layer={m.matched_n_layer}", "untied, n_layer=2"]
    matched = result.variant(f"tied, n_layer={m.matched_n_layer}")
    assert matched.params["total"] == m.matched_total
    md = (comparison_dir(runs) / "comparison.md").read_text()
    assert "Parameter matching" in md
    assert f"{m.untied_total:,}" in md and f"{m.matched_total:,}" in md

    # parameter-matched is not compute-matched: the FLOPs are reported and the verdict says so
    untied = result.variant("untied, n_layer=2")
    more = fake_flops(types.SimpleNamespace(n_layer=m.matched_n_layer, n_embd=d))["train"] / \
        fake_flops(types.SimpleNamespace(n_layer=2, n_embd=d))["train"] - 1
    vs = matched.vs_baseline
    assert vs.parameter_matched and not vs.compute_matched
    assert vs.train_flops_relative == pytest.approx(more) and more > 0.5
    assert matched.train_flops == pytest.approx(matched.train_flops_per_token * 409_600)
    assert untied.train_flops_per_token == fake_flops(types.SimpleNamespace(n_layer=2, n_embd=d))["train"]
    verdict = matched.verdicts[0]
    assert (f"It is parameter-matched to **untied, n_layer=2** but not compute-matched: +{more * 100:.0f}% "
            "training FLOPs") in verdict
    assert "| train FLOPs/token | total train FLOPs | FLOPs vs untied |" in md
    assert f"+{more * 100:.0f}% |" in md
    # the plain tied variant: fewer parameters, the same FLOPs (the output matmul runs either way)
    plain = result.variant("tied, n_layer=2").vs_baseline
    assert not plain.parameter_matched and plain.compute_matched and "FLOPs" not in result.variant(
        "tied, n_layer=2").verdicts[0]


# ------------------------------------------------------------------ the real thing, tiny


def test_real_compare_config_end_to_end_on_a_tiny_config(tmp_path):
    """train.py, data and evaluate.py for real, on the built-in synthetic language, CPU."""
    import matplotlib.image

    cfg = tmp_path / "tiny.yaml"
    cfg.write_text("""\
name: tiny
data:
  synthetic: {vocab_size: 120, n_classes: 6, successors: 2, train_tokens: 6000, validation_tokens: 1500,
              test_tokens: 1500}
model: {n_layer: 1, n_head: 2, n_embd: 16, block_size: 16}
train: {device: cpu, dtype: fp32, batch_size: 4, max_steps: 6, warmup_steps: 1, eval_every: 3,
        eval_tokens: 256, checkpoint_every: 0, log_every: 3}
""")
    runs = tmp_path / "runs"
    result = E.compare_config(cfg, [], seeds=2, match=None, runs_dir=runs, progress=False)
    assert not result.skipped and not result.train_failures
    assert sorted(r.name for r in result.runs) == ["tiny-tied-s0", "tiny-tied-s1", "tiny-untied-s0", "tiny-untied-s1"]
    tied, untied = result.variant("tied"), result.variant("untied")
    assert untied.is_baseline and tied.contrast("validation").test == "paired"
    assert tied.params["saved_by_tying"] == tied.params["wte"] > 0
    assert untied.params["total"] - tied.params["total"] == tied.params["wte"]
    assert len(tied.curve) == 2 and tied.buckets("validation")
    out = comparison_dir(runs)
    for name in ("comparison.md", "comparison.csv", "comparison.json"):
        assert no_nan((out / name).read_text())
    for plot in C.PLOTS.values():
        assert (out / plot).read_bytes()[:8] == PNG
        assert matplotlib.image.imread(out / plot).ndim == 3
    md = (out / "comparison.md").read_text()
    assert "paired over 2 seeds" in md and "## Loss by token frequency" in md

    # the config edited: the old finished runs are refused and left out, never compared as new
    cfg.write_text(cfg.read_text().replace("max_steps: 6", "max_steps: 5"))
    with raises_exactly(RunError, match="no finished runs"):
        E.compare_config(cfg, [], seeds=1, match=None, runs_dir=runs, progress=False)
    again = E.compare_config(cfg, [], seeds=1, match=None, runs_dir=runs, progress=False, overwrite=True)
    assert not again.train_failures
    assert sorted(r.name for r in again.runs) == ["tiny-tied-s0", "tiny-untied-s0"]
    assert {v.config.train.max_steps for v in again.variants} == {5}
    # --set overrides get folders of their own, next to the plain runs
    other = E.compare_config(cfg, ["train.lr=2e-3"], seeds=1, match=None, runs_dir=runs, progress=False)
    assert sorted(r.name for r in other.runs) == ["tiny-lr=2e-3-tied-s0", "tiny-lr=2e-3-untied-s0"]
