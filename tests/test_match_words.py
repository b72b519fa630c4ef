"""--match params: refused where the matched model would end untied (model.untie_at), and its
report's words true to the counts — "at equal parameters" only within PARAM_MATCH of the untied
total, no matched-variant sentence where no third variant was trained, and a step of width under
grouped-query attention named as the query heads it adds. With the fake training of
test_compare_config (GPT-2 counts by arithmetic, V = 2048)."""

from __future__ import annotations

import dataclasses

import pytest

import tiedlm.compare as C
import tiedlm.experiment as E
from tests.test_compare import V, gpt2_params, raises_exactly
from tests.test_compare_config import fake_training  # noqa: F401  (a fixture)
from tiedlm.compare.matching import PARAM_MATCH, match_layers, match_width
from tiedlm.config import load_config
from tiedlm.model.counting import count_params_config
from tiedlm.errors import ConfigError
from tiedlm.model.tie import Tie
from .conftest import comparison_dir


def _config(tmp_path, n_layer: int, n_embd: int, n_head: int = 2):
    path = tmp_path / "tiny.yaml"
    path.write_text(f"name: tiny\nmodel:\n  n_layer: {n_layer}\n  n_head: {n_head}\n  n_embd: {n_embd}\n"
                    "  block_size: 64\ntrain:\n  max_steps: 20\n  warmup_steps: 2\n")
    return path


def test_match_with_untie_at_is_refused_before_anything_is_trained(tmp_path, fake_training):  # noqa: F811
    cfg = _config(tmp_path, 2, 64)
    with raises_exactly(ConfigError, match=r"--match params grows a model that stays tied.*model\.untie_at is 0\.5"
                                           r".*drop --match, or set model\.untie_at=null"):
        E.compare_config(cfg, ["model.untie_at=0.5"], seeds=1, match="params", runs_dir=tmp_path / "runs",
                         progress=False, train=fake_training.train)
    assert fake_training.calls == [] and not (tmp_path / "runs").exists()


def test_a_match_outside_the_band_is_not_called_equal_parameters(tmp_path, fake_training):  # noqa: F811
    # d 256, one layer: tying saves V·d = 524,288, one layer holds 789,760, so the nearest tied model
    # has one more layer and 265,472 parameters more than the untied one (+14.3%)
    cfg = _config(tmp_path, 1, 256)
    runs = tmp_path / "runs"
    result = E.compare_config(cfg, [], seeds=2, match="params", runs_dir=runs, progress=False,
                              train=fake_training.train)
    m = result.match
    assert m.matched_n_layer == 2 and m.matched_total - m.untied_total == 789_760 - V * 256
    assert m.gap == pytest.approx(265_472 / m.untied_total) and m.gap > PARAM_MATCH and not m.within
    md = (comparison_dir(runs) / "comparison.md").read_text()
    verdict = result.variant("tied, n_layer=2").verdicts[0]
    for text in (verdict, md):
        assert "at equal parameters" not in text
    assert verdict.startswith("Grown tied vs untied at the nearest parameter count (+14.3%, outside the 10% "
                              "counted as equal)")
    assert "+265,472 (+14.3%) against the untied model" in md
    assert "That is outside the 10% this report counts as equal parameters" in md
    assert result.to_json()["match"]["parameter_matched"] is False


def test_a_match_within_the_band_keeps_its_name(tmp_path, fake_training):  # noqa: F811
    result = E.compare_config(_config(tmp_path, 2, 64), [], seeds=2, match="params", runs_dir=tmp_path / "runs",
                              progress=False, train=fake_training.train)
    assert result.match.within and abs(result.match.gap) <= PARAM_MATCH
    md = (comparison_dir(tmp_path / "runs") / "comparison.md").read_text()
    assert "matched tied vs untied at equal parameters" in md and "nearest parameter count" not in md


def test_no_third_variant_gets_no_matched_variant_sentence(tmp_path, fake_training):  # noqa: F811
    # d 512, one layer: V·d = 1,048,576 is less than half a layer (3,152,384): nothing to grow
    runs = tmp_path / "runs"
    result = E.compare_config(_config(tmp_path, 1, 512), [], seeds=2, match="params", runs_dir=runs,
                              progress=False, train=fake_training.train)
    assert not result.match.adds_a_variant and len(result.variants) == 2
    md = (comparison_dir(runs) / "comparison.md").read_text()
    section = md.split("## Parameter matching", 1)[1].split("\n## ", 1)[0]
    assert "The matched variant is tied with" not in section and "instead of" not in section
    assert "no third variant was trained" in section


def test_a_step_of_width_under_grouped_query_attention_is_its_query_heads():
    cfg = load_config(None, ["model.arch=llama", "model.n_head=4", "model.n_kv_head=2", "model.n_embd=64",
                             "model.n_layer=1", "model.bias=false", "train.max_steps=5"]).model
    m = match_width(cfg, V)
    tied = cfg.with_tie(Tie("tied"))
    one_step = dataclasses.replace(tied, n_embd=96, n_head=6, n_kv_head=3)
    step = count_params_config(one_step, V)["total"] - count_params_config(tied, V)["total"]
    assert m.group == 2 and m.step_params == step
    assert m.step_words() == f"one step of width, 2 query heads (32 of n_embd), adds {step:,}"
    plain = match_width(load_config(None, ["model.n_head=4", "model.n_embd=64", "model.n_layer=1",
                                             "train.max_steps=5"]).model, V)
    assert plain.step_words().startswith("one step of width, a head, adds ")
    assert match_layers(cfg, V, count=gpt2_params).step_words().startswith("one layer holds ")
