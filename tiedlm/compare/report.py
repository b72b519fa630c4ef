"""A Comparison as text: comparison.md (one function per section), comparison.csv,
comparison.json and the table printed after a comparison (the sentences are verdicts.py's).
Numbers, sizes and tables are formatted by tiedlm.formatting, as everywhere else."""

from __future__ import annotations

import csv
import io
import math
import re
from typing import Any

from ..formatting import (
    MISSING,
    fmt,
    fmt_count,
    fmt_int,
    fmt_seconds,
    fmt_signed,
    format_bytes,
    markdown_table,
    p_only,
    percent,
    text_table,
)
from .collect import COMPARISON_JSON
from .comparison import Comparison, RunRow
from .datasets import OTHER_DATA, OTHER_START
from .matching import PARAM_MATCH
from .plots import (
    MATCHED_PLOT,
    PLOTS,
    TYING_LINE_PLOT,
    TYING_MAP_BUCKETS_PLOT,
    TYING_MAP_PLOT,
    bucket_split,
    captions,
)
from .stats import GeometricSummary, Summary, TestResult
from .adaptation import adaptation_lines, adaptation_markdown
from .tying_line import mechanism_markdown
from .sections import (
    ledger_markdown,
    sequential_lines,
    sequential_markdown,
    trajectory_lines,
    trajectory_markdown,
    tuning_lines,
    tuning_markdown,
)
from .variants import SPLITS, SplitContrast, Variant
from .verdicts import decay_line, family_markdown, fmt_flops, plural, roles, test_words
from ..files import json_text

FILES = {"markdown": "comparison.md", "csv": "comparison.csv", "json": COMPARISON_JSON,
         **{f"plot_{k}": v for k, v in PLOTS.items()}}
TITLE = "# tiedlm comparison"  # comparison.md's first line




# ============================================================================ pieces


def _mean_sd(s: Summary, digits: int = 2) -> str:
    if s.mean is None:
        return MISSING
    if s.sd is None:
        return fmt(s.mean, digits)
    return f"{fmt(s.mean, digits)} ± {fmt(s.sd, digits)}"


def _ci(s: Summary | GeometricSummary, digits: int = 2) -> str:
    if s.ci_low is None:
        return "one seed: no interval" if s.n == 1 else MISSING
    return f"{fmt(s.ci_low, digits)} – {fmt(s.ci_high, digits)}"


def _effect_ci(d: TestResult, digits: int = 2) -> str:
    """The interval of a split contrast as percentages, or why there is none."""
    if d.ci_low is None:
        return "no interval"
    return f"{percent(d.relative_ci_low, digits)} to {percent(d.relative_ci_high, digits)}"


def _nats_ci(d: TestResult) -> str:
    return "no interval" if d.ci_low is None else f"{fmt_signed(d.ci_low, 4)} to {fmt_signed(d.ci_high, 4)}"


def _detectable(d: SplitContrast) -> str:
    """The smallest detectable decrease and increase and the seeds the observed effect needs, at
    the spread's upper confidence bound (at the observed one where there is no spread to bound)."""
    pw = d.power
    if pw is None or pw.mde_relative is None:
        return MISSING
    bounded = pw.mde_relative_upper is not None
    down, up = (pw.mde_relative_down_upper, pw.mde_relative_upper) if bounded else (pw.mde_relative_down,
                                                                                    pw.mde_relative)
    seeds = pw.seeds_needed_upper if bounded else pw.seeds_needed
    need = f"{seeds}" if seeds is not None else MISSING
    return f"{percent(-down)} / {percent(up)} / {need}"


# ============================================================================ comparison.md


def runs_line(c: Comparison) -> str:
    """How many runs are compared, of how many the command trained (compare --config: every run it
    trained or found finished, its tuning's included) or found: "4 runs compared of 12 trained"."""
    n = sum(v.n_seeds for v in c.variants)
    if c.trained is None:
        return f"{plural(n, 'finished run')} compared"
    line = f"{n} run{'s' if n != 1 else ''} compared of {c.trained} trained"
    rest = c.trained - n
    if rest > 0 and c.tuning is not None:
        line += f" (the other {rest} are the tuning's: see *Each variant at its own setting*)"
    return line


def _md_intro(c: Comparison) -> list[str]:
    if c.mode == "matched":
        how = ("no single baseline: each tied variant is contrasted with the untied variant identical in every "
               "other key (pass --baseline to compare every variant with one)")
    else:
        how = f"baseline **{c.baseline_label}** ({c.baseline_reason})"
    md = [TITLE, "",
          f"{runs_line(c)}, in {plural(len(c.variants), 'variant')}; {how}. "
          f"Written by tiedlm {c.tiedlm_version} on {c.created}."]
    md += ["", f"**{c.protocol.split(':', 1)[0]}:**{c.protocol.split(':', 1)[1]}"] if c.protocol else []
    md += [line for w in c.warnings for line in ("", f"**Warning:** {w}")]
    md += ["", selection_line(c)]
    if c.differing_keys:
        md += ["", "The variants differ in: " + ", ".join(f"`{k}`" for k in c.differing_keys) + "."]
    if c.not_compared:
        n_other, start = len(c.not_compared), _from_other_start(c)
        md += ["", f"Only variants trained on the baseline's data{', from its start,' if start else ''} are "
                   f"compared: the runs came from {c.data_sets} data sets{' or starts' if start else ''}, and "
                   f"{plural(n_other, 'variant')} {OTHER_DATA}{' or from another start' if start else ''} "
                   f"{'are' if n_other != 1 else 'is'} listed under *Not compared*."]
    return md


def selection_line(c: Comparison) -> str:
    """Which weights are compared, and why; with the best ones, why the verdict is on test."""
    if c.select == "best":
        return (f"Weights compared: each run's best validation evaluation (`--select best`: {c.select_reason}). "
                f"Validation chose those weights, so their validation scores are biased low: the verdict is on "
                f"**{c.primary}**.")
    over = sum(1 for r in c.runs if r.overtrained)
    extra = f" {plural(over, 'run')} ended over-trained: see the notes." if over else ""
    return f"Weights compared: each run's last weights (`--select final`: {c.select_reason}).{extra}"


def _md_verdict(c: Comparison) -> list[str]:
    md = ["", "## Verdict", ""]
    if c.verdicts:
        md += [roles(c) + " Effects are ratios of perplexities, exp(Δloss) − 1, with 95% intervals computed on the "
               "loss (nats per token) across seeds; lower is better.", ""]
        for v in c.variants:
            md += [("- " if i == 0 else "  - ") + line for i, line in enumerate(v.verdicts)]
    elif len(c.variants) == 1:
        md.append("- Only one variant: nothing to compare against. Train another (for example "
                  "`tiedlm compare --config CONFIG`, which trains both tied and untied).")
    if any(v.n_seeds == 1 for v in c.variants):
        md.append("- Some variants have a single seed: no confidence interval or p-value can be given for "
                  "them. Use `--seeds 3` or more.")
    decay = decay_line(c)
    return md + (["", decay] if decay else [])


def _md_matched(c: Comparison) -> list[str]:
    if not c.matched:
        return []
    rows = []
    for m in c.matched:
        d = m.split(c.primary)
        rows.append([m.label, fmt(d.variant_mean) if d else MISSING, fmt(d.baseline_mean) if d else MISSING,
                     percent(d.relative) if d else MISSING, _effect_ci(d) if d else MISSING,
                     p_only(d.p_value) if d else MISSING, str(d.seeds) if d else MISSING,
                     percent(m.embedding_share, 1).lstrip("+") if m.embedding_share is not None else MISSING])
    unmatched = [v.label for v in c.variants if v.tied and v.vs_baseline is None]
    md = ["", f"## Tying effect per setting ({c.primary})", "",
          "Each tied variant against the untied variant identical in every other key: the effect is exp(Δloss) − 1 "
          "(negative: tying is better) with its 95% interval and p-value; `V·d share` is the embedding matrix's "
          "share of the untied model's parameters.", "",
          markdown_table(["setting", "tied ppl", "untied ppl", "tying effect", "95% CI", "p", "seeds", "V·d share"],
                         rows, "lrrrrrrr"), "", f"![tying effect per setting]({MATCHED_PLOT})"]
    if unmatched:
        md += ["", "No untied variant with the same settings (not contrasted): " + "; ".join(unmatched) + "."]
    if c.tying_line is not None:
        md += ["", f"### The tying line over {c.tying_line.short}", "", f"![the tying line]({TYING_LINE_PLOT})", "",
               "The settings' effects (Δloss, nats) fitted as a line in log2 of the key by weighted least squares, and "
               "where it crosses zero, with Fieller's 95% interval:", "", *(f"- {x}" for x in c.tying_line.lines()),
               *mechanism_markdown(c.tying_line)]
    return md + (c.tying_map.markdown(TYING_MAP_PLOT, TYING_MAP_BUCKETS_PLOT) if c.tying_map is not None else [])


def _md_match(c: Comparison) -> list[str]:
    m = c.match
    if not m:
        return []
    md = ["", f"## Parameter matching (--match {m.option})", "",
          f"The untied model has {fmt_int(m.untied_total)} parameters and the tied one {fmt_int(m.tied_total)}."]
    if not m.adds_a_variant:  # no third variant: say why, and nothing of a matched model
        md[-1] += f" {m.note[0].upper()}{m.note[1:]}."
    else:
        md[-1] += (f" The matched variant is tied with {m.grown()} ({m.step_words()}), for "
                   f"{fmt_int(m.matched_total)} parameters: "
                   f"{m.matched_total - m.untied_total:+,} ({m.gap:+.1%}) against the untied model.".replace("-", "−")
                   + f" Parameter-matched is not compute-matched: its extra "
                     f"{'layers' if m.by == 'depth' else 'width'} cost FLOPs on every token.")
        if not m.within:
            md += ["", f"That is outside the {PARAM_MATCH:.0%} this report counts as equal parameters: the "
                       f"smallest step ({m.step_words()}) is too coarse here, so its contrast is named the "
                       "nearest parameter count, not equal parameters."]
    untied = next((v for v in c.variants if v.tied is False), None)
    ref = untied.train_flops if untied else None
    rows = [[v.name, fmt_int(v.params.get("total")), fmt_flops(v.train_flops_per_token), fmt_flops(v.train_flops),
             percent(v.train_flops / ref - 1.0, 0) if v.train_flops is not None and ref else MISSING]
            for v in c.variants]
    return md + ["", markdown_table(["variant", "parameters", "train FLOPs/token", "total train FLOPs",
                                     "FLOPs vs untied"], rows, "lrrrr")] + family_markdown(c)


def _present_splits(c: Comparison) -> list[str]:
    return [s for s in SPLITS if any(s in v.metrics for v in c.variants)]


def _floor_line(c: Comparison) -> list[str]:
    """builtin:synthetic: each split's own floor (the true model's loss on its tokens) where the
    runs recorded it, and the language's expected rate, which is an average, not a bound."""
    floor = next((v.floor for v in c.variants if v.floor), None)
    if not floor:
        return []
    splits = floor.get("splits") or {}
    parts = [f"{name} {fmt(sf.get('perplexity'))} ({sf.get('label') or 'split floor'}"
             + (f", {sf['unk_tokens']:,} `<unk>` token{'s' if sf['unk_tokens'] != 1 else ''})" if sf.get("unk_tokens")
                else ")") for name, sf in splits.items()]
    own = ("The true model's perplexity on each split's own tokens (with `<unk>`, which merges the rarest words, the "
           f"best achievable one): {', '.join(parts)}. " if parts else "")
    return ["", own + f"The language's expected entropy rate is {fmt(floor.get('perplexity_per_word'))} perplexity "
                "per word: an average over endless text, not a bound on a finite split."]


def _md_results(c: Comparison) -> list[str]:
    md = ["", "## Results", "",
          "Everything is computed on the loss (mean NLL, nats per token) across seeds. Perplexity is exp(mean loss), "
          "the geometric mean over seeds, and its 95% interval is exp() of the Student-t interval of the mean loss "
          "(mean ± t(0.975, n−1)·sd/√n) — where the average run of this variant would land, not the range of "
          "single runs. Lower is better.", ""]
    present = _present_splits(c)
    header = ["variant", "seeds"]
    for s in present:
        header += [f"{s} perplexity", "95% CI", f"{s} loss ± SD", f"{s} bits/byte"]
    rows = []
    for v in c.variants:
        row = [v.name, str(v.n_seeds)]
        for s in present:
            m = v.split(s)
            row += ([fmt(m.perplexity.mean), _ci(m.perplexity), _mean_sd(m.loss, 4), _mean_sd(m.bits_per_byte, 4)]
                    if m else [MISSING] * 4)
        rows.append(row)
    return md + [markdown_table(header, rows)] + _floor_line(c)


def _md_differences(c: Comparison) -> list[str]:
    others = [v for v in c.variants if v.vs_baseline]
    if not others:
        return []
    md = ["", "## Contrasts", "",
          "Each variant against its reference (variant − reference), tested on the per-seed loss: paired t-test "
          "when both have the same seeds, Welch's t-test otherwise. `effect` is exp(Δloss) − 1 (negative: the "
          "variant is better) with exp(CI) − 1 bounds; `Δ ppl` (difference of the geometric means) is descriptive "
          "only. `detectable / seeds` is the smallest decrease and increase the seeds run detect with 80% power at α = 0.05, and "
          "the seeds per variant that would resolve the observed one, both with the seed-to-seed spread taken at its "
          "one-sided 80% upper confidence bound (the verdict gives them at the observed spread too).", ""]
    rows = []
    for v in others:
        for s in _present_splits(c):
            d = v.contrast(s)
            if d is None or d.difference is None:
                continue
            role = "primary" if s == c.primary else "confirmation"
            how = test_words(d) if d.test and d.ci_low is not None else d.note or MISSING
            rows.append([v.label, v.vs_baseline.baseline, f"{s} ({role})", percent(d.relative), _effect_ci(d),
                         fmt_signed(d.difference, 4), _nats_ci(d), p_only(d.p_value),
                         fmt_signed(d.perplexity_difference), _detectable(d) if s == c.primary else "", how])
    md.append(markdown_table(["variant", "vs", "split", "effect", "95% CI", "Δ loss", "95% CI (nats)", "p",
                              "Δ ppl", "detectable / seeds", "test"], rows, "lllrrrrrrrl"))
    return md


def _bucket_cell(c: Comparison, v: Variant, split: str, name: str) -> str:
    """Mean ± SD of a bucket's loss; for a contrasted variant, its difference and Holm-adjusted p."""
    m = v.split(split)
    b = m.bucket(name) if m else None
    if not b or b.loss.mean is None:
        return MISSING
    cell = _mean_sd(b.loss, 3)
    test = v.vs_baseline.bucket(split, name) if v.vs_baseline else None
    if test is not None and test.difference is not None:
        cell += f" ({fmt_signed(test.difference, 3)}" + (f", Holm p={p_only(test.p_holm)}" if test.p_holm is not None
                                                           else "") + ")"
    return cell


def _md_buckets(c: Comparison) -> list[str]:
    split = bucket_split(c)
    names = c.bucket_names(split)
    if not names:
        return []
    shown = {}  # each bucket as the last variant that has it reports it (for its token count)
    for v in c.variants:
        shown.update({b.name: b for b in v.buckets(split)})
    header = ["variant"] + [f"{n} ({fmt_count(shown[n].tokens)} token{'s' if shown[n].tokens != 1 else ''})"
                            if shown[n].tokens else n for n in names]
    rows = [[v.name] + [_bucket_cell(c, v, split, n) for n in names] for v in c.variants]
    diffs = [[v.label, n, fmt_signed(t.difference, 4), _nats_ci(t), p_only(t.p_value), p_only(t.p_holm)]
             for v in c.variants if v.vs_baseline for n, t in v.vs_baseline.splits.get(split).buckets.items()
             if t.difference is not None] if any(v.vs_baseline and split in v.vs_baseline.splits
                                                for v in c.variants) else []
    md = ["", f"## Loss by token frequency ({split}, secondary)", "",
          "Mean loss in nats per token of each frequency bucket (vocabulary ranked by training-set count), ± SD "
          "over seeds; in brackets the difference from the reference and its Holm-adjusted p-value. The weight-tying "
          "literature expects tying to help rare tokens most. These are secondary: read them for where an effect "
          "comes from, not as separate verdicts.", "", markdown_table(header, rows)]
    if diffs:
        md += ["", "Per-bucket differences (variant − reference, nats per token), each with its own 95% interval; "
                   "`Holm p` adjusts the p-values over the buckets of one contrast.", "",
               markdown_table(["variant", "bucket", "Δ loss", "95% CI", "p", "Holm p"], diffs, "llrrrr")]
    return md


def _md_params(c: Comparison) -> list[str]:
    rows = []
    for v in c.variants:
        p = v.params
        rel = v.vs_baseline.params_relative if v.vs_baseline else None
        rows.append([v.name, *(fmt_int(p.get(k)) for k in ("total", "wte", "lm_head", "wpe", "non_embedding",
                                                           "saved_by_tying")),
                     MISSING if rel is None else percent(rel, 1)])
    return ["", "## Parameters", "",
            "Unique parameters. `lm_head` counts W_out's extra parameters (0 when it is E); "
            "`saved by tying` is V·d, also 16 bytes each of AdamW training memory in fp32.", "",
            markdown_table(["variant", "total", "wte (E)", "lm_head (W_out)", "wpe", "non-embedding",
                            "saved by tying", "vs reference"], rows)]


def _md_cost(c: Comparison) -> list[str]:
    rows = []
    for v in c.variants:
        cost = {k: s.mean for k, s in v.cost.items()}
        rows.append([v.name, fmt_int(cost["tokens_per_s"]), fmt_seconds(cost["wall_time_s"]),
                     format_bytes(cost["peak_memory_bytes"] or None),  # 0: not measured
                     fmt_count(cost["tokens_seen"]), fmt_int(cost["steps"]), fmt_flops(v.train_flops_per_token),
                     fmt_flops(v.train_flops), v.resolution or MISSING])
    return ["", "## Cost", "",
            "Means over seeds. Tying saves parameters and memory, never FLOPs: the output matmul runs either way. "
            "Training FLOPs are per token × tokens seen; `device` is the device type and dtype the runs resolved to.",
            "", markdown_table(["variant", "tokens/s", "wall time", "peak memory", "tokens seen", "steps",
                                "train FLOPs/token", "train FLOPs", "device"], rows, "lrrrrrrrl")]


MATRIX_COLUMNS = (("pair_cosine", "cosine e_t·w_t", 3), ("aligned_cosine", "after rotation", 3), ("cka", "CKA", 3),
                  ("norm_frequency_spearman", "E norm–frequency ρ", 3), ("direct_path_nll", "direct path loss", 3),
                  ("direct_path_nll_e_as_w_out", "with W_out := E", 3), ("direct_path_bpb", "direct path bits/byte", 3),
                  ("direct_path_bpb_e_as_w_out", "with W_out := E, bits/byte", 3), ("symmetric_share", "symmetric share", 3))


def _md_matrices(c: Comparison) -> list[str]:
    """What tiedlm analyze found in the runs' two matrices, mean ± SD over the seeds analysed."""
    shown = [v for v in c.variants if v.matrices]
    if not shown:
        return []
    rows = [[v.name, str(next(iter(v.matrices.values())).n),
             *(_mean_sd(v.matrices[k], d) if v.matrices[k].n else "—" for k, _, d in MATRIX_COLUMNS)] for v in shown]
    return ["", "## What the matrices show", "",
            "From `tiedlm analyze` of each run's final checkpoint (the last weights), mean ± SD over seeds. Tied runs "
            "have one matrix: cosine, CKA and symmetric share are 1 by construction. The direct path is "
            "softmax(W_out · LN_f(E[t])) (LN_f the final norm: LayerNorm, or RMSNorm for llama), the model without its layers, a bigram model, scored on validation; "
            "\"with W_out := E\" is the same path forced to use E, what tying would have imposed on it. See each "
            "run's analysis.md.", "",
            markdown_table(["variant", "seeds", *(h for _, h, _ in MATRIX_COLUMNS)], rows, "lr" + "r" * len(MATRIX_COLUMNS))]


def _md_plots(c: Comparison) -> list[str]:
    return ["", "## Plots", "",
            f"![validation perplexity against tokens seen]({PLOTS['curve']})", "",
            f"![{c.primary} perplexity against parameter count]({PLOTS['params']})", "",
            f"![{bucket_split(c)} loss by frequency bucket]({PLOTS['buckets']})"]


IMAGE = re.compile(r"!\[[^\]]*\]\(([^)]+)\)")  # a figure in comparison.md, on a line of its own


def _captioned(lines: list[str], c: Comparison) -> list[str]:
    """Every figure with its caption (plots.captions) on the line after next: what is drawn, on
    which split, which weights."""
    text = captions(c)
    out: list[str] = []
    for line in lines:
        out.append(line)
        image = IMAGE.fullmatch(line)
        if image and image.group(1) in text:
            out += ["", f"*{text[image.group(1)]}*"]
    return out


def _md_runs(c: Comparison) -> list[str]:
    rows = [[r.name, r.variant, str(r.seed), fmt(r.validation_perplexity), fmt(r.test_perplexity),
             fmt(r.validation_loss, 4), fmt_int(r.params_total), fmt_seconds(r.wall_time_s), _best_cell(r)]
            for r in c.runs]
    return ["", "## Runs", "",
            markdown_table(["run", "variant", "seed", "validation ppl", "test ppl", "validation loss",
                            "parameters", "wall time", "weights (best step; last vs best)"], rows, "lllrrrrrl")]


def _best_cell(r: RunRow) -> str:
    if r.best_step is None:
        return r.weights
    above = "" if r.last_above_best is None else f"; {percent(r.last_above_best, 1)}"
    return f"{r.weights} ({fmt_int(r.best_step)}{above})"


def _from_other_start(c: Comparison) -> bool:
    """Whether a variant is not compared because it was trained from another start than the baseline's."""
    return any(n.reason.startswith(OTHER_START) for n in c.not_compared)


def _md_left_aside(c: Comparison) -> list[str]:
    """Not compared (other data), left out, and notes."""
    md = []
    if c.not_compared:
        start = _from_other_start(c)
        md += ["", f"## Not compared ({OTHER_DATA}{' or from another start' if start else ''})", "",
               "Runs trained or evaluated on other tokens than the baseline's (another data source, split, "
               "tokenizer or evaluation set)" + (", or trained from another start (model.init_from's weights or "
                                                  "config, or model.hf_config's file, replaced or edited between "
                                                  "runs)," if start else "") +
               " are never contrasted with it. Compare them among themselves, "
               "for example with `--baseline` set to one of them.", ""]
        md += [f"- **{n.variant}** ({', '.join(f'`{r}`' for r in n.runs)}): {n.reason}" for n in c.not_compared]
    if c.skipped:
        md += ["", "## Left out", ""] + [f"- `{s.path}`: {s.reason}" for s in c.skipped]
    if c.notes:
        md += ["", "## Notes", ""] + [f"- {n}" for n in c.notes]
    return md


def to_markdown(c: Comparison) -> str:
    sections = (_md_intro(c) + _md_verdict(c) + sequential_markdown(c) + _md_matched(c) + tuning_markdown(c)
                + trajectory_markdown(c) + _md_match(c)
                + _md_results(c) + _md_differences(c) + ledger_markdown(c) + (adaptation_markdown(c.adaptation, c.primary) if c.adaptation else [])
                + _md_buckets(c) + _md_matrices(c)
                + _md_params(c) + _md_cost(c)
                + _md_plots(c) + _md_runs(c)
                + _md_left_aside(c))
    return "\n".join(_captioned(sections, c) + [""])


# ============================================================================ comparison.csv


def _csv_columns(splits: list[str], bucket_names: list[str], primary: str) -> list[str]:
    """The columns, the later additions last (so that a reader by position keeps its columns);
    `match_role` and PRIMARY_p_holm are a --match comparison's (its two contrasts, Holm over the two on
    the primary split), empty in the other rows."""
    cols = ["row_type", "variant", "run", "seeds", "n_seeds", "config_hash"]
    for s in splits:
        cols += [f"{s}_perplexity", f"{s}_perplexity_ci_low", f"{s}_perplexity_ci_high", f"{s}_loss",
                 f"{s}_loss_sd", f"{s}_bits_per_byte", f"{s}_bits_per_byte_sd"]
    cols += [f"validation_loss[{n}]" for n in bucket_names]
    cols += ["params_total", "params_wte", "params_lm_head", "params_wpe", "params_non_embedding",
             "params_saved_by_tying", "tokens_per_s", "wall_time_s", "peak_memory_bytes", "tokens_seen",
             "steps", "train_flops_per_token", "train_flops", "device", "dtype", "is_baseline", "reference"]
    for s in splits:
        cols += [f"{s}_effect", f"{s}_effect_ci_low", f"{s}_effect_ci_high", f"{s}_loss_diff",
                 f"{s}_loss_diff_ci_low", f"{s}_loss_diff_ci_high", f"{s}_p_value", f"{s}_test",
                 f"{s}_perplexity_diff", f"{s}_detectable_effect", f"{s}_seeds_needed"]
    return cols + ["params_relative_change", "train_flops_relative_change", "weights", "best_step",
                   "last_above_best", "reason", "path", "match_role", f"{primary}_p_holm",
                   *(f"{s}_{k}" for s in splits for k in ("significant", "detectable_decrease")),
                   *(f"{s}_{k}" for s in splits for k in ("detectable_effect_upper", "detectable_decrease_upper",
                                                          "seeds_needed_upper"))]


def _csv_contrast(s: str, d: SplitContrast) -> dict[str, Any]:
    return {f"{s}_effect": d.relative, f"{s}_effect_ci_low": d.relative_ci_low,
            f"{s}_effect_ci_high": d.relative_ci_high, f"{s}_loss_diff": d.difference,
            f"{s}_loss_diff_ci_low": d.ci_low, f"{s}_loss_diff_ci_high": d.ci_high, f"{s}_p_value": d.p_value,
            f"{s}_test": d.test, f"{s}_significant": d.significant, f"{s}_perplexity_diff": d.perplexity_difference,
            f"{s}_detectable_effect": d.power.mde_relative if d.power else None,
            f"{s}_detectable_decrease": d.power.mde_relative_down if d.power else None,
            f"{s}_seeds_needed": d.power.seeds_needed if d.power else None,
            f"{s}_detectable_effect_upper": d.power.mde_relative_upper if d.power else None,
            f"{s}_detectable_decrease_upper": d.power.mde_relative_down_upper if d.power else None,
            f"{s}_seeds_needed_upper": d.power.seeds_needed_upper if d.power else None}


def _csv_variant(v: Variant) -> dict[str, Any]:
    row: dict[str, Any] = {"row_type": "variant", "variant": v.label, "seeds": " ".join(map(str, v.seeds)),
                           "n_seeds": v.n_seeds, "config_hash": v.config_hash, "is_baseline": v.is_baseline,
                           "reference": v.vs_baseline.baseline if v.vs_baseline else None}
    for s, m in v.metrics.items():
        p = m.perplexity
        row.update({f"{s}_perplexity": p.mean, f"{s}_perplexity_ci_low": p.ci_low, f"{s}_perplexity_ci_high": p.ci_high,
                    f"{s}_loss": m.loss.mean, f"{s}_loss_sd": m.loss.sd, f"{s}_bits_per_byte": m.bits_per_byte.mean,
                    f"{s}_bits_per_byte_sd": m.bits_per_byte.sd})
        d = v.contrast(s)
        if d:
            row.update(_csv_contrast(s, d))
    for b in v.buckets("validation"):
        row[f"validation_loss[{b.name}]"] = b.loss.mean
    for k in ("total", "wte", "lm_head", "wpe", "non_embedding", "saved_by_tying"):
        row[f"params_{k}"] = v.params.get(k)
    row.update({k: s.mean for k, s in v.cost.items()})
    row.update(train_flops_per_token=v.train_flops_per_token, train_flops=v.train_flops, device=" ".join(v.device),
               dtype=" ".join(v.dtype))
    if v.vs_baseline:
        row.update(params_relative_change=v.vs_baseline.params_relative,
                   train_flops_relative_change=v.vs_baseline.train_flops_relative)
    return row


def _csv_run(r: RunRow) -> dict[str, Any]:
    row = {"row_type": "run", "variant": r.variant, "run": r.name, "seeds": r.seed, "n_seeds": 1,
           "config_hash": r.config_hash, "path": r.path, "params_total": r.params_total, "device": r.device,
           "dtype": r.dtype, "tokens_per_s": r.tokens_per_s, "wall_time_s": r.wall_time_s,
           "peak_memory_bytes": r.peak_memory_bytes, "tokens_seen": r.tokens_seen, "steps": r.steps,
           "weights": r.weights, "best_step": r.best_step, "last_above_best": r.last_above_best}
    for s in SPLITS:
        row.update({f"{s}_{k}": r.metric(s, k) for k in ("perplexity", "bits_per_byte", "loss")})
    row.update({f"validation_loss[{n}]": loss for n, loss in r.buckets.get("validation", {}).items()})
    return row


def _cell(x: Any) -> Any:
    return "" if x is None or (isinstance(x, float) and not math.isfinite(x)) else x


def to_csv(c: Comparison) -> str:
    """One row per variant, one per run, one per run not compared (other data) and one per run left
    out; the row_type column tells them apart."""
    cols = _csv_columns(_present_splits(c), c.bucket_names("validation"), c.primary)
    rows = [_csv_variant(v) for v in c.variants] + [_csv_run(r) for r in c.runs]
    for m in c.family.members if c.family is not None else []:
        row = next(r for r in rows if r["variant"] == m.label)
        row.update({"match_role": m.role, f"{c.family.split}_p_holm": m.p_holm})
    rows += [{"row_type": "not_compared", "variant": n.variant, "run": name, "seeds": seed, "reason": n.reason,
              "path": path} for n in c.not_compared for name, seed, path in zip(n.runs, n.seeds, n.paths)]
    rows += [{"row_type": "skipped", "run": s.name, "reason": s.reason, "path": s.path} for s in c.skipped]
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=cols, lineterminator="\n")
    writer.writeheader()
    for row in rows:
        writer.writerow({col: _cell(row.get(col)) for col in cols})
    return buf.getvalue()


def to_json_text(c: Comparison) -> str:

    return json_text(c.to_json(), indent=2) + "\n"


# ============================================================================ the terminal


SHORT = {"validation": "val", "test": "test", "train": "train"}


def _terminal_row(c: Comparison, v: Variant) -> list[str]:
    m = v.split(c.primary)
    ppl = m.perplexity if m else GeometricSummary(n=0)
    d = v.contrast(c.primary)
    if v.is_baseline:
        effect, ci, p = "baseline", "", ""
    elif d is None or d.difference is None:
        effect, ci, p = MISSING, "", ""
    else:
        effect, ci, p = percent(d.relative), _effect_ci(d), p_only(d.p_value) if d.p_value is not None else "n/a"
    prel = v.vs_baseline.params_relative if v.vs_baseline else None
    params = fmt_count(v.params.get("total")) + (f" ({percent(prel, 1)})" if prel else "")
    return [v.label, str(v.n_seeds), fmt(ppl.mean), _ci(ppl) if ppl.n else MISSING, effect, ci, p, params]


def _matched_table(c: Comparison) -> str:
    rows = []
    for m in c.matched:
        d = m.split(c.primary)
        rows.append([m.label, fmt(d.variant_mean), fmt(d.baseline_mean), percent(d.relative), _effect_ci(d),
                     p_only(d.p_value) if d.p_value is not None else "n/a", str(d.seeds),
                     f"{m.embedding_share * 100:.1f}%" if m.embedding_share is not None else MISSING]
                    if d else [m.label] + [MISSING] * 7)
    return text_table(["setting", f"tied {SHORT[c.primary]} ppl", "untied ppl", "tying effect", "95% CI", "p",
                       "seeds", "V·d share"], rows)


def format_terminal_table(c: Comparison) -> str:
    """The compact table printed after a comparison: one line per variant (per setting in a grid),
    then the verdicts and what was left out; the comparison's warnings first."""
    warnings = [f"warning: {w}".replace("`", "") for w in c.warnings]
    warnings = ([c.protocol.replace("Protocol:", "protocol:", 1)] if c.protocol else []) + warnings
    if c.mode == "matched":
        lines = [*warnings, _matched_table(c)]
        alone = [v.label for v in c.variants if v.tied and v.vs_baseline is None]
        lines += ["not contrasted (no untied variant with the same settings): " + "; ".join(alone)] if alone else []
        lines += c.tying_map.lines() if c.tying_map is not None else []
        lines += c.tying_line.lines() if c.tying_line is not None else []
    else:
        header = ["variant", "seeds", f"{SHORT[c.primary]} ppl", "95% CI", f"vs {c.baseline_label}", "95% CI", "p",
                  "params"]
        lines = [*warnings, text_table(header, [_terminal_row(c, v) for v in c.variants])]
    lines += [line.replace("**", "") for line in c.verdicts]
    lines += adaptation_lines(c.adaptation, c.primary) if c.adaptation else []  # a pretrained start: what each variant forgot and gained
    lines += sequential_lines(c)  # --seeds auto: the design, where it stopped and why, each look
    lines += trajectory_lines(c)  # the crossover, and whether the effect is still moving
    lines += tuning_lines(c)  # the tuning table, the chosen values, the verdict at the shared value
    lines.append(selection_line(c).replace("**", "").replace("`", "").replace(": see the notes.", ":"))
    over = [r for r in c.runs if r.overtrained and c.select == "final"]
    lines += [f"  {r.name}: last evaluation {percent(r.last_above_best, 1)} above its best "
              f"(step {fmt_int(r.best_step)})" for r in over if r.last_above_best is not None]
    if any(v.n_seeds == 1 for v in c.variants):
        lines.append("Single-seed variants: no confidence interval or p-value can be given; use --seeds 3 or more.")
    for n in c.not_compared:
        lines.append(f"not compared: {n.variant} ({plural(len(n.runs), 'run')}: {', '.join(n.runs)}): {n.reason}")
    lines += [f"left out {s.path}: {s.reason}" for s in c.skipped]
    lines += [f"training failed: {f.name}: {f.error}" for f in c.train_failures]
    if c.files.get("markdown"):
        lines.append(f"wrote {c.files['markdown']} (and .csv, .json, plots)")
    if c.replaced:
        lines.append(c.replaced)
    return "\n".join(lines)
