"""The sections of a comparison's report that belong to one feature, as text: the effect over
training (its sentences, table and caption), the sequential design (its sentence and looks),
the tuning (its table, choices, cost and the verdict at the shared value) and the confound
ledger (what each variant's E and W_out received, and whether the contrasted ones differ in more
than the tie). report.py puts them in
its one order, for the terminal and for comparison.md; the figures they point to are plots.py's.
Pure functions of the Comparison; nothing here computes a statistic or reads a run."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..formatting import MISSING, fmt_count, fmt_signed, markdown_table, percent
from ..runs.ledger import FROM_CONFIG, differs_sentence, share_words, value_words
from .plots import TRAJECTORY_PLOT, TUNE_PLOT
from .sequential import FIRST_SEEDS, look_words, mc_paths
from .stats import fmt_pvalue, fmt_threshold
from .trajectory import SPLIT, Trajectory
from ..config.naming import scalar, short_keys
from .tuned import not_compared, paired

if TYPE_CHECKING:
    from .tuned import JointEffect, Tuning
    from .comparison import Comparison
    from .variants import Variant


# ============================================================================ the effect over training


def _points(x: float) -> str:
    """A change of the effect in percentage points: one decimal, more when that would show 0.0."""
    return fmt_signed(x * 100, 1 if abs(x) * 100 >= 0.05 or x == 0 else 3)


def crossover_sentence(t: Trajectory) -> str | None:
    """'Over training, **tied** pulls ahead of **untied** after 1.1M tokens (…).'"""
    x = t.crossover
    if x is None:
        return None
    other = t.reference if x.leader == t.variant else t.variant
    return (f"Over training, **{x.leader}** pulls ahead of **{other}** after {fmt_count(x.tokens)} tokens (the last "
            f"change of sign of the effect on validation, between the evaluations at {fmt_count(x.between[0])} and "
            f"{fmt_count(x.between[1])} tokens).")


def still_moving_sentence(t: Trajectory) -> str | None:
    """The one line when the effect is still moving; None otherwise."""
    if not t.still_moving:
        return None
    half = t.final_half_width * 100
    digits = 1 if half >= 0.05 or half == 0 else 3
    return (f"The effect of **{t.variant}** vs **{t.reference}** is still moving: it changed by "
            f"{_points(t.last_quarter_change)} points over the last quarter of training "
            f"({fmt_count(t.last_quarter_from_tokens)} to {fmt_count(t.points[-1].tokens)} tokens), more than its "
            f"interval's half-width (±{half:.{digits}f}) — train longer before trusting the verdict.")


def summary_sentence(t: Trajectory, verdict: tuple[str, Any] | None = None) -> str | None:
    """The effect at the first, middle and last evaluation, and whether it has settled: one line
    for every comparison, so the verdict is always read with how it got there."""
    pts = [p for p in t.points if p.effect is not None]
    if len(pts) < 2:
        return None
    mid = min(pts, key=lambda p: abs(p.tokens - pts[-1].tokens / 2))
    shown = [pts[0], mid, pts[-1]] if mid not in (pts[0], pts[-1]) else [pts[0], pts[-1]]
    path = ", ".join(f"{percent(p.effect, 1)} at {fmt_count(p.tokens)}" for p in shown)
    sign = "changes sign" if t.crossover is not None else "keeps its sign"
    if t.still_moving is False:
        settled = (f"; settled: {_points(t.last_quarter_change)} points over the last quarter, within its "
                   f"interval's half-width (±{100 * t.final_half_width:.1f})")
    elif t.still_moving is None:
        settled = "; one seed: whether it has settled cannot be judged"
    else:
        settled = ""
    end = ""
    if verdict is not None and verdict[1] is not None and verdict[1].relative is not None:
        split, d = verdict  # the verdict's own figure where it is on another split (or the kept best weights)
        end = f" The verdict, on {split}, is {percent(d.relative)}."
    return (f"The effect of **{t.variant}** vs **{t.reference}** over training, on validation: {path} tokens; it "
            f"{sign}{settled}.{end}")


def _sentences(c: Comparison) -> list[str]:
    ordered = [c.trajectories[v.label] for v in c.variants if v.label in c.trajectories]
    apart = c.primary != SPLIT or c.select == "best"  # the verdict is not the line's last point
    by_label = {v.label: v for v in c.variants}
    return [s for t in ordered for s in (
        summary_sentence(t, (c.primary + (", kept best weights" if c.select == "best" else ""),
                             by_label[t.variant].contrast(c.primary)) if apart and t.variant in by_label else None),
        crossover_sentence(t), still_moving_sentence(t)) if s]


def trajectory_lines(c: Comparison) -> list[str]:
    """The crossover and still-moving lines, one line each, for the terminal."""
    return [s.replace("**", "") for s in _sentences(c)]


def caption(c: Comparison) -> str:
    """What the trajectory plot shows, and on what."""
    text = ("The effect over training: at each periodic evaluation that every run of both variants reached, "
            "exp(mean Δloss) − 1 on the validation slice scored during training (`train.eval_tokens`), paired by "
            "seed (Welch's test when the seeds differ), with its 95% interval as a band; negative: the variant is "
            "better. The crossover is the last change of sign, interpolated in tokens; the effect is still moving "
            "when its change over the last quarter of training exceeds its last interval's half-width.")
    if c.select == "best" or c.primary != SPLIT:
        text += (f" The verdict is on {c.primary}"
                 + (" (the kept best weights)" if c.select == "best" else "")
                 + "; this trajectory is on validation, the only split evaluated during training.")
    ts = list(c.trajectories.values())
    if ts and all(t.points and all(p.ci_low is None for p in t.points) for t in ts):
        text += " With one seed per variant there is no interval: the plot shows point estimates only."
    return text


def _row(t: Trajectory) -> list[str]:
    """contrast, evaluations, first effect, last effect with its interval, crossover, last-quarter
    change against the half-width, still moving."""
    if not t.points:
        return [f"{t.variant} vs {t.reference}", "0"] + [MISSING] * 5
    first, last = t.points[0], t.points[-1]
    ci = f" ({percent(last.ci_low)} to {percent(last.ci_high)})" if last.ci_low is not None else ""
    change = MISSING if t.last_quarter_change is None else (
        f"{_points(t.last_quarter_change)} pts" + (f" (±{t.final_half_width * 100:.1f})"
                                                   if t.final_half_width is not None else ""))
    moving = {True: "yes", False: "no", None: MISSING}[t.still_moving]
    return [f"{t.variant} vs {t.reference}", str(len(t.points)), f"{percent(first.effect)} at {fmt_count(first.tokens)}",
            f"{percent(last.effect)}{ci} at {fmt_count(last.tokens)}", t.crossover.text if t.crossover else "none",
            change, moving]


def trajectory_markdown(c: Comparison) -> list[str]:
    """comparison.md's section on the effect over training: the sentences, a row per contrast, the
    plot and its caption."""
    if not c.trajectories:
        return []
    ordered = [c.trajectories[v.label] for v in c.variants if v.label in c.trajectories]
    lines = [f"- {s}" for s in _sentences(c)]
    table = markdown_table(["contrast", "evaluations", "first effect", "last effect (95% CI)", "crossover",
                            "last quarter (± half-width)", "still moving"], [_row(t) for t in ordered], "lrrrlrl")
    notes = [f"- {t.variant} vs {t.reference}: {t.note}." for t in ordered if t.note]
    return ["", "## The effect over training", "", *lines, *([""] if lines else []), table,
            *([""] + notes if notes else []), "",
            f"![the effect over training against tokens seen]({TRAJECTORY_PLOT})", "", caption(c)]


# ============================================================================ the sequential design


def sequential_markdown(c: Comparison) -> list[str]:
    """comparison.md's section on the design: the sentence, how it works, and a table of the looks."""
    seq = getattr(c, "sequential", None)
    if seq is None:
        return []

    rows = [[str(x.seeds), fmt_pvalue(x.p_value), f"p < {fmt_threshold(x.threshold)}",
             percent(x.mde_relative), x.decision] for x in seq.looks]
    return ["", "## Sequential design", "", seq.summary(), "",
            f"Seeds were added one per variant at a time (`--seeds auto`), looking at the primary contrast "
            f"({seq.contrast or c.primary}) after {FIRST_SEEDS} seeds and after each further one. To keep the "
            f"false-positive rate at α = {seq.alpha:g} across the looks, each look spends part of it: α(t) = 2 − "
            "2Φ(z(1−α/2)/√t) by information fraction t = seeds / max seeds (Lan–DeMets, O'Brien–Fleming "
            "type). "
            "Each look's threshold for the paired t-test is calibrated on "
            f"{mc_paths(seq.max_seeds):,} simulated comparisons with no effect (a fixed seed: the same thresholds "
            "every time), so that the chance of a false positive by each look is α(t). The verdict above is judged "
            "at the last look's threshold, not at 0.05. Futility (the smallest effect detectable with 80% power "
            f"at α = 0.05 below --min-effect {seq.min_effect * 100:g}%) spends no alpha.", "",
            markdown_table(["seeds per variant", "p", "adjusted threshold", "smallest detectable", "decision"], rows)]


def sequential_lines(c: Comparison) -> list[str]:
    """The design's sentence and one line per look."""
    seq = getattr(c, "sequential", None)
    if seq is None:
        return []
    return [seq.summary()] + [f"  {x.seeds} seeds: {look_words(x)}" for x in seq.looks]


# ============================================================================ the tuning


def _ppl(x: float | None) -> str:
    return "–" if x is None else f"{x:.2f}"


def _seeds(tuning: Tuning) -> str:
    return f"tuning seed{'s' * (len(tuning.seeds) != 1)} {', '.join(str(s) for s in tuning.seeds)}"


def tuning_note(tuning: Tuning, primary: str) -> str:

    if tuning.only_point is not None:
        return f"{not_compared(tuning.keys, tuning.only_point)}; the verdict is on {primary}"
    return (f"each variant at its own {', '.join(tuning.keys)}, chosen on validation ({tuning.selection}, "
            f"{_seeds(tuning)}); the verdict is on {primary}, which chose nothing")


def _not_compared(tuning: Tuning) -> str:

    return not_compared(tuning.keys, tuning.only_point)


def table_rows(tuning: Tuning) -> tuple[list[str], list[list[str]]]:
    """Header and rows: one row per variant, one column per point (validation perplexity, the
    chosen one starred), then the chosen point."""
    labels = tuning.labels()
    chose = tuning.only_point is None  # one point: no star and no chosen column, as nothing was compared
    head = ["variant", *labels, *(["chosen"] if chose else [])]
    rows = []
    for v in tuning.variants:
        cells = []
        for lab in labels:
            p = v.point(lab)
            if p is None:
                cells.append("")
            elif p.perplexity is None:
                cells.append("failed")
            else:
                cells.append(_ppl(p.perplexity) + ("*" if chose and v.chosen is p else ""))
        rows.append([v.tag, *cells, *([v.chosen.label if v.chosen else "–"] if chose else [])])
    return head, rows


def _cost(tuning: Tuning) -> str:
    return f"{tuning.runs} tuning runs, {fmt_count(tuning.tokens)} tokens"


def _shared_sentence(c: Comparison, tuning: Tuning) -> str | None:
    s = tuning.shared
    if not s:
        return None
    if all(v.chosen is not None and v.chosen.label == s["label"] for v in tuning.variants):
        return (f"Every variant chose the config's own {s['label']}: the verdict at that shared value is the tuned "
                "verdict above.")
    tuned = next((v for v in c.variants if v.vs_baseline is not None), None)
    tuned_contrast = tuned.contrast(c.primary) if tuned is not None else None
    seeds = s.get("seeds") or []
    interval = (f" (95% CI {percent(s.get('ci_low'))} to {percent(s.get('ci_high'))}, over {len(seeds)} seeds)"
                if len(seeds) > 1 and s.get("ci_low") is not None else
                f" (seed {', '.join(str(x) for x in seeds)} only: no interval)")
    where = (f"At the config's own {s['label']} for both variants: {s['variant']} {percent(s.get('relative'))} "
             f"on {s['split']}{interval}")
    if tuned_contrast is None:
        return where + "."
    n = tuned_contrast.n or 0
    ci = (f"95% CI {percent(tuned_contrast.relative_ci_low)} to {percent(tuned_contrast.relative_ci_high)}"
          if tuned_contrast.relative_ci_low is not None else
          "no interval (one seed)" if n <= 1 else "no interval")
    best = f"; each at its own best: {tuned.label} {percent(tuned_contrast.relative)} ({ci})"
    return where + best + "."


def chosen_lines(tuning: Tuning) -> list[str]:
    out = []
    for v in tuning.variants:
        if v.chosen is None:
            continue
        steps = sum(v.extensions.values())
        grown = f", the grid extended {steps} step{'s' * (steps != 1)}" if steps else ""
        line = f"{v.tag}: {v.chosen.label} (validation perplexity {_ppl(v.chosen.perplexity)}{grown})"
        out.append(line + (f". Edge: {v.edge}" if v.edge else "") + (f". Bound: {v.bound}" if v.bound else ""))
    return out


def _two_axes(tuning: Tuning) -> list[str] | None:
    """The two keys of a tune of two plain axes (lr × dropout), else None."""

    axes = tuning.spec.axes
    return list(axes) if len(axes) == 2 and not any(paired(x) for x in axes.values()) else None


def grid_tables(tuning: Tuning) -> list[tuple[list[str], list[list[str]]]]:
    """For two plain axes, one table per variant: a row per value of the first key, a column per
    value of the second, validation perplexity in the cells (the choice starred, blank: not tried);
    [] otherwise."""

    keys = _two_axes(tuning)
    if keys is None or tuning.only_point is not None:
        return []
    short = short_keys(keys)
    out = []
    for v in tuning.variants:
        rows_at, cols_at = (sorted({p.point[k] for p in v.points}) for k in keys)
        head = [f"{v.tag} ({short[keys[0]]} ↓, {short[keys[1]]} →)",
                *(f"{short[keys[1]]}={scalar(x)}" if x is not None else f"(no {short[keys[1]]})" for x in cols_at)]
        rows = []
        for r in rows_at:
            cells = []
            for col in cols_at:
                p = next((p for p in v.points if p.point[keys[0]] == r and p.point[keys[1]] == col), None)
                cells.append("" if p is None else "failed" if p.perplexity is None else
                             _ppl(p.perplexity) + ("*" if v.chosen is p else ""))
            rows.append([f"{short[keys[0]]}={scalar(r)}" if r is not None else f"(no {short[keys[0]]})", *cells])
        out.append((head, rows))
    return out


def _grid_lines(tuning: Tuning) -> list[str]:
    out = []
    for head, rows in grid_tables(tuning):
        widths = [max(len(str(r[i])) for r in [head, *rows]) for i in range(len(head))]
        out += ["  " + "  ".join(str(x).ljust(w) if i == 0 else str(x).rjust(w)
                                 for i, (x, w) in enumerate(zip(r, widths))) for r in [head, *rows]]
    return out


# ---------------------------------------------------------------------------- which key moved the verdict


def _joint_basis(j: JointEffect) -> str:
    runs = ("one run per point, so each is a point estimate with no interval" if len(j.seeds) == 1 else
            f"the mean of {len(j.seeds)} runs per point; no interval is computed for these readings")
    return (f"These effects are on validation, the split that chose the tuned values, read from the tuning runs "
            f"(tuning seed{'s' * (len(j.seeds) != 1)} {', '.join(str(x) for x in j.seeds)}: {runs}); a test verdict "
            "with an interval at these points would need the remaining seeds trained there, which tuning does not "
            "do: the test verdict above is at the joint best only.")


def joint_sentence(tuning: Tuning) -> str | None:
    """Which key moved the verdict: 'Tuning model.dropout moved the tied/untied effect from +9.1% to
    +2.3%; lr alone: from +5.0% to +9.1%…', and what the effects are read on; None when the tune is
    not train.lr and one other key."""

    j = tuning.joint
    if j is None:
        return None
    pair, held = f"{j.variant}/{j.reference}", f"{j.other} {scalar(j.held)}"
    if j.lr_alone is None:
        tried = sorted({p.point[j.other] for v in tuning.variants for p in v.points} - {None})
        return (f"The config's {held} is not in every variant's grid ({', '.join(scalar(x) for x in tried)}), so the "
                f"{pair} effect at each variant's best lr with {j.other} held at the config's value cannot be read "
                f"from these runs — add {scalar(j.held)} to the grid to see what lr alone does; at the joint best it "
                f"is {percent(j.joint.effect, 1)}. {_joint_basis(j)}")
    e_alone, e_joint = j.lr_alone.effect, j.joint.effect
    if all(p[j.other] in (j.held, None) for p in j.joint.points.values()):
        text = (f"Every variant chose the config's {held}, so tuning {j.other} moved nothing: the {pair} effect is "
                f"{percent(e_joint, 1)} at the joint best as at each variant's best lr")
    else:
        text = (f"Tuning {j.other} moved the {pair} effect from {percent(e_alone, 1)} (each at its best lr, {held}) "
                f"to {percent(e_joint, 1)} (the joint best)")
    if e_alone is not None and e_joint is not None and e_alone * e_joint < 0:
        text += ", changing its sign"
    if j.config is not None:
        text += f"; lr alone: from {percent(j.config.effect, 1)} (both at the config's own point) to {percent(e_alone, 1)}"
    else:
        text += "; lr alone: not known, as the config's own point is not in every variant's grid"
    moved = j.moved_by
    text += (f". {moved} moved it more." if moved else ".")
    if j.lr_alone.at_edge:
        text += (f" At {held}, {' and '.join(j.lr_alone.at_edge)}'s best lr is the end of the lr values tried there "
                 "(a step past an edge trains the joint choice's lines only), so lr alone may do more than this "
                 "reading shows.")
    return f"{text} {_joint_basis(j)}"


def joint_table(tuning: Tuning) -> tuple[list[str], list[list[str]]] | None:
    """A row per reading (the config's own point, best lr with the other key held, the joint best):
    each variant's point and validation perplexity, and the effect."""

    j = tuning.joint
    if j is None:
        return None
    tags = [j.variant, j.reference]
    head = ["each variant at", *(f"{t} point" for t in tags), *(f"{t} ppl" for t in tags),
            f"{j.variant} vs {j.reference} (validation)"]
    rows = []
    for name, r in (("the config's own point", j.config), (f"its best lr, {j.other} at {scalar(j.held)}", j.lr_alone),
                    ("its joint best", j.joint)):
        if r is None:
            rows.append([name, "not in every variant's grid", "", "", "", MISSING])
        else:
            rows.append([name, *(r.labels[t] for t in tags), *(_ppl(r.perplexity[t]) for t in tags),
                         percent(r.effect)])
    return head, rows


def joint_lines(tuning: Tuning) -> list[str]:
    """The terminal's lines: one per reading, then the sentence."""
    j, sentence = tuning.joint, joint_sentence(tuning)
    if j is None or sentence is None:
        return []
    _, rows = joint_table(tuning)
    return [f"Which key moved the verdict ({j.variant} vs {j.reference} on validation, from the tuning runs), each "
            "variant:"] + [f"  at {r[0]}: " + (f"{r[-1]} ({r[1]}; {r[2]})" if r[2] else r[1]) for r in rows] + [sentence]


def tuning_lines(c: Comparison) -> list[str]:
    tuning = c.tuning
    if tuning is None:
        return []
    head, rows = table_rows(tuning)
    widths = [max(len(str(r[i])) for r in [head, *rows]) for i in range(len(head))]
    fmt = lambda r: "  ".join(str(x).ljust(w) if i == 0 else str(x).rjust(w) for i, (x, w) in enumerate(zip(r, widths)))  # noqa: E731
    if tuning.only_point is not None:
        lines = [f"Not tuned: {_not_compared(tuning)} ({tuning.selection}; {_cost(tuning)}):"]
        return lines + ["  " + fmt(head)] + ["  " + fmt(r) for r in rows]
    lines = [f"Tuned on validation ({tuning.selection}; {', '.join(tuning.keys)}; {_cost(tuning)}):"]
    lines += _grid_lines(tuning) or ["  " + fmt(head)] + ["  " + fmt(r) for r in rows]
    lines += ["  chosen " + line for line in chosen_lines(tuning)]
    shared = _shared_sentence(c, tuning)
    if shared:
        lines.append(shared)
    return lines + joint_lines(tuning)


def tuning_markdown(c: Comparison) -> list[str]:
    tuning = c.tuning
    if tuning is None:
        return []
    head, rows = table_rows(tuning)
    if tuning.only_point is not None:
        return ["## Tuning: one point, nothing compared", "",
                f"Not tuned: {_not_compared(tuning)}. Validation perplexity there "
                f"({tuning.selection}, {_seeds(tuning)}); the verdict above is on {c.primary}. Tuning cost: "
                f"{_cost(tuning)}.", "", markdown_table(head, rows), ""]
    out = ["## Each variant at its own setting", "",
           f"Validation perplexity of each point ({tuning.selection}, {_seeds(tuning)}); * marks each variant's "
           f"choice. The verdict above is on {c.primary}, which chose nothing. Tuning cost: {_cost(tuning)}.", ""]
    grids = grid_tables(tuning)
    out += [x for g in grids for x in (markdown_table(*g), "")] if grids else [markdown_table(head, rows), ""]
    out += [f"- {line}" for line in chosen_lines(tuning)]
    shared = _shared_sentence(c, tuning)
    if shared:
        out.append(f"- {shared}")
    if tuning.schedule:
        out.append(f"- The schedule keeps its shape: {', '.join(tuning.schedule)} (the config's min_lr / lr).")
    return out + _joint_markdown(tuning) + ["", f"![tuning curves]({TUNE_PLOT})", ""]


def _joint_markdown(tuning: Tuning) -> list[str]:
    table, sentence = joint_table(tuning), joint_sentence(tuning)
    if table is None or sentence is None:
        return []
    return ["", "### Which key moved the verdict", "", sentence, "", markdown_table(*table)]


# ============================================================================ the confound ledger


def _ledger_row(v: Variant) -> list[str]:
    g, w = v.ledger, value_words
    return [v.name, g.init, g.head_init, f"{w('lr', g.lr)} → {w('min_lr', g.min_lr)}",
            " / ".join(w(k, getattr(g, k)) for k in ("weight_decay_e", "weight_decay_w_out", "weight_decay_other")),
            f"{w('init_std_e', g.init_std_e)} / {w('init_std_w_out', g.init_std_w_out)}", g.frozen, g.embed_scale,
            w("lm_head_bias", g.lm_head_bias), w("block_biases", g.block_biases), share_words(g)]


def confound_lines(c: Comparison) -> list[str]:
    """One line per contrast: "tied vs untied: the variants differ only in the tie." or what else
    they differ in (ledger.differences)."""
    out = []
    for v in c.variants:
        vs = v.vs_baseline
        if vs is None or vs.confounds is None:
            continue
        line = f"{v.label} vs {vs.baseline}: {differs_sentence(vs.confounds)}"
        if vs.tuned_differences:  # the protocol's own difference, said as such
            own = "; ".join(vs.tuned_differences)
            line = (f"{v.label} vs {vs.baseline}: besides the tie, they differ only in what each chose on validation "
                    f"({own})." if not vs.confounds else f"{line} Each at its own tuned setting: {own}.")
        out.append(line)
    return out


def ledger_markdown(c: Comparison) -> list[str]:
    """comparison.md's confound ledger: per variant what E and W_out received, then per contrast
    whether the two differ in more than the tie."""
    shown = [v for v in c.variants if v.ledger is not None]
    if not shown:
        return []
    rows = [_ledger_row(v) for v in shown]
    md = ["", "## Confound ledger", "",
          "What each variant's embedding matrices received besides the tie: where the weights come from, W_out at "
          "the start, the learning rate (→ where the cosine ends), AdamW weight decay on E / W_out's own parameters / "
          "the other matrices, the init std of E / W_out (— where tiedlm did not draw them), what `train.trainable` "
          "froze (its weight decay — (frozen): it is not in the optimizer), the input embedding scale, a head bias, "
          "biases of the blocks' matrices (as the built model has them), and V·d with its share of the variant's "
          "parameters.", "",
          markdown_table(["variant", "init", "W_out at the start", "lr", "weight decay E / W_out / other",
                          "init std E / W_out", "frozen", "embed scale", "head bias", "block biases", "V·d"], rows,
                         "lllllllrlll")]
    lines = confound_lines(c)
    md += ["", *(f"- {line}" for line in lines)] if lines else []
    old = [v.label for v in shown if v.ledger.source == FROM_CONFIG]
    if old:
        md += ["", f"Not recorded by the runs of {', '.join(old)} (written before the ledger): computed from their "
                   "stored configs and parameter counts."]
    return md
