"""The scaled-down recipes of the shipped family shapes: each keeps its family's block (head size,
query heads per key/value head, MLP ratio, rotary theta, no biases, tied) at a size that trains on
2 CPU cores, on the main job's protocol (its data, tuning grid and kept best weights), and builds
and trains a step."""

from pathlib import Path

import pytest

from tiedlm.config import load_config

ROOT = Path(__file__).resolve().parent.parent
PAIRS = [("smollm2-135m", "smollm2-mini"), ("llama-3.2-1b", "llama-3.2-mini")]


@pytest.mark.parametrize("full, mini", PAIRS)
def test_a_mini_recipe_keeps_its_family_s_block(full, mini):
    f = load_config(ROOT / "configs" / f"{full}.yaml").model
    m = load_config(ROOT / "configs" / f"{mini}.yaml").model
    assert m.arch == f.arch == "llama" and m.bias is f.bias is False and m.tie_embeddings and f.tie_embeddings
    assert m.n_embd // m.n_head == f.n_embd // f.n_head == 64
    assert m.n_head // m.n_kv_head == f.n_head // f.n_kv_head
    assert m.mlp_size / m.n_embd == pytest.approx(f.mlp_size / f.n_embd)
    assert (m.rope_theta, m.norm_eps) == (f.rope_theta, f.norm_eps)
    assert m.n_layer < f.n_layer and m.n_embd < f.n_embd


@pytest.mark.parametrize("mini", [m for _, m in PAIRS])
def test_a_mini_recipe_is_on_the_main_job_s_protocol_and_trains(mini, tmp_path):
    from tiedlm.train import train_run

    cfg = load_config(ROOT / "configs" / f"{mini}.yaml")
    main = load_config(ROOT / "configs" / "shakespeare.yaml")
    assert cfg.data == main.data and cfg.tokenizer == main.tokenizer and cfg.train == main.train
    assert cfg.train.keep_best and cfg.train.max_tokens // (cfg.train.batch_size * cfg.model.block_size) \
        > cfg.train.warmup_steps  # leaves its warm-up
    quick = load_config(ROOT / "configs" / f"{mini}.yaml",
                        ["train.max_steps=2", "train.warmup_steps=1", "train.eval_every=0", "train.keep_best=false",
                         "train.batch_size=2", "data.max_eval_tokens=256", "train.device=cpu"])
    run = train_run(quick, out=tmp_path, progress=False)
    assert (run / "report.json").exists()
