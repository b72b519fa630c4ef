"""model.arch: hf — transformers' own families built from their configurations, offline, tied and
untied: the tie by storage and by every config flag, the count on the meta device against the
built model and against tiedlm's own Llama-style block, training through tiedlm's loop with a
resume bit for bit, evaluation of the saved weights, the published totals of the shipped
count-only configs, and the refusals."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file

from tests.conftest import ROOT
from tiedlm.runs import checkpoints
from tiedlm.config import load_config
from tiedlm.model.counting import count_params_config
from tiedlm.errors import ConfigError, Interrupted
from tiedlm.model.blocks import build_model, count_params

pytest.importorskip("transformers")

FAMILIES = ["llama", "qwen2", "qwen3", "gemma2", "olmo2", "phi3", "gpt_neox", "mistral"]
V = 96


def cfg_for(family: str, tied: bool, *extra: str):
    return load_config(None, ["model.arch=hf", f"model.hf_config={family}", "model.n_layer=2", "model.n_embd=32",
                              "model.n_head=4", "model.block_size=16", f"model.tie_embeddings={str(tied).lower()}",
                              "train.max_steps=4", "train.warmup_steps=1", *extra])


def run_config(family: str, *extra: str):
    """A family at the smallest size on base.yaml's synthetic language, 2 steps unless `extra` says."""
    return load_config(ROOT / "configs" / "base.yaml",
                       ["model.arch=hf", f"model.hf_config={family}", "model.n_layer=1", "model.n_embd=32",
                        "model.n_head=2", "model.block_size=16", "tokenizer.vocab_size=128", "train.max_steps=2",
                        "train.warmup_steps=1", "train.batch_size=4", "train.eval_every=0",
                        "data.synthetic.train_tokens=4000", "data.synthetic.validation_tokens=600",
                        "data.synthetic.test_tokens=600", "train.device=cpu", "train.threads=1", *extra])


@pytest.mark.parametrize("tied", [True, False])
@pytest.mark.parametrize("family", FAMILIES)
def test_each_family_builds_tied_or_untied_and_counts_on_the_meta_device(family, tied):
    cfg = cfg_for(family, tied)
    torch.manual_seed(0)
    model = build_model(cfg.model, V)
    assert model.is_tied is tied and all(f is tied for f in __import__("tiedlm.model.hf_config", fromlist=["x"])
                                         .config_flags_tied(model.hf.config))
    model.check_tie(tied)
    built = count_params(model)
    meta = count_params_config(cfg.model, V)
    for key in ("total", "wte", "lm_head", "non_embedding", "saved_by_tying"):
        assert meta[key] == built[key], key
    assert built["total"] == sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())
    assert built["wte"] == V * 32 and built["lm_head"] == (0 if tied else V * 32)
    x, y = torch.randint(0, V, (2, 8)), torch.randint(0, V, (2, 8))
    loss = model(x, y)
    loss.backward()
    per_token = model(x, y, reduction="none")
    assert per_token.shape == (2, 8) and per_token.mean().item() == pytest.approx(loss.item(), rel=1e-5)
    if model.head_kind == "linear":  # the fused loss over the head equals the family's own logits' loss
        ref = torch.nn.functional.cross_entropy(model.hf(input_ids=x).logits.reshape(-1, V), y.reshape(-1))
        assert loss.item() == pytest.approx(ref.item(), rel=1e-5)


def test_the_soft_capped_head_is_trained_on_the_family_s_own_logits():
    model = build_model(cfg_for("gemma2", True).model, V)
    assert model.head_kind.startswith("the family's own logits (final-logit soft-capping at 30")
    x, y = torch.randint(0, V, (2, 8)), torch.randint(0, V, (2, 8))
    ref = torch.nn.functional.cross_entropy(model.hf(input_ids=x).logits.reshape(-1, V), y.reshape(-1))
    assert model(x, y).item() == pytest.approx(ref.item(), rel=1e-6)


def test_the_llama_family_counts_as_tiedlm_s_own_llama_block():
    """The same Llama shape built both ways, tied and untied: the same parameters."""
    for tied in (True, False):
        hf = count_params_config(cfg_for("llama", tied, "model.n_kv_head=2").model, V)
        own = load_config(None, ["model.arch=llama", "model.n_layer=2", "model.n_embd=32", "model.n_head=4",
                                 "model.n_kv_head=2", "model.block_size=16", f"model.tie_embeddings={str(tied).lower()}",
                                 "train.max_steps=4"]).model
        assert hf["total"] == count_params_config(own, V)["total"]


@pytest.mark.parametrize("config, total, tied_published", [("qwen2.5-0.5b", 494_032_768, True),
                                                           ("gemma-2-2b", 2_614_341_888, True),
                                                           ("olmo-2-1b", 1_484_916_736, False)])
def test_the_shipped_count_only_configs_give_the_published_totals(config, total, tied_published):
    from tiedlm.model.params_report import params_report

    report = params_report(load_config(ROOT / "configs" / f"{config}.yaml"))
    assert (report.tied if tied_published else report.untied)["total"] == total


@pytest.mark.parametrize("family", ["qwen2", "gemma2", "gpt_neox"])
def test_a_family_trains_through_tiedlm_s_loop_and_resumes_bit_for_bit(family, tmp_path, monkeypatch):
    from tiedlm.evaluate import evaluate_run
    from tiedlm.train import train_run

    monkeypatch.setenv("TIEDLM_CACHE", str(tmp_path / "cache"))
    cfg = run_config(family, "train.max_steps=6", "train.checkpoint_every=2", "model.untie_at=0.5")
    run, weights = resumes_bit_for_bit(cfg, tmp_path)
    assert "hf.lm_head.weight" in weights  # untied at step 3, so W_out is stored
    report = json.loads((run / "report.json").read_text())
    assert report["status"] == "finished" and report["untied_at_step"] == 3 and report["params"]["tied"] is True
    again = evaluate_run(run, splits=["test"])
    assert again["results"]["test"]["loss"] == pytest.approx(report["final"]["test"]["loss"], rel=1e-6)
    _exports_and_reloads(run, tmp_path / "export", tied=False)


def resumes_bit_for_bit(cfg, tmp_path):
    """A run trained whole, and the same run stopped at step 3 and resumed, end with the same
    weights bit for bit. Returns (the resumed run's folder, its final weights)."""
    from tiedlm.train import train_run

    ref = train_run(cfg, out=tmp_path / "a", progress=False)
    with pytest.raises(Interrupted):
        train_run(cfg, out=tmp_path / "b", progress=False, stop_after_step=3)
    run = train_run(cfg, out=tmp_path / "b", progress=False)
    a = load_file(str(checkpoints.latest_checkpoint(ref) / checkpoints.MODEL_FILE))
    b = load_file(str(checkpoints.latest_checkpoint(run) / checkpoints.MODEL_FILE))
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k
    return run, b


def _exports_and_reloads(run, folder, tied: bool) -> None:
    """tiedlm export writes the family's own folder; transformers reloads it with the run's logits,
    the tie by storage and by flag, and the safetensors keys a tied or untied model should have."""
    from safetensors import safe_open
    from transformers import AutoModelForCausalLM

    from tiedlm.export import export_run

    result = export_run(run, folder)
    assert result.verified and result.tied is tied and result.max_abs_diff <= 1e-4
    hf = AutoModelForCausalLM.from_pretrained(str(folder))
    assert (hf.get_output_embeddings().weight is hf.get_input_embeddings().weight) is tied
    assert hf.config.tie_word_embeddings is tied
    E, W = (m.weight.detach() for m in (hf.get_input_embeddings(), hf.get_output_embeddings()))
    with safe_open(str(folder / "model.safetensors"), "pt") as f:  # by value: names differ by family and version
        matrices = [k for k in f.keys() if any(torch.equal(f.get_tensor(k), m) for m in (E, W))]
    assert len(matrices) == (1 if tied else 2), matrices  # E once when tied; E and W_out when not


def test_a_tied_family_exports_tied(tmp_path, monkeypatch):
    from tiedlm.train import train_run

    monkeypatch.setenv("TIEDLM_CACHE", str(tmp_path / "cache"))
    cfg = run_config("olmo2")
    _exports_and_reloads(train_run(cfg, out=tmp_path / "runs", progress=False), tmp_path / "export", tied=True)


@pytest.mark.parametrize("overrides, message", [
    (["model.hf_config=qwen2", "model.bias=true"], "model.bias is the family's own under model.arch: hf"),
    (["model.hf_config=qwen2", "model.dropout=0.1"], "model.dropout is the family's own"),
    (["model.n_kv_head=2"], "model.arch: hf needs model.hf_config"),
    (["model.hf_config=qwen2", "model.rope_theta=500000"], "model.rope_theta applies to Llama-style blocks only"),
])
def test_what_the_family_sets_itself_is_refused_in_one_line(overrides, message):
    with pytest.raises(ConfigError, match=message) as info:
        load_config(None, ["model.arch=hf", "train.max_steps=2", *overrides])
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("overrides, message", [
    (["model.hf_config=gpt_neox", "model.n_kv_head=1"], "model.n_kv_head does not apply to gpt_neox"),
    (["model.hf_config=no_such_family"], "'no_such_family' is not a transformers model_type"),
    (["model.hf_config=qwen2", "model.hf_overrides={nonsense_field: 1}"], "nonsense_field is not a field of qwen2"),
    (["model.hf_config=qwen2", "model.hf_overrides={hidden_size: 8}"], "hidden_size is set by tiedlm's own key"),
    (["model.hf_config=gemma2", "model.tie_mode=lowrank", "model.untie_rank=4"],
     r"model.tie_mode lowrank builds W_out from E for a plain linear head, and this family's logits are not one "
     r"\(final-logit soft-capping at 30\) — use tied, untied, soft or pull \(or model.untie_at\) on this family"),
])
def test_what_the_family_cannot_take_is_refused_when_built(overrides, message):
    cfg = load_config(None, ["model.arch=hf", "model.n_head=2", "model.n_embd=32", "train.max_steps=2", *overrides])
    with pytest.raises(ConfigError, match=message):
        count_params_config(cfg.model, V)


def test_a_local_config_json_names_the_family(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "qwen2", "rms_norm_eps": 1e-6}))
    cfg = load_config(None, ["model.arch=hf", f"model.hf_config={tmp_path}", "model.n_layer=1", "model.n_embd=32",
                             "model.n_head=2", "train.max_steps=2"])
    model = build_model(cfg.model, V)
    assert type(model.hf).__name__ == "Qwen2ForCausalLM" and model.hf.config.rms_norm_eps == 1e-6


@pytest.mark.parametrize("key", ["torch_dtype", "dtype"])
def test_a_config_json_s_dtype_does_not_set_the_weights_precision(tmp_path, key):
    """A published config.json names the checkpoint's dtype (Llama 3.2's says bfloat16): built from
    it, the weights are float32 as for a model_type, and train.dtype alone decides the precision,
    as the report states (they were bf16 while it said fp32)."""
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "qwen2", key: "bfloat16"}))
    cfg = load_config(None, ["model.arch=hf", f"model.hf_config={tmp_path}", "model.n_layer=1", "model.n_embd=32",
                             "model.n_head=2", "train.max_steps=2"])
    assert {p.dtype for p in build_model(cfg.model, V).parameters()} == {torch.float32}


def test_the_run_report_names_the_family_and_how_its_loss_is_taken(tmp_path, monkeypatch):
    from tiedlm.train import train_run

    monkeypatch.setenv("TIEDLM_CACHE", str(tmp_path / "cache"))
    cfg = run_config("gemma2")
    run = train_run(cfg, out=tmp_path / "runs", progress=False)
    report = json.loads((run / "report.json").read_text())
    assert report["params"]["head_kind"].startswith("the family's own logits (final-logit soft-capping at 30")
    md = (run / "report.md").read_text()
    assert "Block: **transformers' gemma2** as published" in md and "the loss over the family's own logits" in md


def test_the_run_report_gives_only_the_sizes_the_family_has(tmp_path, monkeypatch):
    """report.md said '2 key/value heads for 2 query heads, MLP 128' for GPT-2, whose config has
    neither field (its MLP is 4·d: 192 here), printed model.hf_overrides as a Python dict, and
    'lm_head_bias False' for Phi, whose head has a bias of its own."""
    from tiedlm.train import train_run

    monkeypatch.setenv("TIEDLM_CACHE", str(tmp_path / "cache"))
    run = train_run(run_config("gpt2", "model.n_embd=48", "model.hf_overrides={layer_norm_epsilon: 1.0e-6}"),
                    out=tmp_path / "runs", name="gpt2", progress=False)
    md = (run / "report.md").read_text()
    assert ("Block: **transformers' gpt2** as published (its norms, MLP, positions and head), at tiedlm's size "
            "(hf_overrides {layer_norm_epsilon: 1.0e-06}); the loss over") in md
    assert json.loads((run / "report.json").read_text())["params"]["family_sizes"] == {}
    run = train_run(run_config("gpt_neox", "model.n_embd=48"), out=tmp_path / "runs", name="neox", progress=False)
    assert "at tiedlm's size (MLP 128); the loss over" in (run / "report.md").read_text()  # its intermediate_size
    run = train_run(run_config("phi", "model.tie_embeddings=false"), out=tmp_path / "runs", name="phi", progress=False)
    md = (run / "report.md").read_text()
    assert "lm_head_bias True (the family's own)" in md and "head bias yes" in md


def test_analyze_and_sample_read_a_family_s_run(tmp_path, monkeypatch):
    """analyze measures E and W_out (the family's input and output embeddings) and says why the
    direct path is not measured; sample generates from the run."""
    from tiedlm.analyze import analyze_run
    from tiedlm.generate import SampleOptions, sample_run
    from tiedlm.train import train_run

    monkeypatch.setenv("TIEDLM_CACHE", str(tmp_path / "cache"))
    cfg = run_config("qwen2", "model.tie_embeddings=false")
    run = train_run(cfg, out=tmp_path / "runs", progress=False)
    result = analyze_run(run, out=tmp_path / "analysis")
    assert result["tied"] is False and "W_out" in result["matrices"] and result["pair"]["tied"] is False
    assert result["direct_path"]["skipped"].startswith("The direct path is not measured for arch: hf")
    assert "## The direct path" in (tmp_path / "analysis" / "analysis.md").read_text()
    out: list[str] = []
    sample_run(run, SampleOptions(max_new_tokens=8, seed=0), out.append, lambda _: None)
    assert "".join(out).strip() != ""


def test_hf_overrides_is_one_key_of_the_variant(tmp_path):
    """A mapping value is one leaf of the config's dotted view: the hash, labels and twins see
    model.hf_overrides whole, and two different overrides are two variants."""
    from tiedlm.config.identity import config_hash, flat

    a = cfg_for("llama", True, "model.hf_overrides={rms_norm_eps: 1.0e-5}")
    b = cfg_for("llama", True, "model.hf_overrides={rms_norm_eps: 1.0e-6}")
    assert flat(a)["model.hf_overrides"] == {"rms_norm_eps": 1e-5}
    assert config_hash(a) != config_hash(b) and config_hash(a) != config_hash(cfg_for("llama", True))



def counted_forward_flops(model, V: int, T: int) -> float:
    """torch's FLOP counter over one forward pass of T tokens, per token. Attention runs on SDPA's
    math kernel, whose products the counter sees (it has no formula for the CPU's fused kernel)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.utils.flop_counter import FlopCounterMode

    with sdpa_kernel(SDPBackend.MATH), FlopCounterMode(display=False) as counter, torch.no_grad():
        model(torch.randint(0, V, (1, T)))
    return counter.get_total_flops() / T


@pytest.mark.parametrize("family", ["llama", "qwen2", "mistral", "olmo2"])
def test_torch_s_flop_counter_gives_tiedlm_s_forward_flops(family):
    """FLOPs per token from tiedlm's arithmetic (counting.flops_per_token, on the layers' matmul
    weights taken from the model on the meta device) against torch's FLOP counter over one forward
    pass of block_size tokens of the built model: every matmul, attention's two products over the
    full T x T as both count them, and the head."""
    from tiedlm.model.counting import flops_per_token

    cfg = cfg_for(family, True, "model.n_kv_head=2")
    model = build_model(cfg.model, V).eval()
    assert counted_forward_flops(model, V, cfg.model.block_size) == flops_per_token(cfg.model, V)["forward"]


def test_torch_s_flop_counter_gives_tiedlm_s_flops_for_its_own_llama_block():
    """The same check on tiedlm's own Llama-style block of that shape: the arithmetic both share."""
    from tiedlm.model.counting import flops_per_token

    cfg = load_config(None, ["model.arch=llama", "model.n_layer=2", "model.n_embd=32", "model.n_head=4",
                             "model.n_kv_head=2", "model.block_size=16", "train.max_steps=4", "train.warmup_steps=1"])
    model = build_model(cfg.model, V).eval()
    assert counted_forward_flops(model, V, 16) == flops_per_token(cfg.model, V)["forward"]


@pytest.mark.parametrize("family, extra, message", [
    ("bert", [], "bert is not a causal language model: its logits at a position change with the tokens after it"),
    ("gemma3", [], "gemma3 keeps its language model in a nested config \\(text_config\\)"),
    ("qwen2", ["model.hf_overrides={dtype: bfloat16}"], "dtype would set the weights' precision behind train.dtype"),
    ("qwen2", ["model.hf_overrides={torch_dtype: float16}"], "torch_dtype would set the weights' precision"),
    ("qwen2", ["model.hf_overrides={rms_norm_eps: abc}"], "qwen2 cannot be built with these settings"),
    ("qwen2", ["model.hf_overrides={hidden_act: nonexistent}"], "qwen2 cannot be built with these settings"),
    ("falcon", [], "falcon cannot be built with these settings \\(AttributeError: property 'head_dim'"),
    ("gptj", [], "gptj cannot be built with these settings"),
    ("t5", [], "t5 cannot be built with these settings"),
])
def test_a_family_or_override_that_cannot_train_here_is_one_line(family, extra, message, capfd):
    """User errors that raised from inside transformers (exit 1, a traceback) or trained the wrong
    thing (an encoder, a nested config's defaults, bf16 weights reported as fp32) are one line."""
    cfg = load_config(ROOT / "configs" / "base.yaml", ["model.arch=hf", f"model.hf_config={family}", "model.n_layer=1",
                                                       "model.n_embd=32", "model.n_head=2", "model.bias=false", *extra])
    with pytest.raises(ConfigError, match=message):
        build_model(cfg.model, 300)
    assert "{" not in capfd.readouterr().err  # transformers' own log of the config stays quiet


def test_a_head_that_is_not_linear_is_found_on_the_built_model_when_its_fields_do_not_say_so():
    """recurrent_gemma soft-caps its logits without the field the other families name it by: the
    built model's logits against its final hidden state × W_out tell, and the modes that need a
    plain linear head are refused for it as for Gemma 2."""
    base = ["model.arch=hf", "model.n_layer=1", "model.n_embd=32", "model.n_head=2", "model.bias=false"]
    found = build_model(load_config(ROOT / "configs" / "base.yaml", [*base, "model.hf_config=recurrent_gemma"]).model, 300)
    assert found.head_kind.startswith("the family's own logits (measured on the built model")
    plain = build_model(load_config(ROOT / "configs" / "base.yaml", [*base, "model.hf_config=qwen2"]).model, 300)
    assert plain.head_kind == "linear" and plain.unlike_linear == 0.0
    with pytest.raises(ConfigError, match="lowrank builds W_out from E for a plain linear head.*measured on the built"):
        build_model(load_config(ROOT / "configs" / "base.yaml", [*base, "model.hf_config=recurrent_gemma",
                                                               "model.tie_mode=lowrank", "model.untie_rank=4"]).model, 300)


def test_a_mixture_of_experts_counts_the_flops_of_the_experts_a_token_is_routed_to():
    """mixtral keeps its experts as 3-D tensors: a token multiplies by num_experts_per_tok of them
    (2 of 8 by default), so its matmul weights per token are mistral's at the same sizes with the
    MLP taken twice, plus the router (one d-vector per expert)."""
    from tiedlm.model.counting import flops_per_token

    def matmul(family):
        cfg = load_config(ROOT / "configs" / "base.yaml", ["model.arch=hf", f"model.hf_config={family}",
                                                           "model.n_layer=1", "model.n_embd=32", "model.n_head=2",
                                                           "model.bias=false"])
        return flops_per_token(cfg.model, 512)["non_head_matmul_params"], cfg.model.mlp_size

    dense, mlp = matmul("mistral")
    mlp_weights = 3 * 32 * mlp  # gate, up and down
    assert matmul("mixtral")[0] == dense - mlp_weights + 2 * mlp_weights + 8 * 32


def test_a_family_that_scales_e_itself_has_that_scale_in_its_record_ledger_and_report(tiny, tmp_path, monkeypatch):
    """Gemma multiplies E's rows by √d inside its embedding: the run's params, ledger and report.md
    say so (they said 1)."""
    from tiedlm.train import train_run

    monkeypatch.setenv("TIEDLM_CACHE", str(tmp_path / "cache"))
    cfg = tiny("model.arch=hf", "model.hf_config=gemma2", "model.bias=false", "train.max_steps=2",
               "train.warmup_steps=1", "train.eval_every=0")
    run = train_run(cfg, out=tmp_path / "runs", progress=False)
    report = json.loads((run / "report.json").read_text())
    assert report["params"]["family_embed_scale"] == pytest.approx(cfg.model.n_embd ** 0.5, rel=1e-5)
    scale = f"{cfg.model.n_embd ** 0.5:.4g}"
    assert report["ledger"]["embed_scale"] == f"×{scale}, the family's own"
    assert f"embed_scale ×{scale} (the family's own)" in (run / "report.md").read_text()


@pytest.mark.parametrize("family, field, weight", [("opt", "ffn_dim", "fc1"), ("gpt2", "n_inner", "c_fc")])
def test_the_mlp_width_follows_tiedlm_s_size_where_a_family_names_it_otherwise(family, field, weight):
    """OPT's ffn_dim is 3072 at any width: a d = 32 model had a 96·d MLP while tiedlm's sizes said
    otherwise. It is 4·d (OPT's published ratio) unless model.intermediate_size sets it, as GPT-2's
    n_inner is (None: the family's own 4·d)."""
    base = ["model.arch=hf", f"model.hf_config={family}", "model.n_layer=1", "model.n_embd=32", "model.n_head=2"]

    def width(*extra):
        model = build_model(load_config(ROOT / "configs" / "base.yaml", [*base, *extra]).model, V)
        (w,) = [p for n, p in model.named_parameters() if f"{weight}.weight" in n]
        assert count_params(model)["total"] == count_params_config(model.cfg, V)["total"]  # the count follows
        return max(w.shape), model.hf.config

    assert width()[0] == 4 * 32
    wide, config = width("model.intermediate_size=48")
    assert wide == 48 and getattr(config, field) == 48


def test_an_override_written_as_published_configs_write_it_is_a_number(tmp_path):
    """rms_norm_eps: 1e-6, as published configs write it: PyYAML reads an exponent without a dot as
    the string '1e-6', which transformers kept, and the first forward pass failed on it."""
    (tmp_path / "c.yaml").write_text("model:\n  arch: hf\n  hf_config: qwen2\n  hf_overrides: {rms_norm_eps: 1e-6}\n"
                                     "  n_layer: 1\n  n_embd: 32\n  n_head: 2\ntrain:\n  max_steps: 2\n")
    for cfg in (load_config(tmp_path / "c.yaml", []),
                load_config(None, ["model.arch=hf", "model.hf_config=qwen2", "model.n_layer=1", "model.n_embd=32",
                                   "model.n_head=2", "train.max_steps=2",
                                   "model.hf_overrides={rms_norm_eps: 1e-6, hidden_act: silu}"])):
        assert cfg.model.hf_overrides["rms_norm_eps"] == 1e-6
        model = build_model(cfg.model, V)
        assert model.hf.config.rms_norm_eps == 1e-6 and torch.isfinite(model(torch.zeros(1, 4, dtype=torch.long))[0]).all()
