"""The tying map inside a comparison: a 2 × 2 grid of runs (width × training fraction) gives
tying_map.png, comparison.json's tying_map and its section in comparison.md; the measures beside
each cell come from the untied twin's analysis, and their Spearman tests match scipy.stats."""

import json
from types import SimpleNamespace

import pytest

import tiedlm.compare as C
from tests.test_compare import TIED, UNTIED, make_run
from tiedlm.compare.map_measures import MEASURES, cell_measures, correlations, measure_lines, spearman_test
from tiedlm.compare.plots import TYING_MAP_BUCKETS_PLOT
from tiedlm.compare.stats import summarize
from .conftest import comparison_dir

scipy_stats = pytest.importorskip("scipy.stats")


@pytest.mark.parametrize("x,y", [([1, 2, 3, 4, 5], [2, 1, 4, 3, 6]), ([0.1, 0.5, 0.2, 0.9, 0.3, 0.7], [3, 3, 1, 8, 2, 5]),
                                 ([1, 2, 3, 4], [4, 3, 2, 1])])
def test_spearman_test_is_exact_over_every_ordering_for_few_cells(x, y):
    import itertools

    rho, p = spearman_test(x, y)
    assert rho == pytest.approx(scipy_stats.spearmanr(x, y).statistic, abs=1e-12)
    # by brute force, with scipy computing every ordering's ρ
    perms = [scipy_stats.spearmanr(x, [y[i] for i in order]).statistic for order in itertools.permutations(range(len(y)))]
    assert p == pytest.approx(sum(abs(r) >= abs(rho) - 1e-12 for r in perms) / len(perms), abs=1e-12)
    if sorted(x) == list(x) and sorted(y, reverse=True) == list(y):
        assert p == pytest.approx(2 / 24)  # 4 cells in perfect order: 2 of the 24 orderings, not p = 0


def test_spearman_test_is_scipys_t_approximation_for_more_cells():
    x = [0.3, 0.1, -0.05, -0.2, 0.2, 0.15, 0.05, 0.12, -0.1, 0.4, 0.0, 0.22]
    y = [1.8, 0.7, 0.9, 1.5, 3.3, 2.6, 1.8, 1.5, 0.8, 4.4, 1.2, 2.5]
    rho, p = spearman_test(x, y)
    want = scipy_stats.spearmanr(x, y)
    assert rho == pytest.approx(want.statistic, abs=1e-12) and p == pytest.approx(want.pvalue, abs=1e-9)


@pytest.mark.figures
def test_a_grid_of_runs_gets_its_map_and_the_matrices_beside_each_cell(tmp_path):
    """Tying helps at the wide, small-data cell and hurts at the narrow, full-data one: the map
    finds the crossover and writes its plot, JSON and Markdown."""
    runs = tmp_path / "runs"
    same = {"fingerprint": "wikitext", "tokenizer": "bpe"}  # what train.py records: a prefix shares them
    effect = {(32, 0.5): 1.20, (32, 1.0): 1.30, (64, 0.5): 0.80, (64, 1.0): 1.10}  # tied / untied perplexity
    for (d, f), ratio in effect.items():
        for seed in range(3):
            base = 100.0 + 10 * seed
            setting = [f"model.n_embd={d}", f"data.train_fraction={f}"]
            make_run(runs, f"u-{d}-{f}-s{seed}", seed, UNTIED + setting, val=base, test=base, identity=same)
            make_run(runs, f"t-{d}-{f}-s{seed}", seed, TIED + setting, val=base * ratio * (1 + 0.01 * seed),
                     test=base * ratio * (1 + 0.01 * seed), identity=same)
    c = C.compare_runs(runs_dir=runs, primary="test")
    assert c.tying_map is not None
    t = c.tying_map.tmap
    assert (t.row_key, t.col_key) == ("data.train_fraction", "model.n_embd")  # keys in sorted order
    assert t.known(0.5, 64).effect < 0 < t.known(1.0, 32).effect
    assert ((0.5, 32), (0.5, 64)) in t.crossover or ((0.5, 64), (0.5, 32)) in t.crossover
    # the map is one family of tests: Holm over its cells, by hand (sorted, times m - k, running maximum)
    ps = sorted((c.p_value, at) for at, c in t.cells.items())
    running = 0.0
    for k, (p, at) in enumerate(ps):
        running = max(running, min(1.0, (len(ps) - k) * p))
        assert t.cells[at].p_holm == pytest.approx(running, rel=1e-12)
    assert any(line.startswith("After Holm's correction over the 4 cells") for line in t.summary_lines())
    out = comparison_dir(runs)
    assert (out / C.TYING_MAP_PLOT).stat().st_size > 10_000 and c.files["plot_tying_map"].endswith("tying_map.png")
    data = json.loads((out / "comparison.json").read_text())
    assert data["tying_map"]["row_key"] == "data.train_fraction" and len(data["tying_map"]["cells"]) == 4
    assert "No correlation with the matrices" in data["tying_map"]["matrices_summary"][0]  # not analysed
    md = (out / "comparison.md").read_text()
    assert "### The tying map" in md and "![tying map](tying_map.png)" in md
    # each cell's frequent and rare buckets beside it (make_run's buckets: "top 10%" … "rest"), and their figure
    assert (out / TYING_MAP_BUCKETS_PLOT).read_bytes()[:4] == b"\x89PNG"
    assert c.files["plot_tying_map_buckets"].endswith("tying_map_buckets.png")
    assert "| top 10% (frequent) | rest (rare) |" in md and "![tying effect per frequency bucket](tying_map_buckets.png)" in md
    cell = data["tying_map"]["cells"][0]
    assert cell["frequent"]["name"] == "top 10%" and cell["rare"]["name"] == "rest"
    assert any(line.startswith("By token frequency (on test,") for line in data["tying_map"]["buckets_summary"])
    # the surface over 4 cells: a plane (no interaction), 1 residual degree of freedom, its tables in comparison.md
    surface = data["tying_map"]["surface"]
    assert surface["fitted"] is True and surface["dof"] == 1 and len(surface["coefficients"]) == 3
    assert "#### The fitted surface" in md and "| term | estimate | SE | 95% CI | t | p |" in md
    assert any(line.startswith("- Fitted surface (a plane, weighted by 1/se², 4 cells") for line in md.splitlines())
    assert any("Tying helps significantly" in line for line in C.format_terminal_table(c).splitlines())


def fake_map(effects, measures):
    cells = {at: SimpleNamespace(effect=e, untied=f"u{at}") for at, e in effects.items()}
    tmap = SimpleNamespace(cells=cells)
    variants = [SimpleNamespace(label=f"u{at}", matrices={k: summarize([v]) for k, v in m.items()})
                for at, m in measures.items()]
    return tmap, variants


def test_correlations_follow_the_cells_and_say_whether_the_sign_is_the_predicted_one():
    effects = {(r, c): e for (r, c), e in zip([(0, 0), (0, 1), (1, 0), (1, 1), (2, 0)], [0.3, 0.1, -0.05, -0.2, 0.2])}
    cka = {(0, 0): 0.2, (0, 1): 0.4, (1, 0): 0.5, (1, 1): 0.9, (2, 0): 0.3}  # higher where tying helps
    measures = {at: {"cka": cka[at], "aligned_cosine": 0.5, "direct_path_nll": 5.0,
                     "direct_path_nll_e_as_w_out": 5.0 + effects[at], "direct_path_bpb": 1.2,
                     "direct_path_bpb_e_as_w_out": 1.2 + 2 * effects[at]} for at in effects}
    tmap, variants = fake_map(effects, measures)
    cells = cell_measures(tmap, variants)
    assert cells[(0, 0)]["direct_path_cost"] == pytest.approx(0.3)
    assert cells[(0, 0)]["direct_path_cost_bpb"] == pytest.approx(0.6)
    found = {c.key: c for c in correlations(tmap, cells)}
    assert found["cka"].rho == pytest.approx(scipy_stats.spearmanr(list(effects.values()), list(cka.values())).statistic)
    assert found["cka"].rho == pytest.approx(-1.0) and found["cka"].agrees is True
    assert found["direct_path_cost"].rho == pytest.approx(1.0) and found["direct_path_cost"].agrees is True
    assert found["direct_path_cost_bpb"].rho == pytest.approx(1.0) and found["direct_path_cost_bpb"].agrees is True
    assert found["aligned_cosine"].rho is None  # a constant measure has no rank correlation
    lines = measure_lines(list(found.values()))
    assert any("untied CKA: Spearman ρ = −1.00 (p = 0.017, 5 cells) — the sign the symmetry argument predicts" in line
               for line in lines)
    assert len(found) == len(MEASURES)
    few = {at: m for at, m in list(measures.items())[:3]}
    tmap, variants = fake_map(effects, few)
    assert all(c.rho is None for c in correlations(tmap, cell_measures(tmap, variants)))


def test_a_grid_with_two_tied_variants_per_cell_says_why_it_has_no_map():
    from tiedlm.compare.map_measures import missing_map_note

    def m(d, f, tied):
        return SimpleNamespace(setting={"model.n_embd": d, "data.train_fraction": f}, tied=tied)

    one = [m(d, f, "tied") for d in (32, 64) for f in (0.5, 1.0)]
    assert missing_map_note(one) == []
    two = one + [m(32, 0.5, "lowrank r=8"), m(64, 1.0, "lowrank r=8")]
    assert missing_map_note(two)[0].startswith("No tying map: 2 settings have more than one tied variant")
    assert missing_map_note([m(32, 0.5, "tied")][:0]) == []

