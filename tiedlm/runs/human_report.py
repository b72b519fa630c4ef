"""report.md: a run's report.json for people (runs.RunRecord writes it beside report.json).

The tying, the parameter breakdown, the confound ledger (runs/ledger.py: what E and W_out received), the
final evaluation per split (with builtin:synthetic, the split's own floor beside the model), the
loss by frequency bucket, the best periodic evaluation and the kept best weights' scores, and the
training's cost and provenance.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..config.naming import yaml_value
from ..formatting import fmt, markdown_table, params_markdown
from .ledger import run_lines, stored_ledger

if TYPE_CHECKING:
    from . import RunReport


def _start_lines(r: RunReport) -> list[str]:
    """A pretrained start (model.init_from) and eval.also's old domain, before and after."""
    out = []
    if start := (r.params or {}).get("start"):
        kind = "a tied" if start.get("checkpoint_tied") else "an untied"
        out += [f"Started from **{start.get('init_from')}** ({kind} checkpoint): {start.get('start')}.", ""]
    if also := r.also:
        scores = [f"before {also['before']['perplexity']:.2f}"]
        scores += [f"{label} {also[k]['perplexity']:.2f}" for k, label in (("after", "after (last weights)"),
                                                                           ("after_best", "after (best weights)"))
                   if also.get(k)]
        out += [f"Also scored (eval.also), {also.get('data')}, {also.get('split')} perplexity: {', '.join(scores)}.", ""]
    return out


def _family_sizes(m: Any, params: dict) -> str:
    """What a transformers family's block is at tiedlm's size, as the built model has it: its key/value
    heads and MLP width only where its config has those fields (GPT-2's and OPT's have neither), and
    model.hf_overrides as YAML writes it."""
    sizes = params.get("family_sizes")
    sizes = sizes if isinstance(sizes, dict) else {}  # not recorded (a run of an older tiedlm): not said
    parts = ([f"{sizes['n_kv_head']} key/value heads for {m.n_head} query heads"] if "n_kv_head" in sizes else []) + \
        ([f"MLP {sizes['intermediate_size']}"] if "intermediate_size" in sizes else []) + \
        ([f"hf_overrides {yaml_value(m.hf_overrides)}"] if m.hf_overrides else [])
    return f" ({'; '.join(parts)})" if parts else ""


def render_report_md(r: RunReport) -> str:
    """report.json for people."""
    m = r.config.model if r.config is not None else None
    params = r.params or {}
    untie = f", untied at {m.untie_at} of training (step {r.untied_at_step or r.untie_step})" if m and m.untie_at else ""
    family_scale = params.get("family_embed_scale")
    scale = f"×{family_scale:.4g} (the family's own)" if isinstance(family_scale, (int, float)) else m and m.embed_scale
    # a family whose head has a bias of its own (Phi's) has one although model.lm_head_bias is false
    bias = params.get("lm_head_bias")
    own_bias = m is not None and not m.lm_head_bias and isinstance(bias, int) and bias > 0
    head_bias = "True (the family's own)" if own_bias else m and m.lm_head_bias
    tying = (f"Tying: **{m.tie.label}**{untie}; embed_scale {scale}; lm_head_bias {head_bias}; "
             if m else "Tying: unknown (its config does not load); ")
    block = ""
    if m is not None and m.family.built_by_transformers:
        block = (f"Block: **transformers' {m.hf_config}** as published (its norms, MLP, positions and head), at "
                 f"tiedlm's size{_family_sizes(m, params)}; the loss over "
                 + ("its head as a plain linear map (tiedlm's fused cross-entropy)"
                    if params.get("head_kind", "linear") == "linear" else params["head_kind"]))
    elif m is not None and m.family.summary:  # the default family's (gpt2) reports read as before
        block = (f"Block: **Llama-style** (RMSNorm, SwiGLU of {m.mlp_size}, rotary θ {m.rope_theta:g}, "
                 f"{m.kv_heads} key/value heads for {m.n_head} query heads, biases {str(m.bias).lower()})")
    lines = [f"# {r.name}", "", f"Status: **{r.status}**" + (f" — {r.error}" if r.error else ""), "",
             *([block, ""] if block else []), f"{tying}decay_embeddings {r.decay_embeddings}", "",
             *_start_lines(r)]
    if p := r.params:
        lines += ["## Parameters", "", params_markdown({"parameters": p}),
                  f"| vocabulary (tokenizer / model, padding) | {fmt(p.get('vocab_size'))} / "
                  f"{fmt(p.get('model_vocab_size'))} ({fmt(p.get('vocab_padding'))}) |", ""]
    if r.config is not None and (r.ledger is not None or r.params):
        lines += run_lines(stored_ledger(r.ledger, r.config, r.params))
    if r.final:
        lines += _final_md(r.final, r.floor)
    lines += _best_md(r)
    lines += ["## Training", "",
              f"- steps {fmt(r.steps)} of {fmt(r.total_steps)}, tokens seen {fmt(r.tokens_seen)}",
              f"- tokens/s {fmt(r.tokens_per_s, 0)}, train time {fmt(r.train_time_s, 1)} s, "
              f"wall time {fmt(r.wall_time_s, 1)} s",
              f"- peak memory {fmt((r.peak_memory_bytes or 0) / 2**20, 1)} MiB ({r.peak_memory_kind})",
              f"- device {r.device}, dtype {r.dtype}, FLOPs/token (train) {fmt((r.flops_per_token or {}).get('train'))}",
              f"- seed {r.seed}, config hash {r.config_hash}, git {r.git_commit}",
              f"- versions {r.versions}"]
    for key in ("resumed_at_steps", "interrupted_at_step", "diverged_at_step", "skipped_steps"):
        if getattr(r, key):
            lines.append(f"- {key.replace('_', ' ')}: {getattr(r, key)}")
    return "\n".join(lines) + "\n"


def _final_md(final: dict, floor: dict | None) -> list[str]:
    """The final-evaluation section of report.md: one row per split (with builtin:synthetic, the
    split's own floor beside the model, per token), then loss by bucket, by types and by mass."""
    per_split = (floor or {}).get("splits") or {}
    label = "best achievable" if (floor or {}).get("with_unk") else "floor"
    header = ["split", "tokens", "loss", "perplexity", "bits/byte", "perplexity/word"]
    header += [f"{label} loss", f"{label} perplexity", f"{label} bits/byte"] if per_split else []
    rows = []
    for split, res in final.items():
        row = [split, fmt(res["tokens"]), fmt(res["loss"], 4), fmt(res["perplexity"], 2),
               fmt(res.get("bits_per_byte"), 4), fmt(res.get("word_perplexity"), 2)]
        if per_split:
            f = per_split.get(split) or {}
            row += [fmt(f.get("nats_per_token"), 4), fmt(f.get("perplexity"), 2), fmt(f.get("bits_per_byte"), 4)]
        rows.append(row)
    lines = ["## Final evaluation", "", markdown_table(header, rows), ""]
    if floor:
        lines += [" ".join(_floor_md(floor, final)), ""]
    for key, title in (("buckets", "by types"), ("mass_buckets", "by token mass")):
        first = next((res[key] for res in final.values() if res.get(key)), None)
        if not first:
            continue
        rows = [[f"{split} loss", *(f"{fmt(b['loss'], 3)} ({fmt(b['tokens'])} tok)" for b in res.get(key, []))]
                for split, res in final.items()]
        names = [b["name"] + (f" ({100 * b['train_share']:.1f}% of train)" if "train_share" in b else "")
                 for b in first]  # markdown_table escapes <unk>, which Markdown would read as an HTML tag
        lines += [f"### Loss by training-set frequency of the target token, {title}", "",
                  markdown_table(["split", *names], rows), ""]
    if any(b["name"] == "<unk>" for res in final.values() for b in res.get("buckets", [])):
        lines += ["`<unk>` has a bucket of its own: a frequent token that stands for the rarest words.", ""]
    return lines


def _best_md(r: RunReport) -> list[str]:
    """The best periodic validation evaluation, early stopping, and the kept best weights' scores."""
    b = r.best if isinstance(r.best, dict) else None
    lines = []
    if b:
        lines += ["## Best validation evaluation", "",
                  f"- best: loss {fmt(b.get('loss'), 4)} (perplexity {fmt(b.get('perplexity'), 2)}) at step "
                  f"{fmt(b.get('step'))} ({fmt(b.get('tokens'))} tokens), of {fmt(b.get('evaluations'))} evaluations "
                  f"on the first {fmt(b.get('eval_tokens'))} validation tokens",
                  f"- last: loss {fmt(b.get('last_loss'), 4)} (perplexity {fmt(b.get('last_perplexity'), 2)}) at step "
                  f"{fmt(b.get('last_step'))}, {_pct(b.get('last_above_best'))} above the best"]
        lines.append("- **" + overtrained_text(b) + "**" if b.get("overtrained") else
                     f"- not over-trained (the flag is raised above {100 * (b.get('margin') or 0):g}%)")
    if isinstance(s := r.stopped_early, dict):
        lines.append(f"- stopped early at step {fmt(s.get('step'))} of {fmt(s.get('of_steps'))}: {s.get('reason')}")
    if lines:
        lines.append("")
    if isinstance(r.final_best, dict) and r.final_best:
        if b and b.get("final_is_last"):
            lines += ["The kept best weights are the last ones (the best evaluation is the last): their final "
                      "evaluation is the one above.", ""]
        else:
            body = _final_md(r.final_best, r.floor)[2:]  # without its heading
            lines += [f"## Final evaluation of the best weights (step {fmt(b.get('step') if b else None)})", "", *body]
    return lines


def _pct(x: Any) -> str:
    return f"{100 * x:.1f}%" if isinstance(x, (int, float)) and x == x and abs(x) != float("inf") else "—"


def overtrained_text(b: dict) -> str:
    """"over-trained: final 12.0% above best at step 500 (...)", from report.json's `best`."""
    return (f"over-trained: final {_pct(b.get('last_above_best'))} above best at step {fmt(b.get('step'))} "
            f"(validation perplexity; flagged above {100 * (b.get('margin') or 0):g}%)")


def _floor_md(floor: dict, final: dict) -> list[str]:
    """The sentences under the final-evaluation table that say what its floor columns are."""
    out = []
    per_split = floor.get("splits") or {}
    if per_split and floor.get("with_unk"):
        out.append(f"Best achievable: the true model's loss on the token stream this model sees, in which `<unk>` "
                   f"stands for the {fmt(floor.get('unk_words'))} words of the language outside the tokenizer's "
                   "vocabulary (exact, by a forward pass over the hidden classes), per token over the same targets; "
                   "no model can expect to do better on these tokens. `<unk>` is "
                   + ", ".join(f"{100 * f['unk_tokens'] / f['tokens']:.2f}% of {s}'s tokens"
                               for s, f in per_split.items() if s in final and f.get("tokens")) + ".")
    elif per_split:
        out.append("Floor: the true model's loss on each split's own tokens, per token over the same targets as the "
                   "model (end-of-text tokens cost nothing: the generator fixes where they go): what a perfect model "
                   "scores on this split.")
    if any(not f.get("per_token", True) for f in per_split.values()):
        out.append("With this tokenizer it is the text's loss over the scored tokens, the first word and a last word "
                   "cut by a token limit left out (so a hair low).")
    missing = [s for s in final if per_split and s not in per_split]
    if missing:
        out.append(f"No floor for {', '.join(missing)}: its tokens are not the generator's words in place.")
    out.append(f"The language's expected entropy rate is {fmt(floor.get('nats_per_word'), 4)} nats per word "
               f"(perplexity {fmt(floor.get('perplexity_per_word'), 2)} per word): an average over endless text, "
               "not a bound on this split.")
    return out
