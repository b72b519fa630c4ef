"""What the analysis measures, from a run's two matrices and its data: each matrix on its own
(norms against training frequency, anisotropy, spectrum), the pair (cosines raw and after the best
rotation, CKA, shared neighbours, drift), the direct path, and for builtin:synthetic how
asymmetric the language's true bigrams are. The geometry itself is analyze/geometry.py's."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import numpy as np

from . import geometry as g
from ..data.builtin import synthetic_language
from ..perplexity import bits_per_byte

if TYPE_CHECKING:
    from ..config import SyntheticConfig


def matrix_stats(M, counts: np.ndarray, bucket_of: np.ndarray, names: list[str], seed: int,
                 pairs: int) -> dict:
    """One matrix (V real rows): norm against training count, anisotropy, spectrum."""
    norms = g.row_norms(M).double().numpy()
    seen = counts > 0
    rho = g.spearman(norms[seen], counts[seen]) if seen.sum() > 2 else None
    by_bucket = [{"name": n, "types": int((bucket_of == b).sum()),
                  "mean_norm": float(norms[bucket_of == b].mean()) if (bucket_of == b).any() else None}
                 for b, n in enumerate(names)]
    s = g.singular_values(M)
    return {"norm_frequency_spearman": rho, "mean_norm": float(norms.mean()), "norms_by_bucket": by_bucket,
            "anisotropy": g.anisotropy(M, n_pairs=pairs, seed=seed), "singular_values": s,
            "effective_rank": g.effective_rank(s), "rank_of": min(M.shape)}


def pair_stats(E, W, bucket_of: np.ndarray, names: list[str], seed: int, sample: int, k: int = 10) -> dict:
    """E against W_out: per-token cosines raw and after the rotation that maximises their mean (by bucket), linear
    CKA, the overlap of each token's nearest neighbours, and the relative drift."""
    raw = g.pair_cosines(E, W).double().numpy()
    aligned = g.aligned_cosines(E, W).double().numpy()
    by_bucket = []
    for b, n in enumerate(names):
        sel = bucket_of == b
        by_bucket.append({"name": n, "types": int(sel.sum()),
                          "cosine": float(raw[sel].mean()) if sel.any() else None,
                          "aligned_cosine": float(aligned[sel].mean()) if sel.any() else None})
    return {"cosine": float(raw.mean()), "aligned_cosine": float(aligned.mean()), "by_bucket": by_bucket,
            "cka": g.linear_cka(E, W),
            "neighbours": g.knn_overlap(E, W, k=min(k, E.shape[0] - 1), sample=sample, seed=seed)
            if E.shape[0] > 2 else None,
            "relative_drift": g.relative_drift(E, W)}


def final_norm_args(model) -> dict:
    """The model's final norm (transformer.ln_f) as direct_path_nll's arguments: norm (its kind),
    ln_weight, ln_bias and eps, in float32. GPT-2's nn.LayerNorm is "layernorm" (its bias, or zeros
    when it has none); Llama's nn.RMSNorm is "rmsnorm" (a weight only: no mean subtracted, no
    bias). Any other module is refused rather than scored as one of them."""
    import torch
    import torch.nn as nn

    ln = model.transformer.ln_f
    if isinstance(ln, nn.LayerNorm):
        weight = ln.weight.detach().float() if ln.weight is not None else torch.ones(ln.normalized_shape)
        bias = ln.bias.detach().float() if ln.bias is not None else torch.zeros_like(weight)
        return {"norm": "layernorm", "ln_weight": weight, "ln_bias": bias, "eps": ln.eps}
    if isinstance(ln, nn.RMSNorm):
        weight = ln.weight.detach().float() if ln.weight is not None else None
        return {"norm": "rmsnorm", "ln_weight": weight, "ln_bias": None, "eps": ln.eps}
    raise TypeError(f"the direct path knows a final LayerNorm or RMSNorm, not {type(ln).__name__}")


def direct_path(model, tokens: np.ndarray, vocab: int, max_pairs: int, bytes_per_token: float | None = None) -> dict:
    """The direct path from the embedding to the head, softmax(W_out · N_f(scale · E[t])), N_f the
    model's final norm (LayerNorm for gpt2, RMSNorm for llama: final_norm_args), as a bigram model
    scored on the first max_pairs consecutive pairs of `tokens`; for an untied model also with E in
    W_out's place (W_out is the effective one: E·P or E + A·Bᵀ for the tying modes) (what tying
    would have imposed on this path); and the symmetric share of its bilinear form
    W_out · diag(γ) · Eᵀ, γ the final norm's weight (exactly 1 when tied). `final_norm` names the
    norm's kind. Given the split's bytes per token, each loss is also given in bits per byte
    (`bits_per_byte`, the pairs' predicted tokens apportioned the split's mean bytes, as the final
    evaluation apportions them), which reads across tokenizers where nats per token do not."""
    import torch

    if model.family.built_by_transformers:  # its final norm is the family's own ((1 + w) RMSNorm, post-norms, ...)
        return {"skipped": "The direct path is not measured for arch: hf: it would score the embedding through "
                           f"the final norm of {model.cfg.hf_config}, which tiedlm does not model; the matrices and "
                           "their pair above are measured as for tiedlm's own blocks."}
    t = model.transformer
    E = t.wte.weight.detach().float()
    W = model.output_weight().float()  # the effective W_out (E·P, E + A·Bᵀ for the tying modes)
    norm = final_norm_args(model)
    bias = model.get_output_embeddings().bias
    head_bias = bias.detach().float() if bias is not None else None
    ids = torch.from_numpy(np.asarray(tokens[: max_pairs + 1], dtype=np.int64))
    prev, nxt = ids[:-1], ids[1:]
    args = dict(**norm, scale=model.embed_scale, head_bias=head_bias)
    own = g.direct_path_nll(E, W, prev, nxt, **args)
    def per_byte(nll: float) -> float | None:
        return bits_per_byte(nll, bytes_per_token) if bytes_per_token else None

    out = {"pairs": own["pairs"], "distinct_prev": own["distinct_prev"], "nll": own["nll"],
           "perplexity": own["perplexity"], "bits_per_byte": per_byte(own["nll"]), "final_norm": norm["norm"],
           **{k: min(1.0, max(0.0, v)) for k, v in  # rounding can leave a tied model's 0 at -1e-8
              g.bilinear_symmetry(E[:vocab], W[:vocab], gain=norm["ln_weight"]).items()}}
    if not model.w_out_is_e:
        tied = g.direct_path_nll(E, E, prev, nxt, **args)
        out["with_e_as_w_out"] = {"nll": tied["nll"], "perplexity": tied["perplexity"],
                                  "bits_per_byte": per_byte(tied["nll"])}
    return out


def language_asymmetry(scfg: SyntheticConfig) -> dict:
    """How asymmetric the synthetic language's true bigrams are: the share of the class
    transitions that occur whose reverse never does, and the antisymmetric share of the joint
    word-bigram distribution J[a, b] = π(c_a) e_a T[c_a, c_b] e_b, computed through the classes
    (‖J‖² = Σ F_ij² s_i s_j and ⟨J, Jᵀ⟩ = Σ F_ij F_ji s_i s_j, F = diag(π) T, s_i = Σ_{a∈i} e_a²)."""
    lang = synthetic_language(scfg)
    T = lang.transitions
    allowed = T > 0
    no_reverse = float((allowed & ~allowed.T).sum() / allowed.sum())
    F = lang.stationary[:, None] * T
    s = np.zeros(lang.n_classes)
    np.add.at(s, lang.word_class, lang.emission ** 2)
    w = s[:, None] * s[None, :]
    norm2, inner = float((F * F * w).sum()), float((F * F.T * w).sum())
    flow = float((np.abs(F - F.T)).sum() / 2)  # probability mass of class pairs that flows one way
    return {"classes": lang.n_classes, "transitions": int(allowed.sum()), "without_reverse": no_reverse,
            "joint_antisymmetric_share": (norm2 - inner) / (2 * norm2), "one_way_mass": flow}


def per_token_arrays(model, vocab: int) -> tuple[Any, Any]:
    """(E, the effective W_out) restricted to the tokenizer's V rows (padding rows are never trained)."""
    E = model.get_input_embeddings().weight.detach().float()[:vocab]
    W = model.output_weight().float()[:vocab]
    return E, W


def finite(x: Any) -> Any:
    """None for nan/inf, so that analysis.json is strict JSON."""
    return x if not isinstance(x, float) or math.isfinite(x) else None
