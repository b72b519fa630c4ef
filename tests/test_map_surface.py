"""compare/surface.py: the weighted least-squares surface over the tying map's cells. The fit
against numpy.linalg.lstsq on √w-scaled rows, its covariance against (XᵀWX)⁻¹·χ²/dof by hand, its
intervals and p-values against scipy.stats.t, χ²'s p-value against scipy.stats.chi2; a synthetic
surface's known zero contour recovered with its Fieller band; and the degenerate maps (too few
cells, a zero variance, one value on an axis, axis values that are no positive numbers), each with
a note and no crash. Then the surface inside a map: comparison.json and the figure."""

import json
import math

import numpy as np
import pytest

from tiedlm.compare.surface import INTERACTION_CELLS, chi2_sf, fit_surface, nearest, surface_lines, wls

scipy_stats = pytest.importorskip("scipy.stats")

ROWS, COLS = (64, 128, 256), (0.125, 0.25, 0.5, 1.0)


def plane(b0, b1, b2, b3=0.0, noise=0.0, se=0.01, seed=0, rows=ROWS, cols=COLS):
    """Points (row, col, y, se) on y = b0 + b1·u + b2·v + b3·u·v, u and v log2 centred at the middle
    of the measured range, with Gaussian noise of `noise`·se and se varying by cell."""
    rng = np.random.default_rng(seed)
    cu = (math.log2(min(rows)) + math.log2(max(rows))) / 2
    cv = (math.log2(min(cols)) + math.log2(max(cols))) / 2
    out = []
    for i, r in enumerate(rows):
        for j, c in enumerate(cols):
            u, v = math.log2(r) - cu, math.log2(c) - cv
            s = se * (1 + 0.5 * ((i + 2 * j) % 3))  # unequal variances: the weights matter
            out.append((r, c, b0 + b1 * u + b2 * v + b3 * u * v + noise * s * rng.standard_normal(), s))
    return out


def design(points, interaction):
    u = np.log2([p[0] for p in points])
    v = np.log2([p[1] for p in points])
    u, v = u - (u.min() + u.max()) / 2, v - (v.min() + v.max()) / 2
    cols = [np.ones_like(u), u, v] + ([u * v] if interaction else [])
    return np.column_stack(cols)


# ------------------------------------------------------------------ the numbers


@pytest.mark.parametrize("k", [1, 2, 3, 4, 5, 8, 9, 30, 31])
def test_chi2_sf_is_scipys(k):
    for x in (0.0, 1e-6, 0.3, 1.0, float(k), 2.5 * k + 3, 60.0, 300.0):
        assert chi2_sf(x, k) == pytest.approx(scipy_stats.chi2.sf(x, k), rel=1e-10, abs=1e-300)


def test_wls_is_lstsq_on_the_scaled_rows_and_its_covariance_the_manual_formula():
    rng = np.random.default_rng(3)
    X = np.column_stack([np.ones(9), rng.normal(size=9), rng.normal(size=9)])
    y, w = rng.normal(size=9), rng.uniform(0.2, 5.0, size=9)
    fit = wls(X, y, w)
    sw = np.sqrt(w)
    beta, *_ = np.linalg.lstsq(X * sw[:, None], y * sw, rcond=None)
    np.testing.assert_allclose(fit.beta, beta, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(fit.unscaled, np.linalg.inv(X.T @ np.diag(w) @ X), rtol=1e-10)
    assert fit.chi2 == pytest.approx(float(np.sum(w * (y - X @ beta) ** 2)), rel=1e-10) and fit.dof == 6
    assert wls(np.column_stack([X[:, 0], X[:, 0]]), y, w) is None  # rank 1 of 2 columns


def test_the_surface_is_the_weighted_fit_with_t_intervals_on_the_residual_degrees_of_freedom():
    pts = plane(0.02, -0.02, 0.03, b3=0.004, noise=1.0)
    s = fit_surface(pts, "n_embd", "train_fraction")
    assert s.fitted and len(pts) >= INTERACTION_CELLS and len(s.terms) == 4
    X, y = design(pts, True), np.array([p[2] for p in pts])
    w = 1 / np.array([p[3] for p in pts]) ** 2
    sw = np.sqrt(w)
    beta, *_ = np.linalg.lstsq(X * sw[:, None], y * sw, rcond=None)
    np.testing.assert_allclose([c.estimate for c in s.coefficients], beta, rtol=1e-9, atol=1e-12)
    dof = len(pts) - 4
    chi2 = float(np.sum(w * (y - X @ beta) ** 2))
    cov = np.linalg.inv(X.T @ (w[:, None] * X)) * chi2 / dof
    np.testing.assert_allclose(np.array(s.covariance), cov, rtol=1e-9)
    assert (s.dof, s.cells) == (dof, len(pts)) and s.scale == pytest.approx(chi2 / dof)
    assert s.chi2_p == pytest.approx(scipy_stats.chi2.sf(chi2, dof), rel=1e-9)
    q = scipy_stats.t.ppf(0.975, dof)
    for k, c in enumerate(s.coefficients):
        sd = math.sqrt(cov[k, k])
        assert c.se == pytest.approx(sd, rel=1e-9)
        assert (c.ci_low, c.ci_high) == (pytest.approx(beta[k] - q * sd, rel=1e-8), pytest.approx(beta[k] + q * sd, rel=1e-8))
        assert c.p_value == pytest.approx(2 * scipy_stats.t.sf(abs(beta[k] / sd), dof), rel=1e-7)
    # residuals: the cell less its fitted value, over its se; weights add to 1
    r = s.residuals[5]
    assert r.residual == pytest.approx(pts[5][2] - float(X[5] @ beta)) and r.standardized == pytest.approx(r.residual / pts[5][3])
    assert sum(x.weight_share for x in s.residuals) == pytest.approx(1.0)
    assert s.centre == (pytest.approx(128.0), pytest.approx(math.sqrt(0.125)))


def test_fewer_than_six_cells_fit_a_plane_without_the_interaction():
    pts = plane(0.02, -0.02, 0.03, noise=1.0)[:5]
    s = fit_surface(pts, "n_embd", "train_fraction")
    assert s.terms == ["intercept", "log2 n_embd", "log2 train_fraction"] and s.dof == 2
    X, y = design(pts, False), np.array([p[2] for p in pts])
    sw = 1 / np.array([p[3] for p in pts])
    beta, *_ = np.linalg.lstsq(X * sw[:, None], y * sw, rcond=None)
    np.testing.assert_allclose([c.estimate for c in s.coefficients], beta, rtol=1e-9, atol=1e-12)


# ------------------------------------------------------------------ the zero contour


def test_a_known_zero_contour_is_recovered_with_a_band_that_holds_it():
    # y = 0 where 0.03·v = 0.02·u − 0.01: train_fraction = c0 · 2^((0.02·u − 0.01)/0.03)
    pts = plane(0.01, -0.02, 0.03, noise=0.3, se=0.002)
    s = fit_surface(pts, "n_embd", "train_fraction")
    assert s.solved == "col"  # the effect changes more along train_fraction across the map
    c0 = math.sqrt(0.125)
    for p, r in zip(s.at_measured, ROWS):
        truth = c0 * 2 ** ((0.02 * math.log2(r / 128) - 0.01) / 0.03)
        assert p.at == r and p.value == pytest.approx(truth, rel=0.05)
        assert p.bounded and p.low < truth < p.high
    # the fine grid runs half a step past the measured rows, for the figure
    assert s.contour[0].at == pytest.approx(64 / 2**0.5) and s.contour[-1].at == pytest.approx(256 * 2**0.5)
    lines = surface_lines(s)
    assert any(line.startswith("- at n_embd=128: train_fraction ≈ 0.2") and "inside the measured range" in line
               for line in lines)
    assert lines[-1].startswith("The line crosses the measured cells at 3 of 3 measured n_embd values")


def test_fieller_band_is_where_the_prediction_interval_contains_zero():
    s = fit_surface(plane(0.01, -0.02, 0.03, noise=1.0, se=0.004), "n_embd", "train_fraction")
    cov, beta = np.array(s.covariance), np.array([c.estimate for c in s.coefficients])
    q = scipy_stats.t.ppf(0.975, s.dof)
    cu = math.log2(128)
    cv = math.log2(s.centre[1])
    p = s.at_measured[1]  # n_embd = 128: u = 0

    def contains_zero(col):
        x = np.array([1.0, math.log2(128) - cu, math.log2(col) - cv, (math.log2(128) - cu) * (math.log2(col) - cv)])
        return abs(x @ beta) <= q * math.sqrt(x @ cov @ x) + 1e-15

    assert contains_zero(p.value) and contains_zero(p.low * 1.0001) and contains_zero(p.high / 1.0001)
    assert not contains_zero(p.low / 1.01) and not contains_zero(p.high * 1.01)


def test_a_contour_outside_the_map_says_how_far_and_how_sure():
    pts = plane(0.15, -0.02, 0.03, noise=0.3, se=0.002)  # tying hurts everywhere; zero far below the fractions
    s = fit_surface(pts, "n_embd", "train_fraction")
    near = nearest(s)
    c0 = math.sqrt(0.125)
    truth = c0 * 2 ** ((0.02 * math.log2(256 / 128) - 0.15) / 0.03)
    assert near.at == 256 and near.value == pytest.approx(truth, rel=0.1) and near.high < 0.125
    last = surface_lines(s)[-1]
    assert last.startswith("The line lies outside the measured cells: nearest at n_embd=256, train_fraction ≈ ")
    assert f"(a factor {0.125 / near.value:.3g}) beyond train_fraction=0.125" in last
    assert last.endswith("the line is outside the map with 95% confidence.")


def test_a_slope_that_is_not_significant_leaves_the_band_unbounded():
    pts = plane(0.01, 0.0, 0.002, noise=1.0, se=0.01)  # hardly any slope: the data do not place the line
    s = fit_surface(pts, "n_embd", "train_fraction")
    assert any(not p.bounded for p in s.at_measured)
    assert any("95% band unbounded" in line for line in surface_lines(s))


def test_cells_exactly_on_a_plane_have_a_band_of_no_width():
    s = fit_surface(plane(0.01, -0.02, 0.03), "n_embd", "train_fraction")  # no noise: χ² is rounding
    assert all(p.bounded and p.low == pytest.approx(p.value, rel=1e-6) == p.high for p in s.at_measured)


# ------------------------------------------------------------------ degenerate maps


@pytest.mark.parametrize("points,note", [
    ([(64, 0.5, 0.01, 0.01), (128, 1.0, 0.02, 0.01)], "2 cells it can weigh, fewer than the 3 parameters"),
    ([(64, 0.5, 0.01, 0.01), (64, 1.0, 0.02, 0.01), (64, 0.25, 0.0, 0.01)], "1 value of n_embd"),
    ([(64, 0.5, 0.01, None), (128, 1.0, 0.02, None), (64, 1.0, 0.0, None)], "no cell has a standard error"),
    ([(64, "a", 0.01, 0.01), (128, "b", 0.02, 0.01), (64, "b", 0.0, 0.01)], "positive numbers"),
    ([(64, 0.0, 0.01, 0.01), (128, 1.0, 0.02, 0.01), (64, 1.0, 0.0, 0.01)], "positive numbers"),
    ([(True, 0.5, 0.01, 0.01), (128, 1.0, 0.02, 0.01), (64, 1.0, 0.0, 0.01)], "positive numbers"),
    ([(64, 0.5, 0.01, 0.0), (128, 1.0, 0.02, 0.0), (64, 1.0, 0.0, 0.01), (128, 0.5, 0.0, 0.01)], "variance 0"),
])
def test_degenerate_cells_give_a_note_and_no_surface(points, note):
    s = fit_surface(points, "n_embd", "train_fraction")
    assert not s.fitted and s.coefficients == [] and s.contour == []
    text = "; ".join(s.notes)
    assert note in text
    lines = surface_lines(s)
    assert len(lines) == 1 and lines[0].startswith("No fitted surface over the map: ")
    assert json.loads(json.dumps(s.to_json(), allow_nan=False))["fitted"] is False


def test_a_zero_variance_cell_is_left_out_and_the_rest_fitted():
    pts = plane(0.02, -0.02, 0.03, noise=1.0)
    pts[0] = (*pts[0][:3], 0.0)
    s = fit_surface(pts, "n_embd", "train_fraction")
    assert s.fitted and s.cells == len(pts) - 1
    assert any("variance 0" in n and "n_embd=64, train_fraction=0.125" in n for n in s.notes)
    assert surface_lines(s)[-1].startswith("Note: left out of the surface, variance 0")


def test_as_many_cells_as_parameters_fit_exactly_without_intervals():
    s = fit_surface([(64, 0.5, 0.01, 0.01), (128, 0.5, 0.02, 0.01), (64, 1.0, -0.01, 0.02)], "n_embd", "f")
    assert s.fitted and s.dof == 0 and s.scale is None and s.chi2_p is None
    assert all(c.ci_low is None and c.p_value is None for c in s.coefficients)
    assert all(not p.bounded for p in s.contour)
    assert any("no residual degree of freedom" in n for n in s.notes)
    assert json.loads(json.dumps(s.to_json(), allow_nan=False))["dof"] == 0


def test_cells_on_a_line_do_not_determine_a_plane():
    s = fit_surface([(64, 0.25, 0.01, 0.01), (128, 0.5, 0.02, 0.01), (256, 1.0, 0.03, 0.01)], "n_embd", "f")
    assert not s.fitted and "lie on a line" in s.notes[-1]


# ------------------------------------------------------------------ inside the map


@pytest.mark.figures
def test_the_map_carries_its_surface_into_json_and_onto_the_figure(tmp_path):
    pytest.importorskip("matplotlib")
    from tests.test_tying_map import F, N, matched
    from tiedlm.compare.plots import plot_tying_map
    from tiedlm.compare.tying_map import tying_map

    cu, cv = 7.0, math.log2(math.sqrt(0.125))
    ms = [matched({N: n, F: f}, math.expm1(0.01 - 0.02 * (math.log2(n) - cu) + 0.03 * (math.log2(f) - cv)),
                  half=0.004) for n in ROWS for f in COLS]
    t = tying_map(ms, "validation")
    assert t.surface.fitted and t.surface.solved == "col"
    data = json.loads(json.dumps(t.to_json(), allow_nan=False))
    assert data["surface"]["fitted"] is True and len(data["surface"]["coefficients"]) == 4
    assert data["surface"]["summary"] == surface_lines(t.surface)
    with_line, without = tmp_path / "with.png", tmp_path / "without.png"
    plot_tying_map(t, with_line)
    t.surface = None
    plot_tying_map(t, without)
    from matplotlib import image

    def dark(path):
        return int((image.imread(str(path))[..., :3] < 0.15).all(axis=-1).sum())

    assert dark(with_line) > dark(without) + 300  # the contour's black line across the cells
