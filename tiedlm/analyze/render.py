"""analysis.md, analysis.json and the analysis plots of one run."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..figures import figure, plain_ticks
from ..formatting import fmt, fmt_int, markdown_table
from ..perplexity import perplexity
from . import geometry as g
from ..files import atomic_write_text, json_text, recording
from ..runs import AGAIN_HINT, writing

ANALYSIS_JSON = "analysis.json"  # tiedlm.analyze has them from here: render imports nothing of the package
ANALYSIS_MD = "analysis.md"
PLOTS = {"norms": "analysis_norms.png", "spectrum": "analysis_spectrum.png", "cosine": "analysis_pair_cosine.png"}
TITLE = "# What the two matrices learned: "  # analysis.md's first line, before the run's name


def analysis_files(tied: bool) -> list[str]:
    """The files an analysis writes (a tied run has no pair-cosine plot)."""
    return [ANALYSIS_JSON, ANALYSIS_MD, PLOTS["norms"], PLOTS["spectrum"], *([] if tied else [PLOTS["cosine"]])]


def write_analysis(result: dict, arrays: dict, out: Path, overwrite: bool = False,
                   overwrite_option: str = "--overwrite") -> None:
    """The files into out, recorded there as tiedlm's (files.recording): a file of one of their
    names that tiedlm did not write is refused unless `overwrite`, before anything is written."""

    names = analysis_files(arrays["W"] is None)
    with recording(out, names, overwrite_option, overwrite):
        _plot_norms(arrays, out / PLOTS["norms"])
        _plot_spectrum(result, out / PLOTS["spectrum"])
        if arrays["W"] is not None:
            _plot_cosines(arrays, out / PLOTS["cosine"])
        text = json_text(result, indent=2) + "\n"
        with writing(out / ANALYSIS_JSON, AGAIN_HINT):
            atomic_write_text(out / ANALYSIS_JSON, text)
        text = to_markdown(result)
        with writing(out / ANALYSIS_MD, AGAIN_HINT):
            atomic_write_text(out / ANALYSIS_MD, text)


# ------------------------------------------------------------------------- analysis.md


def tie_kind(r: dict) -> str:
    """How the run's tie is named: its config's label (Tie.label: tied, untied, projection,
    lowrank r=8), or "untied at step N" once an untie_at run has split."""
    if r.get("untied_at_step"):
        return "untied at step " + fmt_int(r["untied_at_step"])
    return r.get("tie_label") or ("tied" if r["tied"] else "untied")  # an analysis.json without the label


def to_markdown(r: dict) -> str:
    state = ", still training: its latest checkpoint" if r["still_training"] else ""
    md = [f"{TITLE}{r['run']}", "",
          f"{tie_kind(r)}; checkpoint `{r['checkpoint']}`{state}. V = {fmt_int(r['vocab_size'])} token rows "
          f"(padding rows left out), d = {r['n_embd']}. Anisotropy uses {fmt_int(r['anisotropy_pairs'])} random "
          f"row pairs; neighbours use {fmt_int(r['sample'])} sampled tokens (seed {r['seed']}).", ""]
    md += _md_matrices(r) + _md_pair(r) + _md_direct(r) + _md_plots(r)
    return "\n".join(md) + "\n"


def _md_matrices(r: dict) -> list[str]:
    mats = r["matrices"]
    cols = list(mats)
    rows = [
        ["norm–frequency Spearman ρ (seen tokens)", *(fmt(mats[m]["norm_frequency_spearman"], 3) for m in cols)],
        ["mean row norm", *(fmt(mats[m]["mean_norm"], 3) for m in cols)],
        ["anisotropy: mean cosine of random row pairs", *(fmt(mats[m]["anisotropy"]["mean_cosine"], 3) for m in cols)],
        ["top principal direction's share of variance (centred)",
         *(fmt(mats[m]["anisotropy"]["top_pc_share"], 3) for m in cols)],
        ["common direction's share, ‖mean row‖² / mean ‖row‖²",
         *(fmt(mats[m]["anisotropy"]["mean_direction_share"], 3) for m in cols)],
        [f"effective rank (of {r['n_embd']})", *(fmt(mats[m]["effective_rank"], 1) for m in cols)],
    ]
    names = [b["name"] for b in mats["E"]["norms_by_bucket"]]
    by_bucket = [[f"{m} mean norm", *(fmt(b["mean_norm"], 3) for b in mats[m]["norms_by_bucket"])] for m in cols]
    types = ["types", *(fmt_int(b["types"]) for b in mats["E"]["norms_by_bucket"])]
    return ["## Each matrix", "", markdown_table(["", *cols], rows, "l" + "r" * len(cols)), "",
            "Row norm by training-frequency bucket (types ranked by their count in the training split):", "",
            markdown_table(["", *names], [types, *by_bucket], "l" + "r" * len(names)), ""]


def _md_pair(r: dict) -> list[str]:
    p = r["pair"]
    if p.get("tied"):
        return ["## The pair", "", "Tied: E and W_out are one matrix, so every pair figure is 1 (cosine, CKA) or 0 "
                "(drift) by construction, and there are no W_out-only figures.", ""]
    drift = "relative drift ‖E − W_out‖ / ‖E‖" + (" since the split" if r.get("untied_at_step") else "")
    nb = p.get("neighbours")
    rows = [["mean cosine of e_t and w_t", fmt(p["cosine"], 3)],
            ["after the rotation of E that maximises it (orthogonal Procrustes on unit rows)", fmt(p["aligned_cosine"], 3)],
            ["linear CKA of E and W_out", fmt(p["cka"], 3)]]
    if nb:
        rows.append([f"overlap of the {nb['k']} nearest neighbours (cosine; {fmt_int(nb['sampled'])} sampled tokens)",
                     fmt(nb["mean"], 3)])
    rows.append([drift, fmt(p["relative_drift"], 3)])
    names = [b["name"] for b in p["by_bucket"]]
    by = [["cosine", *(fmt(b["cosine"], 3) for b in p["by_bucket"])],
          ["aligned cosine", *(fmt(b["aligned_cosine"], 3) for b in p["by_bucket"])]]
    return ["## The pair", "", markdown_table(["", "value"], rows, "lr"), "",
            "By training-frequency bucket:", "", markdown_table(["", *names], by, "l" + "r" * len(names)), "",
            "A cosine near 0 with an aligned cosine near 1 means one geometry in another orientation (what tying "
            "asks for, up to a rotation); a low aligned cosine means the two matrices arrange the tokens "
            "differently.", ""]


# the direct path's final norm (measures.final_norm_args) as analysis.md writes it
_NORM_NAMES = {"layernorm": "LN_f", "rmsnorm": "RMSNorm_f"}


def _md_direct(r: dict) -> list[str]:
    d = r["direct_path"]
    if d.get("skipped"):
        return ["## The direct path", "", d["skipped"]]
    n = _NORM_NAMES.get(d.get("final_norm"), "LN_f")  # an analysis.json from before final_norm: a LayerNorm
    rows = [[f"W_out · {n}(E[t]), this model's direct path", fmt(d["nll"], 4), fmt(d["perplexity"], 2),
             fmt(d.get("bits_per_byte"), 4)]]
    if d.get("with_e_as_w_out"):
        w = d["with_e_as_w_out"]
        rows.append([f"E · {n}(E[t]), the same path with W_out := E (what tying imposes)", fmt(w["nll"], 4),
                     fmt(w["perplexity"], 2), fmt(w.get("bits_per_byte"), 4)])
    if r.get("model_loss") is not None:
        rows.append(["the whole model (final evaluation, every layer)", fmt(r["model_loss"], 4),
                     fmt(perplexity(r["model_loss"]), 2), "—"])
    if r.get("floor"):
        f = r["floor"]
        rows.append([f"the language's true model on this split ({f.get('label')}; no model does better)",
                     fmt(f["nats_per_token"], 4), fmt(f.get("perplexity"), 2), fmt(f.get("bits_per_byte"), 4)])
    md = ["## The direct path", "",
          f"The embedding straight into the head, no layer between: a bigram model, scored on the first "
          f"{fmt_int(d['pairs'])} consecutive token pairs of {d['split']} ({fmt_int(d['distinct_prev'])} distinct "
          "previous tokens).", "",
          markdown_table(["path", "loss (nats/token)", "perplexity", "bits/byte"], rows, "lrrr"), "",
          "Bits per byte give each pair's predicted token the split's mean bytes per token, so that paths of "
          "different tokenizers can be read side by side.", "",
          f"Its bilinear form W_out · diag(γ_f) · Eᵀ ({n}'s gain folded in) is {100 * d['symmetric_share']:.1f}% "
          f"symmetric and {100 * d['antisymmetric_share']:.1f}% antisymmetric (shares of its squared Frobenius norm). "
          "Tied, it is exactly symmetric: the direct path cannot say \"b follows a\" without saying \"a follows b\"."]
    lang = r.get("language")
    if lang:
        md += ["", f"The synthetic language's true bigrams are asymmetric: {100 * lang['without_reverse']:.1f}% of its "
                   f"{fmt_int(lang['transitions'])} class transitions never occur in reverse, and the joint word-bigram "
                   f"distribution is {100 * lang['joint_antisymmetric_share']:.1f}% antisymmetric."]
    return md + [""]


def _md_plots(r: dict) -> list[str]:
    md = ["## Plots", "", f"![row norm against training count]({PLOTS['norms']})", "",
          "Row norm against the token's count in the training split (log scale), E and W_out overlaid: "
          "how much each matrix grows the rows of frequent and rare tokens.", "",
          f"![singular value spectra]({PLOTS['spectrum']})", "",
          "Singular values over the largest (log scale): a fast fall is a matrix that uses few directions.", ""]
    if not r["tied"]:
        md += [f"![pair cosine against training count]({PLOTS['cosine']})", "",
               "Cosine of e_t and w_t against the token's training count, raw and after the rotation that maximises the mean cosine: "
               "where the two matrices agree on a token's place.", ""]
    return md


# ------------------------------------------------------------------------- plots


def _seen(arrays: dict):
    import numpy as np

    counts = np.asarray(arrays["counts"])
    return counts, counts > 0


def _scatter_by_count(arrays: dict, path: Path, title: str, ylabel: str, series: list) -> None:
    """One value per token (series of (label, values, colour)) against its training count, log x."""
    counts, seen = _seen(arrays)
    with figure(path, title) as ax:
        for label, values, color in series:
            ax.scatter(counts[seen], values[seen], s=4, alpha=0.35, color=color, label=label, linewidths=0)
        ax.set_xscale("log")
        plain_ticks(ax, "x")
        ax.set_xlabel("count in the training split (log scale)")
        ax.set_ylabel(ylabel)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8, markerscale=3)


def _plot_norms(arrays: dict, path: Path) -> None:

    series = [(label, g.row_norms(M).numpy(), color)
              for label, M, color in (("E", arrays["E"], "C0"), ("W_out", arrays["W"], "C1")) if M is not None]
    _scatter_by_count(arrays, path, "Row norm against training frequency", "row norm", series)


def _plot_spectrum(result: dict, path: Path) -> None:
    with figure(path, "Singular value spectra (over the largest)") as ax:
        for i, (label, m) in enumerate(result["matrices"].items()):
            s = m["singular_values"]
            if s and s[0]:
                ax.plot(range(1, len(s) + 1), [x / s[0] for x in s], color=f"C{i}",
                        label=f"{label} (effective rank {m['effective_rank']:.1f})")
        ax.set_yscale("log")
        ax.set_xlabel("index")
        ax.set_ylabel("singular value / largest (log scale)")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)


def _plot_cosines(arrays: dict, path: Path) -> None:

    E, W = arrays["E"], arrays["W"]
    series = [("raw", g.pair_cosines(E, W).numpy(), "C0"),
              ("after the rotation that maximises the mean cosine", g.aligned_cosines(E, W).numpy(), "C3")]
    _scatter_by_count(arrays, path, "Cosine of e_t and w_t against training frequency", "cosine", series)


def summary_row(analysis: dict) -> dict[str, Any]:
    """The few figures a comparison shows per run."""
    d = analysis.get("direct_path") or {}
    pair = analysis.get("pair") or {}
    return {"pair_cosine": pair.get("cosine"), "aligned_cosine": pair.get("aligned_cosine"), "cka": pair.get("cka"),
            "norm_frequency_spearman": ((analysis.get("matrices") or {}).get("E") or {}).get("norm_frequency_spearman"),
            "direct_path_nll": d.get("nll"), "direct_path_nll_e_as_w_out": (d.get("with_e_as_w_out") or {}).get("nll"),
            "direct_path_bpb": d.get("bits_per_byte"),
            "direct_path_bpb_e_as_w_out": (d.get("with_e_as_w_out") or {}).get("bits_per_byte"),
            "symmetric_share": d.get("symmetric_share")}
