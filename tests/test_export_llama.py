"""tiedlm export of model.arch: llama runs: the exported LlamaForCausalLM computes tiedlm's logits
(eager and sdpa attention, within 1e-5) for tied, untied, grouped-query (n_kv_head 2 and 1), biased,
sqrt_d (tied and untied), untie_at, padded, projection and lowrank runs; config.json says what the run
is (tie_word_embeddings, heads, widths, ε, θ); a tied export is one tensor in transformers; the
tokenizer encodes text to tiedlm's ids; greedy generation with transformers' cache picks tiedlm's
tokens; lm_head_bias is refused in one line."""

import json
import math
import subprocess
import sys

import pytest
from typer.testing import CliRunner

from tiedlm.cli import app
from tiedlm.config import load_config
from tiedlm.train import train_run

from .test_export import BASE, TEXT

transformers = pytest.importorskip("transformers")  # the hf extra; installed with dev

LLAMA = BASE + ["model.arch=llama"]
CASES = {
    "tied": [],
    "untied": ["model.tie_embeddings=false"],
    "gqa-2": ["model.n_head=4", "model.n_kv_head=2", "model.rope_theta=500000"],
    "gqa-1-untied": ["model.n_head=4", "model.n_kv_head=1", "model.tie_embeddings=false"],
    "bias": ["model.bias=true", "model.intermediate_size=48", "model.norm_eps=1e-6"],
    "sqrt-d-untied": ["model.tie_embeddings=false", "model.embed_scale=sqrt_d"],
    "sqrt-d-tied": ["model.embed_scale=sqrt_d", "model.n_head=4", "model.n_kv_head=2"],
    "untie-at": ["model.untie_at=0.5"],
    "padded": ["tokenizer.pad_to_multiple=64"],
    "projection": ["model.tie_mode=projection"],
    "lowrank": ["model.tie_mode=lowrank", "model.untie_rank=4"],
    "lowrank-sqrt-d": ["model.tie_mode=lowrank", "model.untie_rank=32", "model.embed_scale=sqrt_d"],
}
ATTENTION = ("eager", "sdpa")


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    root = tmp_path_factory.mktemp("llama-runs")
    return {name: train_run(load_config(None, LLAMA + extra), out=root, name=name, progress=False)
            for name, extra in CASES.items()}


@pytest.fixture(scope="module")
def exported(trained, tmp_path_factory):
    """Each run exported once: name -> (ExportResult, folder)."""
    from tiedlm.export import export_run

    root = tmp_path_factory.mktemp("llama-hf")
    return {name: (export_run(run, root / name), root / name) for name, run in trained.items()}


def hf_load(folder, attn="sdpa"):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(folder), local_files_only=True,
                                                attn_implementation=attn).float().eval()


def ids(rm, batch=3, length=32, seed=0):
    import torch

    return torch.randint(0, rm.data.vocab_size, (batch, length), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("name", list(CASES))
def test_llama_export_computes_tiedlms_logits(trained, exported, name):
    import torch

    from tiedlm.evaluate import load_run_model
    from tiedlm.export import summary

    result, folder = exported[name]
    assert result.verified and result.max_abs_diff <= 1e-5, result.max_abs_diff
    assert result.hf_perplexity == pytest.approx(result.tiedlm_perplexity, rel=1e-6)
    assert result.hf_class == "LlamaForCausalLM" and "as a LlamaForCausalLM" in summary(result)
    rm = load_run_model(trained[name])
    ours_model = rm.model.eval()
    tied = ours_model.is_tied and ours_model.built_tie.stored_mode is None  # a mode's W_out is written untied
    assert result.tied == tied == json.loads((folder / "config.json").read_text())["tie_word_embeddings"]
    for attn in ATTENTION:
        model = hf_load(folder, attn)
        assert type(model).__name__ == "LlamaForCausalLM" and model.config.model_type == "llama"
        same = model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
        assert same == tied  # one tensor exactly when the run was tied
        for x in (ids(rm), ids(rm, batch=2, length=7, seed=1)):  # a full block, and a shorter one
            with torch.inference_mode():
                diff = (model(input_ids=x).logits - ours_model(x)).abs().max().item()
            assert diff <= 1e-5, (attn, diff)


def test_config_json_says_what_the_run_is(trained, exported):
    from tiedlm.evaluate import load_run_model

    for name in ("gqa-2", "bias", "padded"):
        m = load_run_model(trained[name])
        c = hf_load(exported[name][1]).config
        cfg = m.cfg.model
        assert (c.hidden_size, c.num_hidden_layers, c.num_attention_heads) == (32, 2, cfg.n_head)
        assert c.num_key_value_heads == cfg.kv_heads and c.head_dim == 32 // cfg.n_head
        assert c.intermediate_size == cfg.mlp_size and c.rms_norm_eps == cfg.norm_eps
        assert c.rope_parameters["rope_theta"] == cfg.rope_theta and c.max_position_embeddings == 32
        assert c.vocab_size == m.data.model_vocab_size and c.hidden_act == "silu"
        assert c.attention_bias == c.mlp_bias == cfg.bias
        assert c.eos_token_id == c.bos_token_id == m.data.tokenizer.eot_id
    assert load_run_model(trained["gqa-2"]).cfg.model.rope_theta == 500000
    assert hf_load(exported["padded"][1]).config.vocab_size % 64 == 0
    assert hf_load(exported["bias"][1]).config.intermediate_size == 48


def test_tensors_are_under_llamas_names_split_from_the_fused_matmuls(trained, exported):
    from safetensors.torch import load_file

    from tiedlm.evaluate import load_run_model

    for name, tied, bias in (("gqa-2", True, False), ("gqa-1-untied", False, False), ("bias", True, True)):
        sd = load_file(str(exported[name][1] / "model.safetensors"))
        ours = load_run_model(trained[name]).model
        d, nh, nkv = 32, ours.cfg.n_head, ours.cfg.kv_heads
        hs, inter = d // nh, ours.cfg.mlp_size
        layer = {"self_attn.q_proj": (nh * hs, d), "self_attn.k_proj": (nkv * hs, d), "self_attn.v_proj": (nkv * hs, d),
                 "self_attn.o_proj": (d, d), "mlp.gate_proj": (inter, d), "mlp.up_proj": (inter, d),
                 "mlp.down_proj": (d, inter)}
        want = {"model.embed_tokens.weight": (ours.vocab_size, d), "model.norm.weight": (d,)}
        if not tied:
            want["lm_head.weight"] = (ours.vocab_size, d)
        for i in range(2):
            p = f"model.layers.{i}."
            want[p + "input_layernorm.weight"] = want[p + "post_attention_layernorm.weight"] = (d,)
            for key, shape in layer.items():
                want[f"{p}{key}.weight"] = shape
                if bias:
                    want[f"{p}{key}.bias"] = shape[:1]
        assert {k: tuple(v.shape) for k, v in sd.items()} == want
        c_attn = ours.transformer.h[1].attn.c_attn.weight.detach()
        assert (sd["model.layers.1.self_attn.k_proj.weight"] == c_attn[nh * hs:(nh + nkv) * hs]).all()
        gate = ours.transformer.h[0].mlp.c_fc.weight.detach()[:inter]
        assert (sd["model.layers.0.mlp.gate_proj.weight"] == gate).all()


def test_sqrt_d_is_folded_into_e_and_tied_into_the_final_norm_too(trained, exported):
    from safetensors.torch import load_file

    from tiedlm.evaluate import load_run_model

    for name, tied in (("sqrt-d-tied", True), ("sqrt-d-untied", False)):
        ours = load_run_model(trained[name]).model
        sd = load_file(str(exported[name][1] / "model.safetensors"))
        e, g = ours.transformer.wte.weight.detach(), ours.transformer.ln_f.weight.detach()
        assert (sd["model.embed_tokens.weight"] == e * math.sqrt(32)).all()
        assert (sd["model.norm.weight"] == (g / math.sqrt(32) if tied else g)).all()
        assert ("lm_head.weight" in sd) != tied
        if not tied:  # the head keeps its own, unscaled W_out
            assert (sd["lm_head.weight"] == ours.lm_head.weight.detach()).all()


def test_the_tokenizer_encodes_to_tiedlms_ids(trained, exported):
    from transformers import AutoTokenizer

    from tiedlm.evaluate import load_run_model

    tok = AutoTokenizer.from_pretrained(str(exported["tied"][1]), local_files_only=True)
    ours = load_run_model(trained["tied"]).data.tokenizer
    assert tok(TEXT, add_special_tokens=False)["input_ids"] == ours.encode(TEXT)
    assert tok.eos_token_id == ours.eot_id


@pytest.mark.parametrize("name", ["tied", "gqa-1-untied"])
def test_greedy_generation_with_transformers_cache_picks_tiedlms_tokens(trained, exported, name):
    import torch

    from tiedlm.evaluate import load_run_model

    rm = load_run_model(trained[name])
    model, ours = hf_load(exported[name][1]), rm.model.eval()
    x = ids(rm, batch=1, length=5, seed=2)
    with torch.inference_mode():
        theirs = model.generate(x, do_sample=False, max_new_tokens=12, eos_token_id=None, pad_token_id=0,
                                attention_mask=torch.ones_like(x))[0].tolist()
        seq = x[0].tolist()
        for _ in range(12):
            seq.append(int(ours(torch.tensor([seq]))[0, -1].argmax()))
    assert theirs == seq


def test_lm_head_bias_is_refused_in_one_line_exit_2(tmp_path):
    run = train_run(load_config(None, LLAMA + ["model.lm_head_bias=true", "train.max_steps=2"]), out=tmp_path,
                    name="r", progress=False)
    r = CliRunner().invoke(app, ["export", str(run), "--out", str(tmp_path / "hf")])
    assert r.exit_code == 2 and len(r.stderr.strip().splitlines()) == 1
    assert "model.lm_head_bias: LlamaForCausalLM has no bias on its head" in r.stderr
    assert not (tmp_path / "hf").exists() and not [p for p in tmp_path.iterdir() if p.name.startswith(".hf")]


def test_the_cli_exports_a_llama_run(trained, tmp_path):
    r = CliRunner().invoke(app, ["export", str(trained["gqa-2"]), "--out", str(tmp_path / "hf")])
    assert r.exit_code == 0, r.output
    assert "as a LlamaForCausalLM" in r.stdout and "max |logit difference|" in r.stdout


def test_the_export_modules_import_neither_torch_nor_transformers():
    code = ("import sys, tiedlm.export, tiedlm.export.as_llama; "
            "assert not {'torch', 'transformers'} & set(sys.modules), 'imported at module import'")
    subprocess.run([sys.executable, "-c", code], check=True)
