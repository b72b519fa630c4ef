"""A Comparison as text: the verdict sentences, comparison.md (one function per section),
comparison.csv, comparison.json and the table printed after a comparison. Numbers, sizes and
tables are formatted by tiedlm.formatting, as everywhere else."""

from __future__ import annotations

import csv
import io
import json
import math
from typing import Any

from ..formatting import (
    MISSING,
    fmt,
    fmt_count,
    fmt_int,
    fmt_p,
    fmt_seconds,
    fmt_signed,
    format_bytes,
    markdown_table,
    text_table,
)
from .comparison import Comparison, RunRow
from .plots import PLOTS
from .stats import Summary, TestResult
from .variants import SPLITS, Variant

FILES = {"markdown": "comparison.md", "csv": "comparison.csv", "json": "comparison.json",
         **{f"plot_{k}": v for k, v in PLOTS.items()}}


# ============================================================================ pieces


def _mean_sd(s: Summary, digits: int = 2) -> str:
    if s.mean is None:
        return MISSING
    if s.sd is None:
        return fmt(s.mean, digits)
    return f"{fmt(s.mean, digits)} ± {fmt(s.sd, digits)}"


def _ci(s: Summary, digits: int = 2) -> str:
    if s.ci_low is None:
        return "one seed: no interval" if s.n == 1 else MISSING
    return f"{fmt(s.ci_low, digits)} – {fmt(s.ci_high, digits)}"


def _test_words(d: TestResult) -> str:
    if d.test == "paired":
        return f"paired over {d.n} seeds"
    return f"Welch, {d.n_a} vs {d.n_b} seeds"


def _p_only(p: float) -> str:
    """0.012 or <0.001: fmt_p without its 'p='."""
    return fmt_p(p)[1:].lstrip("=")


def _percent(x: float) -> str:
    return fmt_signed(x * 100, 1) + "%"


def _plural(n: int, word: str) -> str:
    return f"{n} {word}{'s' if n != 1 else ''}"


# ============================================================================ verdicts


def verdict(variant: Variant, split: str) -> str | None:
    """One plain-English sentence on the variant against the baseline on one split."""
    d = variant.contrast(split)
    if d is None or d.difference is None or d.relative is None:
        return None
    base = variant.vs_baseline.baseline
    rel = d.relative
    if rel == 0:
        claim = f"has the same perplexity as **{base}**"
    else:
        claim = f"is {abs(rel) * 100:.1f}% {'lower' if rel < 0 else 'higher'} perplexity than **{base}**"
    head = f"**{variant.label}** {claim} on {split} ({fmt(d.variant_mean)} vs {fmt(d.baseline_mean)}"
    if d.p_value is None:
        return head + f"; {d.note or 'no interval can be given'})."
    ci = f"{_percent(d.relative_ci_low)} to {_percent(d.relative_ci_high)}"
    sig = ("significant at 0.05" if d.significant
           else "not significant at 0.05 (the interval includes zero)")
    return head + f"; 95% CI of the difference {ci}, {fmt_p(d.p_value)}, {_test_words(d)}): {sig}."


def _params_sentence(variant: Variant) -> str | None:
    vs = variant.vs_baseline
    if vs is None or vs.params_relative is None:
        return None
    total = variant.params.get("total")
    base_total = total - vs.params_difference
    if vs.params_relative == 0:
        return f"Same parameter count as {vs.baseline} ({fmt_int(total)})."
    more = "fewer" if vs.params_relative < 0 else "more"
    return (f"It has {abs(vs.params_relative) * 100:.1f}% {more} parameters "
            f"({fmt_int(total)} vs {fmt_int(base_total)}).")


def verdicts_for(variant: Variant) -> list[str]:
    """The variant's verdict per split, the parameter sentence after the first; none for the baseline."""
    if variant.vs_baseline is None:
        return []
    lines = [line for line in (verdict(variant, s) for s in SPLITS) if line]
    ps = _params_sentence(variant)
    if ps and lines:
        lines[0] += " " + ps
    return lines


# ============================================================================ comparison.md


def _md_intro(c: Comparison) -> list[str]:
    n_runs = sum(v.n_seeds for v in c.variants)
    md = ["# tiedlm comparison", "",
          f"{_plural(n_runs, 'finished run')} in {_plural(len(c.variants), 'variant')}; baseline "
          f"**{c.baseline_label}** ({c.baseline_reason}). Written by tiedlm {c.tiedlm_version} on {c.created}."]
    if c.differing_keys:
        md += ["", "The variants differ in: " + ", ".join(f"`{k}`" for k in c.differing_keys) + "."]
    if c.not_compared:
        n_other = len(c.not_compared)
        md += ["", f"Only variants trained on the baseline's data are compared: the runs came from "
                   f"{c.data_sets} data sets, and {_plural(n_other, 'variant')} trained on other data "
                   f"{'are' if n_other != 1 else 'is'} listed under *Not compared*."]
    return md


def _md_verdict(c: Comparison) -> list[str]:
    md = ["", "## Verdict", ""]
    if c.verdicts:
        md += ["Percentages are of the baseline's mean perplexity; the interval is the 95% confidence "
               "interval of the difference in mean perplexity, expressed the same way. Lower is better.", ""]
        md += [f"- {line}" for line in c.verdicts]
    elif len(c.variants) == 1:
        md.append("- Only one variant: nothing to compare against. Train another (for example "
                  "`tiedlm compare --config CONFIG`, which trains both tied and untied).")
    if any(v.n_seeds == 1 for v in c.variants):
        md.append("- Some variants have a single seed: no confidence interval or p-value can be given for "
                  "them. Use `--seeds 3` or more.")
    return md


def _md_match(c: Comparison) -> list[str]:
    m = c.match
    if not m:
        return []
    md = ["", "## Parameter matching (--match params)", "",
          f"The untied model has {fmt_int(m.untied_total)} parameters and the tied one "
          f"{fmt_int(m.tied_total)}. The matched variant is tied with n_layer={m.matched_n_layer} "
          f"instead of {m.n_layer} (one layer holds {fmt_int(m.layer_params)}), for "
          f"{fmt_int(m.matched_total)} parameters: "
          f"{m.matched_total - m.untied_total:+,} against the untied model.".replace("-", "−")]
    if m.note:
        md += ["", m.note + "."]
    return md


def _present_splits(c: Comparison) -> list[str]:
    return [s for s in SPLITS if any(s in v.metrics for v in c.variants)]


def _md_results(c: Comparison) -> list[str]:
    md = ["", "## Results", "",
          "Mean ± standard deviation over seeds; the 95% interval is a Student-t confidence interval "
          "for the mean over seeds (mean ± t(0.975, n−1)·sd/√n) — where the average run of this "
          "variant would land, not the range of single runs. Lower is better.", ""]
    present = _present_splits(c)
    header = ["variant", "seeds"]
    for s in present:
        header += [f"{s} perplexity", "95% CI", f"{s} bits/byte"]
    rows = []
    for v in c.variants:
        row = [v.name, str(v.n_seeds)]
        for s in present:
            m = v.split(s)
            row += ([_mean_sd(m.perplexity), _ci(m.perplexity), _mean_sd(m.bits_per_byte, 4)] if m
                    else [MISSING] * 3)
        rows.append(row)
    md.append(markdown_table(header, rows))
    floor = next((v.floor for v in c.variants if v.floor), None)
    if floor:
        bpb = floor.get("bits_per_byte") or {}
        md += ["", f"Floor of the synthetic language (its true entropy rate): {fmt(floor.get('perplexity_per_word'))} "
                   f"perplexity per word, {fmt(bpb.get('validation'), 4)} bits per byte on validation, "
                   f"{fmt(bpb.get('test'), 4)} on test. No model can do better on average."
                   + (f" ({floor['note'].rstrip('.')}.)" if floor.get("note") else "")]
    return md


def _md_differences(c: Comparison) -> list[str]:
    others = [v for v in c.variants if not v.is_baseline]
    if not others:
        return []
    md = ["", f"## Difference from the baseline ({c.baseline_label})", "",
          "Difference in mean perplexity, variant − baseline (negative: the variant is better), with its "
          "95% confidence interval and two-sided p-value: paired t-test on per-seed differences when both "
          "have the same seeds, Welch's t-test otherwise.", ""]
    rows = []
    for v in others:
        for s in _present_splits(c):
            d = v.contrast(s)
            if d is None or d.difference is None:
                continue
            if d.p_value is None:
                ci, p, how = "no interval", MISSING, d.note or MISSING
            else:
                ci = f"{fmt_signed(d.ci_low)} to {fmt_signed(d.ci_high)}"
                p, how = _p_only(d.p_value), _test_words(d)
            rel = _percent(d.relative) if d.relative is not None else MISSING
            sig = MISSING if d.significant is None else ("yes" if d.significant else "no")
            rows.append([v.label, s, fmt_signed(d.difference), rel, ci, p, sig, how])
    md.append(markdown_table(["variant", "split", "Δ perplexity", "relative", "95% CI", "p", "p < 0.05", "test"],
                             rows, "llrrrrll"))
    return md


def _bucket_cell(v: Variant, base: Variant, name: str) -> str:
    """Mean ± SD of a bucket's loss; for a variant, its difference from the baseline and p-value."""
    b = v.split("validation").bucket(name) if v.split("validation") else None
    if not b or b.loss.mean is None:
        return MISSING
    cell = _mean_sd(b.loss, 3)
    ref = base.split("validation").bucket(name) if base.split("validation") else None
    if not v.is_baseline and ref and ref.loss.mean is not None:
        test = v.vs_baseline.bucket("validation", name)
        p = test.p_value if test else None
        cell += f" ({fmt_signed(b.loss.mean - ref.loss.mean, 3)}" + (f", {fmt_p(p)}" if p is not None else "") + ")"
    return cell


def _md_buckets(c: Comparison) -> list[str]:
    names = c.bucket_names("validation")
    if not names:
        return []
    shown = {}  # each bucket as the last variant that has it reports it (for its token count)
    for v in c.variants:
        shown.update({b.name: b for b in v.buckets("validation")})
    header = ["variant"] + [f"{n} ({fmt_count(shown[n].tokens)} tokens)" if shown[n].tokens else n for n in names]
    rows = [[v.name] + [_bucket_cell(v, c.baseline, n) for n in names] for v in c.variants]
    return ["", "## Loss by token frequency (validation)", "",
            "Mean loss in nats per token of each frequency bucket (vocabulary ranked by training-set "
            "count), ± SD over seeds; in brackets the difference from the baseline and its p-value (the same "
            "test as for perplexity: paired by seed where the seeds match). The weight-tying literature "
            "expects tying to help rare tokens most.", "", markdown_table(header, rows)]


def _md_params(c: Comparison) -> list[str]:
    rows = []
    for v in c.variants:
        p = v.params
        rel = v.vs_baseline.params_relative if v.vs_baseline else None
        rows.append([v.name, *(fmt_int(p.get(k)) for k in ("total", "wte", "lm_head", "wpe", "non_embedding",
                                                           "saved_by_tying")),
                     MISSING if rel is None else _percent(rel)])
    return ["", "## Parameters", "",
            "Unique parameters. `lm_head` counts W_out's extra parameters (0 when it is E); "
            "`saved by tying` is V·d, also 16 bytes each of AdamW training memory in fp32.", "",
            markdown_table(["variant", "total", "wte (E)", "lm_head (W_out)", "wpe", "non-embedding",
                            "saved by tying", "vs baseline"], rows)]


def _md_cost(c: Comparison) -> list[str]:
    rows = []
    for v in c.variants:
        cost = {k: s.mean for k, s in v.cost.items()}
        rows.append([v.name, fmt_int(cost["tokens_per_s"]), fmt_seconds(cost["wall_time_s"]),
                     format_bytes(cost["peak_memory_bytes"] or None),  # 0: not measured
                     fmt_count(cost["tokens_seen"]), fmt_int(cost["steps"]), ", ".join(v.device + v.dtype) or MISSING])
    return ["", "## Cost", "",
            "Means over seeds. Tying saves parameters and memory, never FLOPs: the output matmul runs either way.", "",
            markdown_table(["variant", "tokens/s", "wall time", "peak memory", "tokens seen", "steps", "device"],
                           rows, "lrrrrrl")]


def _md_plots() -> list[str]:
    return ["", "## Plots", "",
            f"![validation perplexity against tokens seen]({PLOTS['curve']})", "",
            "Validation perplexity during training (on the fixed evaluation slice): mean over seeds, "
            "band from the lowest to the highest seed, log scale.", "",
            f"![final validation perplexity against parameter count]({PLOTS['params']})", "",
            f"![validation loss by frequency bucket]({PLOTS['buckets']})"]


def _md_runs(c: Comparison) -> list[str]:
    rows = [[r.name, r.variant, str(r.seed), fmt(r.validation_perplexity), fmt(r.test_perplexity),
             fmt(r.validation_bits_per_byte, 4), fmt_int(r.params_total), fmt_seconds(r.wall_time_s)]
            for r in c.runs]
    return ["", "## Runs", "",
            markdown_table(["run", "variant", "seed", "validation ppl", "test ppl", "validation bits/byte",
                            "parameters", "wall time"], rows, "lllrrrrr")]


def _md_left_aside(c: Comparison) -> list[str]:
    """Not compared (other data), left out, and notes."""
    md = []
    if c.not_compared:
        md += ["", "## Not compared (trained on other data)", "",
               "Runs trained or evaluated on other tokens than the baseline's (another data source, split, "
               "tokenizer or evaluation set) are never contrasted with it. Compare them among themselves, "
               "for example with `--baseline` set to one of them.", ""]
        md += [f"- **{n.variant}** ({', '.join(f'`{r}`' for r in n.runs)}): {n.reason}" for n in c.not_compared]
    if c.skipped:
        md += ["", "## Left out", ""] + [f"- `{s.path}`: {s.reason}" for s in c.skipped]
    if c.notes:
        md += ["", "## Notes", ""] + [f"- {n}" for n in c.notes]
    return md


def to_markdown(c: Comparison) -> str:
    sections = (_md_intro(c) + _md_verdict(c) + _md_match(c) + _md_results(c) + _md_differences(c)
                + _md_buckets(c) + _md_params(c) + _md_cost(c) + _md_plots() + _md_runs(c) + _md_left_aside(c))
    return "\n".join(sections + [""])


# ============================================================================ comparison.csv


def _csv_columns(bucket_names: list[str]) -> list[str]:
    cols = ["row_type", "variant", "run", "seeds", "n_seeds", "config_hash"]
    for s in SPLITS:
        cols += [f"{s}_perplexity", f"{s}_perplexity_sd", f"{s}_perplexity_ci_low", f"{s}_perplexity_ci_high",
                 f"{s}_bits_per_byte", f"{s}_bits_per_byte_sd", f"{s}_loss"]
    cols += [f"validation_loss[{n}]" for n in bucket_names]
    cols += ["params_total", "params_wte", "params_lm_head", "params_wpe", "params_non_embedding",
             "params_saved_by_tying", "tokens_per_s", "wall_time_s", "peak_memory_bytes", "tokens_seen",
             "steps", "device", "is_baseline"]
    for s in SPLITS:
        cols += [f"{s}_perplexity_diff", f"{s}_perplexity_diff_ci_low", f"{s}_perplexity_diff_ci_high",
                 f"{s}_p_value", f"{s}_test"]
    return cols + ["params_relative_change", "reason", "path"]


def _csv_variant(v: Variant) -> dict[str, Any]:
    row: dict[str, Any] = {"row_type": "variant", "variant": v.label, "seeds": " ".join(map(str, v.seeds)),
                           "n_seeds": v.n_seeds, "config_hash": v.config_hash, "is_baseline": v.is_baseline}
    for s in SPLITS:
        m = v.split(s)
        if m:
            p = m.perplexity
            row.update({f"{s}_perplexity": p.mean, f"{s}_perplexity_sd": p.sd, f"{s}_perplexity_ci_low": p.ci_low,
                        f"{s}_perplexity_ci_high": p.ci_high, f"{s}_bits_per_byte": m.bits_per_byte.mean,
                        f"{s}_bits_per_byte_sd": m.bits_per_byte.sd, f"{s}_loss": m.loss.mean})
        d = v.contrast(s)
        if d:
            row.update({f"{s}_perplexity_diff": d.difference, f"{s}_perplexity_diff_ci_low": d.ci_low,
                        f"{s}_perplexity_diff_ci_high": d.ci_high, f"{s}_p_value": d.p_value, f"{s}_test": d.test})
    for b in v.buckets("validation"):
        row[f"validation_loss[{b.name}]"] = b.loss.mean
    for k in ("total", "wte", "lm_head", "wpe", "non_embedding", "saved_by_tying"):
        row[f"params_{k}"] = v.params.get(k)
    row.update({k: s.mean for k, s in v.cost.items()})
    row["device"] = " ".join(v.device)
    row["params_relative_change"] = v.vs_baseline.params_relative if v.vs_baseline else None
    return row


def _csv_run(r: RunRow) -> dict[str, Any]:
    row = {"row_type": "run", "variant": r.variant, "run": r.name, "seeds": r.seed, "n_seeds": 1,
           "config_hash": r.config_hash, "path": r.path, "params_total": r.params_total, "device": r.device,
           "tokens_per_s": r.tokens_per_s, "wall_time_s": r.wall_time_s, "peak_memory_bytes": r.peak_memory_bytes,
           "tokens_seen": r.tokens_seen, "steps": r.steps}
    for s in SPLITS:
        row.update({f"{s}_{k}": r.metric(s, k) for k in ("perplexity", "bits_per_byte", "loss")})
    row.update({f"validation_loss[{n}]": loss for n, loss in r.buckets.get("validation", {}).items()})
    return row


def _cell(x: Any) -> Any:
    return "" if x is None or (isinstance(x, float) and not math.isfinite(x)) else x


def to_csv(c: Comparison) -> str:
    """One row per variant, one per run, one per run not compared (other data) and one per run left
    out; the row_type column tells them apart."""
    cols = _csv_columns(c.bucket_names("validation"))
    rows = [_csv_variant(v) for v in c.variants] + [_csv_run(r) for r in c.runs]
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
    return json.dumps(c.to_json(), indent=2, allow_nan=False) + "\n"


# ============================================================================ the terminal


def _terminal_row(v: Variant) -> list[str]:
    m = v.split("validation")
    ppl = m.perplexity if m else Summary(n=0)
    d = v.contrast("validation")
    if v.is_baseline:
        delta, p = "baseline", ""
    elif d is None or d.difference is None:
        delta, p = MISSING, ""
    else:
        delta = fmt_signed(d.difference) + (f" ({_percent(d.relative)})" if d.relative is not None else "")
        p = _p_only(d.p_value) if d.p_value is not None else "n/a"
    prel = v.vs_baseline.params_relative if v.vs_baseline else None
    params = fmt_count(v.params.get("total")) + (f" ({_percent(prel)})" if prel else "")
    return [v.label, str(v.n_seeds), _mean_sd(ppl), _ci(ppl) if ppl.n else MISSING, delta, p, params]


def format_terminal_table(c: Comparison) -> str:
    """The compact table printed after a comparison: one line per variant, then verdicts and left-out runs."""
    header = ["variant", "seeds", "val ppl", "95% CI", f"Δ vs {c.baseline_label}", "p", "params"]
    lines = [text_table(header, [_terminal_row(v) for v in c.variants])]
    lines += [line.replace("**", "") for line in c.verdicts]
    if any(v.n_seeds == 1 for v in c.variants):
        lines.append("Single-seed variants: no confidence interval or p-value can be given; use --seeds 3 or more.")
    for n in c.not_compared:
        lines.append(f"not compared: {n.variant} ({_plural(len(n.runs), 'run')}: {', '.join(n.runs)}): {n.reason}")
    lines += [f"left out {s.path}: {s.reason}" for s in c.skipped]
    lines += [f"training failed: {f.name}: {f.error}" for f in c.train_failures]
    if c.files.get("markdown"):
        lines.append(f"wrote {c.files['markdown']} (and .csv, .json, plots)")
    return "\n".join(lines)
