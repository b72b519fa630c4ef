"""The comparison's sentences: the verdict on the primary endpoint, the confirmation by the other
split(s), what the seeds could detect and how many the observed effect needs, parameters and
training FLOPs (parameter-matched is not compute-matched), and the weight-decay caveat.

Every effect is a ratio of perplexities, exp(Δloss) − 1, with exp(CI) − 1 bounds."""

from __future__ import annotations

from ..formatting import MISSING, fmt, fmt_count, fmt_int, fmt_p, markdown_table, p_only, percent
from .comparison import Comparison
from .matching import PARAM_MATCH, FamilyMember, MatchFamily
from .stats import SEEDS_CAP, AdjustedLevel, TestResult, fmt_pvalue, fmt_threshold, holm, significant
from .variants import COMPUTE_MATCH, Contrast, SplitContrast, Variant

ROLES = ("The primary endpoint is the {primary} loss: it alone carries the verdict. {others} "
         "reported as confirmation, and the per-bucket differences are secondary (their p-values "
         "Holm-adjusted over the buckets of each contrast).")


def fmt_flops(x: float | None) -> str:
    """FLOPs in SI units: 30.0M, 12.3G, 4.56P (fmt_count stops at B)."""
    if x is None:
        return fmt(None)
    for div, suffix in ((1e18, "E"), (1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(x) >= div:
            return f"{x / div:.3g}{suffix}"
    return f"{x:g}"


def plural(n: int, word: str) -> str:
    return f"{n} {word}{'s' if n != 1 else ''}"


def test_words(d: TestResult) -> str:
    if d.test == "paired":
        return f"paired over {plural(d.n or 0, 'seed')}"
    return f"Welch, {d.n_a} vs {d.n_b} seeds"


def interval_words(d: SplitContrast) -> str:
    """'95% CI −4.01% to −2.20%, p=0.004, paired over 3 seeds', or why there is none."""
    if d.ci_low is None:
        return d.note or "no interval can be given"
    p = fmt_p(d.p_value) if d.p_value is not None else "p undefined"
    adjusted = getattr(d, "adjusted", None)  # a contrast judged at the sequential design's level
    if adjusted is not None and d.p_value is not None:
        p = f"{fmt_pvalue(d.p_value)} (sequential threshold p < {fmt_threshold(adjusted.threshold)})"
    return f"95% CI {percent(d.relative_ci_low)} to {percent(d.relative_ci_high)}, {p}, {test_words(d)}"


def roles(c: Comparison) -> str:
    """The one sentence that says which split is primary, which confirm, and what is secondary."""
    others = " and ".join(c.confirmations)
    others = f"{others[0].upper()}{others[1:]} {'is' if len(c.confirmations) == 1 else 'are'}" if others else \
        "No other split is"
    chose = (" Validation chose the compared weights, so its scores of them are shown but confirm nothing."
             if c.select == "best" else "")
    return ROLES.format(primary=c.primary, others=others) + chose


def verdict(label: str, ref: str, d: SplitContrast | None, split: str, member: FamilyMember | None = None,
            family: MatchFamily | None = None) -> str | None:
    """One sentence on the variant against its reference on the primary split; with --match, named
    as one of the two contrasts (`member`) and judged with Holm's procedure over them (`family`)."""
    if d is None or d.difference is None or d.relative is None:
        return None
    rel = d.relative
    if rel == 0:
        claim = f"has the same perplexity as **{ref}**"
    else:  # a tiny but consistent difference can be significant: never round it to "the same"
        shown = f"{abs(rel) * 100:.2f}" if abs(rel) >= 5e-5 else f"{abs(rel) * 100:.2g}"
        claim = f"has {shown}% {'lower' if rel < 0 else 'higher'} perplexity than **{ref}**"
    holm = member is not None and family is not None and len(family.members) > 1
    adjusted = _holm_words(member, family) if holm and d.ci_low is not None else ""
    grid = getattr(d, "p_holm", None) is not None
    if grid:
        adjusted = f"; Holm-adjusted over the grid's {d.holm_family} settings {fmt_p(d.p_holm)}"
    head = (f"**{label}** {claim} on {split}, the primary endpoint (perplexity {fmt(d.variant_mean)} vs "
            f"{fmt(d.baseline_mean)}; {interval_words(d)}{adjusted})")
    if member is not None:
        primary = " (the primary contrast)" if member.role == "primary" and holm else ""
        head = f"{member.words[0].upper()}{member.words[1:]}{primary}: {head}"
    adjusted = getattr(d, "adjusted", None)
    if d.significant is None or (adjusted is not None and d.p_value is None):
        end = "." if d.ci_low is None else ": no difference on any seed."
        return head + end + (f" (Sequential design: significance is judged at p < "
                             f"{fmt_threshold(adjusted.threshold)}, not 0.05.)" if adjusted is not None else "")
    if holm:
        return head + _holm_judgement(d, member, family)
    if adjusted is not None:
        return head + _adjusted_judgement(d, adjusted)
    if grid:
        includes = d.relative_ci_low is not None and d.relative_ci_low <= 0 <= d.relative_ci_high
        why = "the interval includes 0%" if includes else "its 95% interval, not adjusted, excludes 0%"
        return head + (": significant at 0.05 after Holm's adjustment over the settings." if d.significant else
                       f": not significant at 0.05 after Holm's adjustment over the settings ({why}).")
    return head + (": significant at 0.05." if d.significant else
                   ": not significant at 0.05 (the interval includes 0%).")


def _adjusted_judgement(d: SplitContrast, level: AdjustedLevel) -> str:
    """The end of a verdict judged at the sequential design's adjusted level, with its interval at
    that level at the last look."""
    interval = ""
    if level.ci_low is not None:
        interval = (f"; its {(1 - level.threshold) * 100:.2f}% interval, {percent(level.ci_low)} to "
                    f"{percent(level.ci_high)}, {'excludes' if d.significant else 'includes'} 0%")
    return (f": {'' if d.significant else 'not '}significant at the sequential design's adjusted level "
            f"(p < {fmt_threshold(level.threshold)} at {level.seeds} seeds{interval}).")


def _holm_words(member: FamilyMember, family: MatchFamily) -> str:
    """'; Holm-adjusted over the two contrasts p=0.020'; nothing under the sequential design, whose
    levels the judgement names."""
    return f"; Holm-adjusted over the two contrasts {fmt_p(member.p_holm)}" if member.p_holm is not None else ""


def _holm_judgement(d: SplitContrast, member: FamilyMember, family: MatchFamily) -> str:
    """The end of a --match verdict: significant or not with Holm's procedure over the two contrasts."""

    other = next(m for m in family.members if m is not member)
    if family.sequential:
        level = (f"the sequential design's adjusted level (p < {fmt_threshold(member.level)})"
                 if member.role == "primary" else f"{member.level:g}")
        how = (f"with Holm over the two contrasts (one of them first at its half level: p < "
               f"{fmt_threshold(member.half)} here or p < {fmt_threshold(other.half)} for the {other.words})")
    else:
        level, how = f"{member.level:g}", "after Holm's adjustment over the two contrasts"
    if d.significant:
        return f": significant at {level} {how}."
    includes = d.relative_ci_low is not None and d.relative_ci_low <= 0 <= d.relative_ci_high
    why = "the interval includes 0%" if includes else "its 95% interval, not adjusted, excludes 0%"
    return f": not significant at {level} {how} ({why})."


def confirmation(primary: SplitContrast | None, d: SplitContrast | None, split: str) -> str | None:
    """'test confirms: …' / 'test does not confirm: …' for a confirmation split."""
    if d is None or d.difference is None or primary is None:
        return None
    stats = f"{percent(d.relative)} ({interval_words(d)})"
    if primary.significant is None or d.significant is None:
        return f"{split}: {stats}."
    if primary.significant:
        same_way = (d.difference < 0) == (primary.difference < 0)
        return f"{split} {'confirms' if d.significant and same_way else 'does not confirm'}: {stats}."
    if d.significant:
        return (f"{split} does not confirm: it alone finds a significant difference, {stats}; the verdict stays with "
                "the primary endpoint.")
    return f"{split} confirms: no significant difference either, {stats}."


def seeds_sentence(d: SplitContrast | None) -> str | None:
    """What the seeds could detect (80% power, α = 0.05) and how many the observed effect needs:
    at the one-sided upper confidence bound of the seed-to-seed spread first (what the seeds can be
    trusted to see), then at the observed spread (stats.Power)."""
    pw = d.power if d else None
    if pw is None:
        return None
    if pw.mde is None:
        return (f"With {plural(pw.seeds, 'seed')} no interval can be given: at least 2 seeds per variant are "
                "needed for one, 3 or more for a useful one.")
    level = f"({pw.power:.0%} power, α = {pw.alpha:g})"
    if pw.mde == 0.0:
        return (f"The difference has no spread between seeds: any difference is detectable with "
                f"{plural(pw.seeds, 'seed')} {level}.")
    df = f"{d.df:.0f}" if float(d.df).is_integer() else f"{d.df:.1f}"
    dof = f"{df} degree{'' if df == '1' else 's'} of freedom"
    observed = percent(pw.observed_relative)
    if pw.seeds < 3 and pw.observed:  # a spread of 1 degree of freedom: its upper bound is no bound
        point = f"about {pw.seeds_needed}" if pw.seeds_needed is not None else f"more than {SEEDS_CAP:,}"
        need = (f"about {pw.seeds_needed_upper}" if pw.seeds_needed_upper is not None else
                f"more than {SEEDS_CAP:,}")
        return (f"{plural(pw.seeds, 'seed').capitalize()} cannot bound the effects they might miss: the seed-to-seed "
                f"spread has {dof}, and its one-sided "
                f"{pw.spread_confidence:.0%} upper bound is {pw.spread_factor:.2f}× the observed spread. "
                f"{need.capitalize()} seeds per variant would resolve the observed {observed} at that bound "
                f"({point} at the observed spread).")
    head = (f"Effects between {percent(-pw.mde_relative_down_upper)} and {percent(pw.mde_relative_upper)} may not be "
            f"detectable with {plural(pw.seeds, 'seed')} {level}, taking the seed-to-seed spread at its one-sided "
            f"{pw.spread_confidence:.0%} upper confidence bound ({pw.spread_factor:.2f}× the observed spread, which "
            f"has {dof}); at the observed spread itself, between {percent(-pw.mde_relative_down)} "
            f"and {percent(pw.mde_relative)}")
    if not pw.observed:
        return head + "; no difference was observed."
    point = f"about {pw.seeds_needed}" if pw.seeds_needed is not None else f"more than {SEEDS_CAP:,}"
    if pw.seeds_needed_upper is not None:
        return head + (f". About {pw.seeds_needed_upper} seeds per variant would resolve the observed {observed} "
                       f"at the bound ({point} at the observed spread).")
    if pw.seeds_needed is not None:
        return head + (f". The observed {observed} would need more than {SEEDS_CAP:,} seeds per variant at the bound "
                       f"({point} at the observed spread).")
    return head + f". The observed {observed} would need more than {SEEDS_CAP:,} seeds per variant."


def confounds_sentence(vs: Contrast) -> str | None:
    """What the variant differs from its reference in besides the tie (ledger.differences), when
    anything: a reader should not take the effect for the tie's alone."""
    own = getattr(vs, "tuned_differences", None)
    chose = f"Each is at its own tuned setting: {'; '.join(own)}." if own else ""
    if not vs.confounds:
        return chose or None
    also = f"Besides the tie{' and those' if own else ''}, it also differs from {vs.baseline} in: " \
           f"{'; '.join(vs.confounds)} (the confound ledger)."
    return f"{chose} {also}".strip()


def params_sentence(total: int | None, vs: Contrast) -> str | None:
    if vs.params_relative is None or total is None:
        return None
    if vs.params_relative == 0:
        return f"Same parameter count as {vs.baseline} ({fmt_int(total)})."
    more = "fewer" if vs.params_relative < 0 else "more"
    within = f", within the {PARAM_MATCH:.0%} that counts as parameter-matched" if vs.parameter_matched else ""
    return (f"It has {abs(vs.params_relative) * 100:.1f}% {more} parameters "
            f"({fmt_int(total)} vs {fmt_int(total - vs.params_difference)}{within}).")


def _relative(a: float | None, b: float | None) -> float | None:
    return a / b - 1.0 if a is not None and b else None


def _tokens(v: Variant | None) -> float | None:
    s = v.cost.get("tokens_seen") if v else None
    return s.mean if s else None


def _early_stop_flops(vs: Contrast, variant: Variant, reference: Variant) -> str:
    """FLOPs per token and total training FLOPs stated apart, when the variants saw different
    numbers of tokens (early stopping, or another budget): 'the same FLOPs per token (10.2M) and +11%
    total training FLOPs (1.9T vs 1.7T), because the **untied** runs stopped earlier (…)'."""
    per, per_b = vs.train_flops_per_token, vs.baseline_train_flops_per_token
    per_differs = abs(_relative(per, per_b) or 0.0) >= COMPUTE_MATCH
    per_part = (f"{percent(_relative(per, per_b), 0)} FLOPs per token ({fmt_flops(per)} vs {fmt_flops(per_b)})"
                if per_differs else f"the same FLOPs per token ({fmt_flops(per)})")
    total, total_b = variant.train_flops, reference.train_flops
    total_part = (f"the same total training FLOPs ({fmt_flops(total)})" if vs.compute_matched else
                  f"{percent(vs.train_flops_relative, 0)} total training FLOPs ({fmt_flops(total)} vs "
                  f"{fmt_flops(total_b)})")
    nv, nb = _tokens(variant), _tokens(reference)
    earlier = reference.label if nb < nv else variant.label
    why = (f"{'and' if per_differs else 'because'} the **{earlier}** runs stopped earlier ({fmt_count(min(nv, nb))} vs "
           f"{fmt_count(max(nv, nb))} tokens seen, mean over seeds)")
    return f"{per_part} and {total_part}, {why}"


def flops_sentence(vs: Contrast, variant: Variant | None = None, reference: Variant | None = None) -> str | None:
    """Parameter-matched is not compute-matched: say which this contrast is. FLOPs per token (the
    architecture) and total training FLOPs (per token × tokens seen) are told apart when the two
    variants saw different numbers of tokens (given both variants); otherwise they differ alike."""
    r = vs.train_flops_relative
    if r is None:
        return None
    nv, nb = _tokens(variant), _tokens(reference)
    if (variant and reference and nv and nb and variant.train_flops and reference.train_flops
            and abs(nv / nb - 1.0) >= COMPUTE_MATCH):
        what = _early_stop_flops(vs, variant, reference)
        if vs.parameter_matched:
            matched = "and compute-matched in total" if vs.compute_matched else "but not compute-matched"
            return f"It is parameter-matched to **{vs.baseline}** {matched}: {what}."
        return f"It spends {what}."
    if vs.compute_matched:
        return "It is parameter- and compute-matched." if vs.parameter_matched else None
    per = (f"{fmt_flops(vs.train_flops_per_token)} vs {fmt_flops(vs.baseline_train_flops_per_token)} "
           "per token") if vs.train_flops_per_token and vs.baseline_train_flops_per_token else ""
    what = f"{percent(r, 0)} training FLOPs" + (f" ({per})" if per else "")
    if vs.parameter_matched:
        return f"It is parameter-matched to **{vs.baseline}** but not compute-matched: {what}."
    return f"It spends {what}."


def adjust_grid(c: Comparison) -> None:
    """In a grid (each tied setting against its untied twin), the settings' contrasts on the primary
    split are one family: each is called significant only after Holm's adjustment over them (the
    tying line and the tying map adjust the same family). Nothing for a single contrast, or for the
    --match contrasts, which their own family judges."""
    if c.mode != "matched" or c.family is not None:
        return
    tests = [d for v in c.variants if v.vs_baseline is not None
             and (d := v.vs_baseline.split(c.primary)) is not None and d.p_value is not None]
    if len(tests) < 2:
        return
    for d, p in zip(tests, holm([d.p_value for d in tests])):
        d.p_holm, d.holm_family, d.significant = p, len(tests), significant(p)


def verdicts_for(v: Variant, c: Comparison) -> list[str]:
    """The variant's verdict on the primary split (with parameters and FLOPs), one confirmation per
    other split, and the seeds sentence; none for a variant without a contrast."""
    vs = v.vs_baseline
    if vs is None:
        return []
    reference = next((x for x in c.variants if x.label == vs.baseline), None)
    both = v.runs + (reference.runs if reference is not None else [])
    if c.at_chance and all(name in c.at_chance for name in both):  # the unigram guard: no verdict to draw
        return [f"**{v.label}** against **{vs.baseline}**: no verdict. None of their runs beats the unigram model of "
                f"its training split on {c.primary}: they have not learned from context, so their difference says "
                "nothing about tying (the table shows it, untested) — train longer (train.max_tokens or "
                "train.max_steps), or check train.lr and train.warmup_steps."]
    main = vs.split(c.primary)
    family = c.family if c.family is not None and c.family.split == c.primary else None
    first = verdict(v.label, vs.baseline, main, c.primary, family.member(v.label) if family else None, family)
    if first is None:
        return []
    extra = [s for s in (params_sentence(v.params.get("total"), vs), flops_sentence(vs, v, reference),
                         confounds_sentence(vs)) if s]
    lines = [" ".join([first] + extra)]
    lines += [line for s in c.confirmations if (line := confirmation(main, vs.split(s), s))]
    seeds = seeds_sentence(main)
    return lines + ([seeds] if seeds else [])


def decay_line(c: Comparison) -> str | None:
    """One line when embeddings are weight-decayed: tying changes what decay does to rare rows."""
    def decayed(v: Variant) -> bool:
        return v.config.train.decay_embeddings and v.config.train.weight_decay > 0

    if not any(decayed(v) for v in c.variants):
        return None
    return ("Embeddings are weight-decayed (`train.decay_embeddings: true`): decay shrinks the rows of an untied E "
            "that get no gradient (tokens absent from a batch: the rare ones), while tying gives those rows gradient "
            "from the output side, so tying also changes what decay does (`configs/decay-ablation.yaml` separates the two).")


def family_markdown(c: Comparison) -> list[str]:
    """comparison.md's table of the two --match contrasts against untied on the primary split: the
    effect, its 95% interval, the p-value, Holm's adjusted one (or the levels under the sequential
    design) and the judgement."""

    family = c.family
    if family is None or len(family.members) < 2:
        return []
    rows = []
    for m in family.members:
        d = c.variant(m.label).contrast(family.split)
        ci = (f"{percent(d.relative_ci_low)} to {percent(d.relative_ci_high)}" if d.relative_ci_low is not None
              else "no interval")
        held = p_only(m.p_holm) if m.p_holm is not None else \
            f"p < {fmt_threshold(m.half)}, then p < {fmt_threshold(m.level)}"
        rows.append([m.words + (" (primary)" if m.role == "primary" else ""),
                     f"**{m.label}** vs **{family.reference}**", percent(d.relative), ci, p_only(d.p_value), held,
                     "yes" if m.significant else "no" if m.significant is not None else MISSING])
    if family.sequential:
        how = ("The sequential design (`--seeds auto`) decided on the primary contrast, tied vs untied at equal "
               "architecture, and its levels are the design's thresholds at the last look, at α = 0.05 and at α/2 "
               "(the same design calibrated at 0.025); the matched contrast's are 0.05 and 0.025. Holm's procedure "
               "over the two: one contrast must pass its half level before either is judged at its full one. The "
               "matched contrast's seeds were chosen by the other contrast, which shares the untied runs, so its "
               "test is the fixed-seeds one at a number of seeds chosen by the data.")
        head = "levels (Holm)"
    else:
        how = ("Holm's procedure over the two (the smaller p-value doubled, the larger kept unless the first "
               "exceeds it), each judged at 0.05; the 95% intervals are each contrast's own, not adjusted.")
        head = "Holm p"
    return ["", f"### The two contrasts ({family.split})", "",
            f"The untied model is contrasted twice: {family.primary.words} (the primary contrast) and "
            f"{family.members[-1].words}. " + how, "",
            markdown_table(["contrast", "variants", "effect", "95% CI", "p", head, "significant"], rows, "llrrrrl")]
