"""compare/tying_map.py: the tying map of a two-key grid, built from constructed matched contrasts:
the cells and their significance (by the interval), the crossover edges, when there is no map,
missing cells, the sentences (a sign change between non-significant cells is said to be so),
comparison.json's entry, and the PNG (its colours: blue where tying helps, red where it hurts)."""

import json
import math
import subprocess
import sys

import pytest

from tiedlm.compare.grid import MatchedContrast
from tiedlm.compare.plots import plot_tying_map
from tiedlm.compare.stats import t_ppf
from tiedlm.compare.tying_map import TyingMap, tying_map
from tiedlm.compare.variants import Contrast, SplitContrast

PNG = b"\x89PNG\r\n\x1a\n"
N, F = "model.n_embd", "data.train_fraction"
WIDTHS, FRACTIONS = (64, 128, 256), (0.25, 0.5, 1.0)


def contrast(effect, half=0.01, seeds=3, ci=True, significant=None, split="validation"):
    """A SplitContrast with effect ± half on the ratio scale (and its log on the loss scale)."""
    lo, hi = (effect - half, effect + half) if ci else (None, None)
    se = (math.log1p(hi) - math.log1p(lo)) / (2 * t_ppf(0.975, seeds - 1)) if ci else None  # what the interval says
    d = SplitContrast(test="paired", difference=math.log1p(effect), ci_low=math.log1p(lo) if ci else None,
                      ci_high=math.log1p(hi) if ci else None, p_value=0.01 if ci and (lo > 0 or hi < 0) else 0.4,
                      n=seeds, relative=effect, relative_ci_low=lo, relative_ci_high=hi,
                      significant=significant, se=se, df=seeds - 1 if ci else None)
    return Contrast(baseline="untied", kind="matched", splits={split: d})


def matched(setting, effect, **kw):
    label = ", ".join(f"{k.split('.')[-1]}={v}" for k, v in setting.items())
    return MatchedContrast(setting=dict(setting), label=label, tied=f"tied, {label}", untied=f"untied, {label}",
                           contrast=contrast(effect, **kw), embedding_share=None, tied_params=None, untied_params=None)


def grid(table, half=0.01, skip=()):
    """Matched contrasts over n_embd (rows) × train_fraction (columns); table[i][j] is the effect at
    WIDTHS[i], FRACTIONS[j]; cells in skip are left out."""
    return [matched({N: n, F: f}, table[i][j], half=half) for i, n in enumerate(WIDTHS)
            for j, f in enumerate(FRACTIONS) if (n, f) not in skip]


# hurts at small width × much data, helps at large width × little data; the sign changes on a staircase
STAIRS = [[+0.02, +0.03, +0.05],
          [-0.02, +0.03, +0.03],
          [-0.04, -0.02, +0.02]]
# helps only at n_embd=128, train_fraction=0.5: a sign change in both directions along each key
VALLEY = [[+0.02, +0.03, +0.05],
          [+0.02, -0.03, +0.03],
          [+0.04, +0.02, +0.02]]


# ------------------------------------------------------------------ the cells and the crossover


def test_rows_columns_and_the_exact_crossover_edges_on_a_staircase():
    t = tying_map(grid(STAIRS), "validation")
    assert isinstance(t, TyingMap)
    assert (t.row_key, t.col_key, t.row_short, t.col_short) == (N, F, "n_embd", "train_fraction")
    assert t.rows == [64, 128, 256] and t.cols == [0.25, 0.5, 1.0]
    assert t.cell(256, 0.25).effect == pytest.approx(-0.04) and t.cell(64, 1.0).effect == pytest.approx(0.05)
    assert t.cell(128, 0.5).tied == "tied, n_embd=128, train_fraction=0.5"
    assert t.crossover == [((64, 0.25), (128, 0.25)), ((128, 0.25), (128, 0.5)),
                           ((128, 0.5), (256, 0.5)), ((256, 0.5), (256, 1.0))]


def test_cells_whose_runs_do_not_beat_the_unigram_model_leave_the_surface_and_the_crossover():
    """An effect between models at chance says nothing about tying: the cell stays on the map, named,
    but places no crossover edge and no point of the surface."""
    from types import SimpleNamespace

    from tiedlm.compare.surface import fit_surface

    ms = grid(STAIRS)

    def variants(chance):
        out = []
        for m in ms:
            for label, seeds in ((m.tied, [0, 2] if (m.setting[N], m.setting[F]) in chance else []), (m.untied, [])):
                out.append(SimpleNamespace(label=label, n_seeds=3,
                                           metrics={"validation": SimpleNamespace(at_unigram=seeds)}))
        return out

    assert tying_map(ms, "validation", variants(set())).crossover == tying_map(ms, "validation").crossover
    t = tying_map(ms, "validation", variants({(256, 0.25)}))
    assert t.cell(256, 0.25).at_unigram == "2 of 6" and t.cell(256, 0.25).effect == pytest.approx(-0.04)
    assert t.crossover == [((64, 0.25), (128, 0.25)), ((128, 0.25), (128, 0.5)),
                           ((128, 0.5), (256, 0.5)), ((256, 0.5), (256, 1.0))]  # no edge touched (256, 0.25)
    t = tying_map(ms, "validation", variants({(128, 0.25)}))
    assert ((64, 0.25), (128, 0.25)) not in t.crossover and ((128, 0.25), (128, 0.5)) not in t.crossover
    others = [(n, f, t.cell(n, f).difference, t.cell(n, f).se) for n in WIDTHS for f in FRACTIONS if (n, f) != (128, 0.25)]
    alone = fit_surface(others, t.row_short, t.col_short)
    assert t.surface.to_json() == alone.to_json()
    assert any(line.startswith("Left out of the surface and the crossover") and "n_embd=128, train_fraction=0.25 "
               "(2 of 6 runs)" in line for line in t.summary_lines())
    # where tying "helps" only at cells at chance, the map says it hurts everywhere else: no crossover
    t = tying_map(ms, "validation", variants({(128, 0.25), (256, 0.25), (256, 0.5)}))
    assert t.crossover == []
    assert ("No crossover: tying hurts at every cell with a result whose runs beat the unigram model (by the point "
            "estimates).") in t.summary_lines()


def test_a_staircase_is_said_as_where_tying_starts_to_help_along_the_row_key():
    lines = tying_map(grid(STAIRS), "validation").summary_lines()
    head = lines.index("Crossover along n_embd (by the point estimates, at each train_fraction):")
    assert lines[head + 1] == ("- at train_fraction=0.25: tying starts to help above n_embd=64 (hurts at 64, helps "
                               "at 128); significant: both cells' intervals exclude zero.")
    assert lines[head + 2].startswith("- at train_fraction=0.5: tying starts to help above n_embd=128 (hurts at 128, "
                                      "helps at 256)")
    assert lines[head + 3] == "- at train_fraction=1.0: no sign change (tying hurts at every n_embd with a result)."
    assert lines[-1].startswith("The crossover follows the point estimates")


def test_a_boundary_along_no_single_key_lists_the_edges():
    t = tying_map(grid(VALLEY), "validation")
    assert set(t.crossover) == {((64, 0.5), (128, 0.5)), ((128, 0.25), (128, 0.5)),
                                ((128, 0.5), (128, 1.0)), ((128, 0.5), (256, 0.5))}
    lines = t.summary_lines()
    assert "starts to help" not in "\n".join(lines)
    assert any("no single boundary along either key" in line for line in lines)
    assert ("- n_embd=128, train_fraction=0.25 (+2.00%) | n_embd=128, train_fraction=0.5 (−3.00%): significant: "
            "both cells' intervals exclude zero.") in lines
    assert sum(line.startswith("- ") for line in lines) == 4


def test_rows_follow_the_order_of_the_setting_keys():
    swapped = [matched({F: m.setting[F], N: m.setting[N]}, m.split("validation").relative) for m in grid(STAIRS)]
    t = tying_map(swapped, "validation")
    assert (t.row_key, t.col_key) == (F, N) and t.rows == [0.25, 0.5, 1.0] and t.cols == [64, 128, 256]
    assert ((0.25, 64), (0.25, 128)) in t.crossover  # the same edge, transposed
    assert ((64, 0.25), (128, 0.25)) not in t.crossover


def test_the_column_key_describes_the_boundary_when_the_row_key_cannot():
    # helps at little data, hurts at much: along n_embd no line changes sign, along train_fraction each does
    t = tying_map(grid([[-0.02, +0.02, +0.03]] * 3), "validation")
    assert t.crossover == [((n, 0.25), (n, 0.5)) for n in WIDTHS]
    lines = t.summary_lines()
    assert "Crossover along train_fraction (by the point estimates, at each n_embd):" in lines
    assert ("- at n_embd=64: tying starts to help below train_fraction=0.5 (helps at 0.25, hurts at 0.5); "
            "significant: both cells' intervals exclude zero.") in lines


def test_tying_that_helps_at_small_values_starts_to_help_below():
    mirrored = [[-x for x in row] for row in STAIRS]  # helps at small width × much data
    lines = "\n".join(tying_map(grid(mirrored), "validation").summary_lines())
    assert "tying starts to help below n_embd=128 (helps at 64, hurts at 128)" in lines
    assert "- at train_fraction=1.0: no sign change (tying helps at every n_embd with a result)." in lines
    assert "above" not in lines.split("Crossover")[1].split("The crossover follows")[0]


def test_no_crossover_when_the_sign_never_changes():
    t = tying_map(grid([[0.01, 0.02, 0.03]] * 3), "validation")
    assert t.crossover == []
    assert "No crossover: tying hurts at every cell with a result (by the point estimates)." in t.summary_lines()


def test_an_effect_of_exactly_zero_has_no_sign_and_borders_no_edge():
    t = tying_map(grid([[0.02, 0.0, -0.02], [0.02, 0.03, 0.01], [0.02, 0.03, 0.01]]), "validation")
    assert t.cell(64, 0.5).sign == 0
    assert t.crossover == [((64, 1.0), (128, 1.0))]  # none on either side of the zero cell
    flat = tying_map(grid([[0.02, 0.0, 0.02]] * 3), "validation")
    assert flat.crossover == []
    assert ("No crossover: tying hurts at every cell with a nonzero effect (by the point estimates)."
            in flat.summary_lines())


# ------------------------------------------------------------------ significance


def test_significance_follows_the_intervals():
    # half-widths: 0.01 around ±0.02..0.05 excludes zero; 0.05 around the same includes it
    ms = grid(STAIRS, half=0.01)
    ms[0] = matched({N: 64, F: 0.25}, 0.02, half=0.05)  # +2% with −3% to +7%: not significant
    t = tying_map(ms, "validation")
    assert t.cell(64, 0.25).significant is False
    assert t.cell(128, 0.25).significant is True and t.cell(256, 1.0).significant is True
    assert t.cell(64, 0.25).ci_low == pytest.approx(-0.03) and t.cell(64, 0.25).ci_high == pytest.approx(0.07)
    lines = t.summary_lines()
    helps = next(line for line in lines if line.startswith("Tying helps significantly"))
    hurts = next(line for line in lines if line.startswith("Tying hurts significantly"))
    assert helps.startswith("Tying helps significantly (95% CI below zero) at 3 of 9 cells: ")
    assert "n_embd=256, train_fraction=0.25 (−4.00%, 95% CI −5.00% to −3.00%)" in helps
    assert hurts.startswith("Tying hurts significantly (95% CI above zero) at 5 of 9 cells: ")
    assert "n_embd=64, train_fraction=0.25" not in hurts  # not significant, though positive
    assert "No significant effect at 1 cell: n_embd=64, train_fraction=0.25." in lines
    # one significant side only: the sign change is not established
    assert ("- at train_fraction=0.25: tying starts to help above n_embd=64 (hurts at 64, helps at 128); not "
            "established: only n_embd=128, train_fraction=0.25 is significant") in "\n".join(lines)


def test_the_interval_decides_not_the_flag_and_no_interval_is_no_mark():
    ms = grid(STAIRS)
    ms[4] = MatchedContrast(setting={N: 128, F: 0.5}, label="x", tied="t", untied="u",
                            contrast=contrast(0.03, significant=False), embedding_share=None,
                            tied_params=None, untied_params=None)
    ms[8] = MatchedContrast(setting={N: 256, F: 1.0}, label="y", tied="t", untied="u",
                            contrast=contrast(0.02, ci=False, significant=True), embedding_share=None,
                            tied_params=None, untied_params=None)
    t = tying_map(ms, "validation")
    assert t.cell(128, 0.5).significant is True  # 2% to 4% excludes zero, whatever the flag says
    assert t.cell(256, 1.0).significant is None and t.cell(256, 1.0).ci_low is None
    assert "n_embd=256, train_fraction=1.0" not in [s for s in t.summary_lines() if "significantly" in s][1]


def test_a_sign_change_between_non_significant_cells_is_said_to_be_not_significant():
    wide = [[0.01, 0.02], [-0.01, 0.02]]  # ±5% intervals everywhere: nothing significant
    ms = [matched({N: n, F: f}, wide[i][j], half=0.05) for i, n in enumerate((64, 128))
          for j, f in enumerate((0.25, 0.5))]
    t = tying_map(ms, "validation")
    assert t.crossover == [((64, 0.25), (128, 0.25)), ((128, 0.25), (128, 0.5))]
    assert all(c.significant is False for c in t.cells.values())
    lines = t.summary_lines()
    crossing = next(line for line in lines if "starts to help" in line)
    assert crossing.endswith("not significant: neither cell's interval excludes zero.")
    assert "Tying helps significantly (95% CI below zero) at 0 of 4 cells." in lines
    assert [e["significant_sides"] for e in t.to_json()["crossover"]] == [0, 0]


# ------------------------------------------------------------------ no map


@pytest.mark.parametrize("settings", [
    [{N: 64}, {N: 128}, {N: 256}],  # one key
    [{N: n, F: f, "train.lr": 0.001} for n in (64, 128) for f in (0.5, 1.0)],  # three keys
    [{N: n, "data.source": s} for n in (64, 128) for s in ("a", "b")],  # a key with text values
    [{N: n, "model.bias": b} for n in (64, 128) for b in (True, False)],  # booleans are no numbers
    [{N: n, F: f} for n in (64,) for f in (0.25, 0.5, 1.0)],  # one row only
    [{N: n, F: f} for n in (64, 128, 256) for f in (0.5,)],  # one column only
])
def test_no_map_without_two_numeric_keys_and_two_rows_and_columns(settings):
    assert tying_map([matched(s, 0.01) for s in settings], "validation") is None


def test_a_text_key_that_a_numeric_axis_determines_is_set_aside_and_named():
    """A paired grid axis, tokenizer.kind beside tokenizer.vocab_size: the map's axes are the two
    numeric keys, and the summary says which kind sits at which vocabulary sizes."""
    kinds = {512: "bpe", 2048: "bpe", 10000: "word"}
    ms = [matched({"tokenizer.kind": kinds[v], "tokenizer.vocab_size": v, F: f}, 0.01 * i - 0.02)
          for i, (v, f) in enumerate((v, f) for v in kinds for f in (0.5, 1.0))]
    t = tying_map(ms, "validation")
    assert (t.row_key, t.col_key) == ("tokenizer.vocab_size", F) and t.rows == [512, 2048, 10000]
    assert t.follows == {"tokenizer.kind": {"by": "tokenizer.vocab_size", "values": {"bpe": [512, 2048],
                                                                                    "word": [10000]}}}
    assert "tokenizer.kind follows tokenizer.vocab_size (bpe at 512, 2048; word at 10000), so it is not an axis of " \
           "its own." \
        in t.summary_lines()
    assert t.to_json()["follows"] == t.follows and len(t.cells) == 6
    # a text key the numeric keys do not determine leaves three keys: no map
    mixed = [matched({"tokenizer.kind": k, "tokenizer.vocab_size": v, F: f}, 0.01)
             for k in ("bpe", "word") for v in (512, 2048) for f in (0.5, 1.0)]
    assert tying_map(mixed, "validation") is None


def test_no_map_for_nothing_or_two_contrasts_at_one_setting():
    assert tying_map([], "validation") is None
    ms = grid(STAIRS)
    assert tying_map(ms + [matched({N: 64, F: 0.25}, 0.01)], "validation") is None  # untie_at beside tied


def test_a_split_the_contrasts_lack_gives_no_map():
    ms = grid(STAIRS)
    assert tying_map(ms, "test") is None  # no cell has an effect on test
    assert tying_map(ms, "validation") is not None


# ------------------------------------------------------------------ missing cells


def test_missing_cells_are_absent_and_break_no_edge_across_them():
    t = tying_map(grid(STAIRS, skip={(128, 0.5)}), "validation")
    assert (128, 0.5) not in t.cells and t.cell(128, 0.5) is None and t.known(128, 0.5) is None
    assert t.rows == [64, 128, 256] and t.cols == [0.25, 0.5, 1.0]
    # the two edges that touched the missing cell are gone, the others stay
    assert set(t.crossover) == {((64, 0.25), (128, 0.25)), ((256, 0.5), (256, 1.0))}
    lines = t.summary_lines()
    assert lines[0].startswith("Tying map on validation perplexity, n_embd (rows) × train_fraction (columns): "
                               "8 of 9 cells have a result")
    assert "No result on validation at: n_embd=128, train_fraction=0.5." in lines
    assert [c for c in t.to_json()["cells"] if (c["row"], c["col"]) == (128, 0.5)] == []


def test_a_contrast_without_the_split_is_a_missing_cell():
    ms = grid(STAIRS)
    ms[4] = matched({N: 128, F: 0.5}, 0.03, split="test")  # no validation result at this setting
    t = tying_map(ms, "validation")
    assert t.cell(128, 0.5) is not None and t.cell(128, 0.5).effect is None and t.known(128, 0.5) is None
    assert "No result on validation at: n_embd=128, train_fraction=0.5." in t.summary_lines()
    assert all((128, 0.5) not in edge for edge in t.crossover)


def test_a_sign_change_hidden_behind_missing_cells_places_no_edge():
    ms = [matched({N: n, F: f}, e) for n in (64, 128) for f, e in ((0.25, 0.02), (1.0, -0.02))]
    ms += [matched({N: 64, F: 0.5}, 0.01, split="test")]  # the middle column has no validation result
    t = tying_map(ms, "validation")
    assert t.cols == [0.25, 0.5, 1.0] and t.crossover == []
    assert any("no two neighbouring cells with a result differ in sign" in s for s in t.summary_lines())


# ------------------------------------------------------------------ comparison.json


def test_to_json_round_trips_through_strict_json():
    t = tying_map(grid(STAIRS, skip={(256, 1.0)}), "validation")
    data = t.to_json()
    assert json.loads(json.dumps(data, allow_nan=False)) == data
    assert data["split"] == "validation" and data["row_key"] == N and data["cols"] == [0.25, 0.5, 1.0]
    assert len(data["cells"]) == 8
    cell = next(c for c in data["cells"] if (c["row"], c["col"]) == (256, 0.25))
    assert cell["effect"] == pytest.approx(-0.04) and cell["significant"] is True and cell["seeds"] == 3
    assert {"cells": [[64, 0.25], [128, 0.25]], "along": N, "significant_sides": 2} in data["crossover"]
    assert {"cells": [[128, 0.25], [128, 0.5]], "along": F, "significant_sides": 2} in data["crossover"]
    assert data["summary"] == t.summary_lines()


# ------------------------------------------------------------------ the PNG


def _colours(path):
    """The image's pixels as floats in 0..1 (RGB), via matplotlib.image.imread."""
    from matplotlib import image

    return image.imread(str(path))[..., :3]


def _blue_minus_red(pixels):
    """Strongly blue pixels less strongly red pixels."""
    r, b = pixels[..., 0], pixels[..., 2]
    return int(((b - r) > 0.25).sum()) - int(((r - b) > 0.25).sum())


@pytest.mark.figures
def test_the_png_is_written_and_coloured_blue_where_tying_helps(tmp_path):
    pytest.importorskip("matplotlib")

    def two_by_two(left, right):
        return tying_map([matched({N: n, F: f}, left if f == 0.25 else right) for n in (64, 128)
                          for f in (0.25, 0.5)], "validation")

    helps_left, helps_right = two_by_two(-0.05, 0.05), two_by_two(0.05, -0.05)
    assert set(helps_left.crossover) == {((64, 0.25), (64, 0.5)), ((128, 0.25), (128, 0.5))}
    paths = tmp_path / "left.png", tmp_path / "right.png"
    plot_tying_map(helps_left, paths[0])
    plot_tying_map(helps_right, paths[1])
    for p in paths:
        data = p.read_bytes()
        assert data.startswith(PNG) and len(data) > 10_000
    a, b = _colours(paths[0]), _colours(paths[1])
    assert a.shape == b.shape and a.shape[0] > 200 and a.shape[1] > 300
    w = a.shape[1]
    # the left column of cells fills most of the left third; the colorbar (both colours) is at the right
    assert _blue_minus_red(a[:, : w // 3]) > 2000 and _blue_minus_red(b[:, : w // 3]) < -2000
    assert _blue_minus_red(a[:, w // 3: 2 * w // 3]) < 0 < _blue_minus_red(b[:, w // 3: 2 * w // 3])
    assert not list(tmp_path.glob("*.tmp*"))  # written atomically: no temporary file left


@pytest.mark.figures
def test_the_crossover_and_missing_cells_show_on_the_png(tmp_path):
    pytest.importorskip("matplotlib")

    def gold(path):
        px = _colours(path)
        return int(((px[..., 0] > 0.9) & (px[..., 1] > 0.7) & (px[..., 1] < 0.9) & (px[..., 2] < 0.2)).sum())

    def grey(path):
        return int((abs(_colours(path) - 0.85) < 0.02).all(axis=-1).sum())

    full, plain, crossing = tmp_path / "full.png", tmp_path / "plain.png", tmp_path / "crossing.png"
    plot_tying_map(tying_map(grid([[0.01, 0.02, 0.03]] * 3), "validation"), full)
    plot_tying_map(tying_map(grid([[0.01, 0.02, 0.03]] * 3, skip={(128, 0.5)}), "validation"), plain)
    plot_tying_map(tying_map(grid(STAIRS, skip={(128, 0.5)}), "validation"), crossing)
    assert gold(crossing) > gold(plain) + 200  # the legend has gold lines in both; the edges only in one
    assert grey(plain) > grey(full) + 10_000  # the missing cell's grey (the legend's swatch is in both)


@pytest.mark.figures
def test_a_cell_left_out_for_runs_at_chance_is_hatched_on_the_png(tmp_path):
    pytest.importorskip("matplotlib")
    from types import SimpleNamespace

    def dark_grey(path):  # the hatch's 0.4 grey
        return int((abs(_colours(path) - 0.4) < 0.05).all(axis=-1).sum())

    ms = grid(STAIRS)
    chance = {"tied, n_embd=128, train_fraction=0.5"}
    variants = [SimpleNamespace(label=label, n_seeds=3, metrics={"validation": SimpleNamespace(
        at_unigram=[0] if label in chance else [])}) for m in ms for label in (m.tied, m.untied)]
    plain, guarded = tmp_path / "plain.png", tmp_path / "guarded.png"
    plot_tying_map(tying_map(ms, "validation"), plain)
    plot_tying_map(tying_map(ms, "validation", variants), guarded)
    assert dark_grey(guarded) > dark_grey(plain) + 100


def test_importing_the_module_does_not_import_matplotlib():
    code = "import sys, tiedlm.compare.tying_map; print('matplotlib' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


# ------------------------------------------------------------------ the frequent and rare buckets


def with_buckets(m, top, rare, p_holm=(0.01, 0.3), split="validation"):
    """m with the bucket differences (Δloss, nats) its contrast carries: top 10%, next 40%, rest 50%
    (each ± 0.01), Holm-adjusted p-values for the frequent and the rare one."""
    from tiedlm.compare.variants import BucketContrast

    def b(diff, p):
        return BucketContrast(test="paired", difference=diff, ci_low=diff - 0.01, ci_high=diff + 0.01, p_value=p / 3,
                              p_holm=p, n=3)

    m.split(split).buckets = {"top 10%": b(top, p_holm[0]), "next 40%": b(0.0, 0.9), "rest 50%": b(rare, p_holm[1])}
    return m


def bucket_grid(split="validation"):
    """STAIRS with buckets: the frequent bucket's Δ is the cell's, the rare one's a third of it where
    tying hurts and twice it where tying helps: always the lower, the larger only where tying helps."""
    out = []
    for m in grid(STAIRS):
        d = m.split("validation").difference
        out.append(with_buckets(m, top=d, rare=d / 3 if d > 0 else 2 * d, split=split))
    return out


def test_each_cell_carries_its_frequent_and_rare_buckets_effect_as_the_contrast_has_them():
    t = tying_map(bucket_grid(), "validation")
    assert t.bucket_split == "validation"
    cell = t.cell(256, 0.25)
    d = math.log1p(-0.04)
    assert cell.frequent.name == "top 10%" and cell.rare.name == "rest 50%"
    assert cell.rare.difference == pytest.approx(2 * d) and cell.rare.effect == pytest.approx(math.expm1(2 * d))
    assert cell.rare.ci_low == pytest.approx(math.expm1(2 * d - 0.01)) and cell.rare.ci_high == pytest.approx(math.expm1(2 * d + 0.01))
    assert (cell.frequent.p_holm, cell.rare.p_holm) == (0.01, 0.3)
    assert cell.frequent.significant is True and cell.rare.significant is False
    assert cell.difference == pytest.approx(d) and cell.se is not None
    data = json.loads(json.dumps(t.to_json(), allow_nan=False))
    row = next(c for c in data["cells"] if (c["row"], c["col"]) == (256, 0.25))
    assert row["rare"]["name"] == "rest 50%" and row["rare"]["effect"] == pytest.approx(cell.rare.effect)
    assert row["frequent"]["p_holm"] == 0.01 and data["bucket_split"] == "validation"


def test_the_bucket_sentences_count_the_cells_where_the_effect_sits():
    from tiedlm.compare.tying_map import bucket_lines

    lines = bucket_lines(tying_map(bucket_grid(), "validation"))
    assert lines[0].startswith("By token frequency (on validation, ")
    assert ("the rare bucket's (rest 50%) effect is the larger in magnitude at 3 of 9 cells, and the lower "
            "(the more in tying's favour) at 9 of 9; the update-rule argument predicts the gain on rare tokens.") in lines[0]
    # Holm p: 0.01 for the frequent bucket (significant), 0.3 for the rare one
    assert lines[1] == ("Tying helps the rare bucket significantly at 0 of 9 cells and hurts it at 0; the frequent "
                        "bucket (top 10%): helps at 3, hurts at 6.")
    same = [with_buckets(m, top=0.02, rare=0.02) for m in grid(STAIRS)]
    assert "at 0 of 9 (9 with the same effect in both)" in bucket_lines(tying_map(same, "validation"))[0]


def test_buckets_come_from_validation_when_the_maps_split_has_none_and_are_absent_without_any():
    from tiedlm.compare.tying_map import bucket_lines

    ms = bucket_grid()
    for m in ms:  # the same contrasts on test too, without buckets there
        m.contrast.splits["test"] = SplitContrast(**{**vars(m.split("validation")), "buckets": {}})
    t = tying_map(ms, "test")
    assert t.split == "test" and t.bucket_split == "validation" and t.cell(64, 0.25).rare is not None
    plain = tying_map(grid(STAIRS), "validation")
    assert plain.bucket_split is None and plain.cell(64, 0.25).rare is None and bucket_lines(plain) == []


@pytest.mark.figures
def test_the_bucket_png_shows_the_rare_bucket_blue_where_tying_helps_rare_tokens(tmp_path):
    pytest.importorskip("matplotlib")
    from tiedlm.compare.plots import plot_tying_map_buckets

    ms = [with_buckets(matched({N: n, F: f}, 0.01), top=0.04, rare=-0.04) for n in (64, 128) for f in (0.25, 0.5)]
    path = tmp_path / "buckets.png"
    plot_tying_map_buckets(tying_map(ms, "validation"), path)
    px = _colours(path)
    w = px.shape[1]
    assert path.read_bytes().startswith(PNG) and not list(tmp_path.glob("*.tmp*"))
    assert _blue_minus_red(px[:, : int(w * 0.4)]) < -2000 < 2000 < _blue_minus_red(px[:, int(w * 0.45): int(w * 0.8)])
    empty = tmp_path / "empty.png"
    plot_tying_map_buckets(tying_map(grid(STAIRS), "validation"), empty)  # no buckets: an empty panel, no crash
    assert empty.read_bytes().startswith(PNG)
