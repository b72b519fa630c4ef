"""`tiedlm params`: the parameter and FLOP breakdown of a config, tied and untied side by side,
without training (the counts are arithmetic: instant for any size)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from ..config import Config
from .tie import Tie
from ..formatting import params_text
from .counting import count_params_config, flops_per_token


@dataclass
class ParamsReport:
    vocab_size: int  # the vocabulary counted with (padded as configured)
    vocab_source: str  # where that size came from
    tied: dict  # model.count_params_config of the tied form
    untied: dict  # ... and of the untied form
    flops_per_token: dict  # model.flops_per_token (the same for both forms)
    text: str  # the table `tiedlm params` prints
    mode: dict | None = None  # ... and of the config's own model.tie_mode (one of tie.NAMED_MODES), when set

    def to_json(self) -> dict:
        return {"vocab_size": self.vocab_size, "tied": self.tied, "untied": self.untied,
                **({"mode": self.mode} if self.mode is not None else {}),
                "flops_per_token": self.flops_per_token, "text": self.text}


def params_report(cfg: Config, vocab_size: int | None = None, use_data: bool = False) -> ParamsReport:
    """The vocabulary is, in order: `vocab_size` (--vocab-size), the real size after preparing the
    data (--data), or the tokenizer's nominal size (tokenizer.vocab_size; 257 for bytes), padded
    as configured."""

    tok = cfg.tokenizer
    if vocab_size is not None:
        V, source = vocab_size, "--vocab-size"
    elif use_data:
        from ..data import prepare_data

        V, source = prepare_data(cfg, progress=True).model_vocab_size, "the prepared data's tokenizer"
    else:
        V = 257 if tok.kind == "byte" else tok.vocab_size
        source = "tokenizer.vocab_size (the most the tokenizer may have; --data uses its real size)"
        V = cfg.model.vocab_size or -(-V // tok.pad_to_multiple) * tok.pad_to_multiple
        if cfg.model.vocab_size:
            source = "the checkpoint's vocabulary (model.init_from)"
    forms = {label: count_params_config(dataclasses.replace(cfg.model.with_tie(Tie(label)), untie_at=None), V)
             for label in ("tied", "untied")}
    m = cfg.model
    mode_label = m.tie.label  # tied, untied, projection, lowrank r=8, soft λ=0.01
    mode = count_params_config(m, V) if m.tie.stored_mode is not None else None
    if mode is not None:
        forms[mode_label] = mode
    fpt = flops_per_token(m.with_tie(Tie("tied")), V)  # tied and untied alike
    tokens = cfg.train.batch_size * m.block_size
    fmode = flops_per_token(m, V, tokens, tokens * cfg.train.grad_accum) if mode is not None else None
    t, u = forms["tied"], forms["untied"]
    saved = u["total"] - t["total"]
    spent = [] if mode is None else [
        f"{mode_label} spends {mode['lm_head']:,} parameters on W_out beside E: "
        f"{100 * mode['lm_head'] / saved:.1f}% of what untying adds"]
    # a Llama-style block's shape has more numbers (GQA's key/value heads, the SwiGLU width), and
    # no position matrix: its wpe row is 0 because positions are rotary, not because it is missing
    llama = (f" arch=llama n_kv_head={m.kv_heads} intermediate_size={m.mlp_size} (no position matrix: rotary)"
             if m.family.rotary else "")
    if m.family.built_by_transformers:  # counted on the meta device, as transformers builds it
        head = t.get("head_kind", "linear")
        sizes = " ".join(f"{key}={value}" for key, value in t.get("family_sizes", {}).items())
        llama = (f" arch=hf hf_config={m.hf_config}{' ' + sizes if sizes else ''} (built by transformers on the meta "
                 f"device; biases, norms and positions the family's own; head: "
                 f"{'a plain linear map' if head == 'linear' else head})")
    bias = "" if m.family.built_by_transformers else f" bias={m.bias}"
    text = "\n".join([
        f"{cfg.name}: n_layer={m.n_layer} n_head={m.n_head} n_embd={m.n_embd} block_size={m.block_size}"
        f"{bias}{llama} V={V:,} (from {source})", "",
        params_text(forms), "",
        f"tying saves {saved:,} parameters ({100 * saved / u['total']:.1f}% of the untied model), "
        f"{16 * saved / 2**20:,.1f} MiB of fp32 weights + gradients + AdamW moments", *spent,
        *([] if mode is None else [f"FLOPs per token (train, {mode_label}): {fmode['train']:,.0f} "
                                   f"({m.tie.cost_words(tokens, cfg.train.grad_accum)})"]),
        f"FLOPs per token (train, tied or untied): {fpt['train']:,} — tying never saves compute; "
        f"the output projection is {100 * fpt['head'] / fpt['forward']:.1f}% of the forward matmuls"])
    return ParamsReport(V, source, t, u, fpt, text, mode)


