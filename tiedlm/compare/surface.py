"""A fitted surface over the tying map: the cells' effects as a plane (or a saddle) in the log of
the map's two axes, where that surface predicts no effect, and how sure that line is.

The model, by weighted least squares over the cells with an effect and a standard error:

    y = b0 + b1·u + b2·v (+ b3·u·v)        weights w = 1 / se²

y is the cell's effect on the loss scale (Δloss in nats, the log of tied / untied perplexity), se
its standard error (the cell's paired or Welch test); u and v are log2 of the row and column values,
each centred at the middle of its measured range, so b0 is the predicted effect at the map's centre
and b1, b2 are nats per doubling of each key there. The interaction b3 is fitted only with at least
INTERACTION_CELLS cells (two residual degrees of freedom beside its four parameters): with fewer it
would be fitted from nothing.

The coefficients' covariance is s²·(XᵀWX)⁻¹ with s² = χ²/(n − p), χ² = Σ w·(y − ŷ)² (a
multiplicative dispersion, as statsmodels' WLS and numpy.polyfit(cov=True) scale it): each cell's
variance comes from a few seeds and is itself uncertain, so the cells' scatter about the surface, not
their own variances taken as known, sets the scale. Intervals and p-values are Student t on n − p
degrees of freedom (stats.t_ppf); with n = p there is no scale and none is given. χ² is also the
goodness of fit under the variances taken as known (its p-value: chi2_sf, in closed form for integer
degrees of freedom): small p says the cells scatter more than their intervals allow.

The zero contour is solved for the axis along which the fitted effect changes more across the map
(|slope| × measured range), as a function of the other, on a fine grid. Its 95% band at each point
is Fieller's: the values of the solved axis where the prediction's 95% interval contains 0,
{v : ŷ² ≤ t²·var(ŷ)}; it is a bounded interval only where the slope along the solved axis is itself
significant there, and is said to be unbounded otherwise. Distances outside the measured cells are
in doublings and factors of the axis value.

Pure numbers and numpy; no matplotlib (plots.py draws the contour on the map).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any, Sequence

from ..config.naming import scalar
from .stats import LEVEL, chi2_sf, number, t_ppf, t_two_sided_p

if TYPE_CHECKING:
    import numpy as np

INTERACTION_CELLS = 6  # fit u·v from this many cells on (4 parameters, ≥ 2 residual degrees of freedom)
GRID = 41  # points of the contour along the free axis
FAR = 60.0  # doublings: a contour this far outside is "far outside", not a number (2**60 ≈ 1e18)


@dataclass
class Coefficient:
    term: str  # "intercept", "log2 n_embd", ..., "log2 n_embd × log2 train_fraction"
    estimate: float  # nats (the intercept), or nats per doubling
    se: float | None
    ci_low: float | None
    ci_high: float | None
    t: float | None
    p_value: float | None


@dataclass
class Residual:
    row: float
    col: float
    effect: float  # the cell's Δloss (nats)
    se: float
    fitted: float
    residual: float  # effect − fitted
    standardized: float  # residual / se (Pearson, the variance taken as known)
    weight_share: float  # w / Σw: how much this cell pulls the fit


@dataclass
class ContourPoint:
    """Where the surface predicts 0 at one value of the free axis: `value` of the solved axis
    (None: the surface is flat along it there, or the line is more than FAR doublings away), and
    its 95% band (low/high None: unbounded on that side)."""

    at: float  # the free axis' value (original units)
    value: float | None
    low: float | None
    high: float | None
    bounded: bool
    log_value: float | None = None  # log2 of value (None with value), for the plot


@dataclass
class Surface:
    """The fit, or why there is none (`notes`; coefficients empty)."""

    row_short: str
    col_short: str
    terms: list[str] = field(default_factory=list)
    coefficients: list[Coefficient] = field(default_factory=list)
    centre: tuple[float, float] | None = None  # the row and column values at u = v = 0
    cells: int = 0
    dof: int = 0
    scale: float | None = None  # s² = χ² / dof, the factor on (XᵀWX)⁻¹
    chi2: float | None = None
    chi2_p: float | None = None
    covariance: list[list[float]] | None = None  # scaled
    residuals: list[Residual] = field(default_factory=list)
    solved: str | None = None  # "row" or "col": the axis the contour gives as a function of the other
    contour: list[ContourPoint] = field(default_factory=list)  # on the fine grid (the plot, the JSON)
    at_measured: list[ContourPoint] = field(default_factory=list)  # at the free axis' measured values
    measured: dict[str, list[float]] = field(default_factory=dict)  # "row"/"col" -> measured values
    notes: list[str] = field(default_factory=list)
    level: float = LEVEL

    @property
    def fitted(self) -> bool:
        return bool(self.coefficients)

    def lines(self) -> list[str]:
        return surface_lines(self)

    def to_json(self) -> dict:
        out = asdict(self)
        out["centre"] = list(self.centre) if self.centre else None
        out["fitted"] = self.fitted
        out["summary"] = surface_lines(self)
        return out


# ============================================================================ the numbers


@dataclass
class Wls:
    beta: np.ndarray  # (p,)
    unscaled: np.ndarray  # (XᵀWX)⁻¹, (p, p)
    chi2: float
    dof: int
    fitted: np.ndarray  # (n,)


def wls(X: np.ndarray, y: np.ndarray, w: np.ndarray) -> Wls | None:
    """Weighted least squares of y on the columns of X with weights w (> 0), statsmodels' WLS;
    None when √w·X has rank below its columns (statsmodels would answer through a pseudo-inverse)."""
    import numpy as np
    from statsmodels.regression.linear_model import WLS

    X, y, w = np.asarray(X, float), np.asarray(y, float), np.asarray(w, float)
    n, p = X.shape
    if n < p or np.linalg.matrix_rank(X * np.sqrt(w)[:, None]) < p:
        return None
    fit = WLS(y, X, weights=w).fit()
    return Wls(beta=np.asarray(fit.params), unscaled=np.asarray(fit.normalized_cov_params), chi2=float(fit.ssr),
               dof=n - p, fitted=np.asarray(fit.fittedvalues))


# ============================================================================ the fit


def _usable(points: Sequence[tuple], row_short: str, col_short: str) -> tuple[list[tuple], list[str]]:
    """The points a fit can weigh: numeric positive axis values, a finite effect and se > 0."""
    keep, notes = [], []
    no_se, zero_se, bad_axis = [], [], []
    for row, col, y, se in points:
        name = f"{row_short}={row}, {col_short}={col}"
        if not all(isinstance(v, (int, float)) and not isinstance(v, bool) and number(v) is not None and v > 0
                   for v in (row, col)):
            bad_axis.append(name)
        elif number(y) is None:
            continue
        elif number(se) is None:
            no_se.append(name)
        elif se <= 0:
            zero_se.append(name)
        else:
            keep.append((row, col, float(y), float(se)))
    if bad_axis:
        notes.append("no surface: the log of an axis needs positive numbers, and "
                     + "; ".join(bad_axis) + " has a value that is not one")
        return [], notes
    if no_se and not keep and not zero_se:
        notes.append("no surface: no cell has a standard error (one seed each, or no spread to measure)")
        return [], notes
    if no_se:
        notes.append("left out of the surface, no standard error (one seed): " + "; ".join(no_se))
    if zero_se:
        notes.append("left out of the surface, variance 0 (no spread between seeds: no inverse-variance weight): "
                     + "; ".join(zero_se))
    return keep, notes


def fit_surface(points: Sequence[tuple], row_short: str, col_short: str) -> Surface:
    """The surface over points (row value, column value, Δloss, se); a Surface whose notes say why
    when it cannot be fitted."""
    import numpy as np

    s = Surface(row_short=row_short, col_short=col_short)
    keep, s.notes = _usable(points, row_short, col_short)
    if not keep and s.notes and s.notes[-1].startswith("no surface"):
        return s
    rows, cols = sorted({p[0] for p in keep}), sorted({p[1] for p in keep})
    s.measured = {"row": rows, "col": cols}
    for axis, values in ((row_short, rows), (col_short, cols)):
        if len(values) < 2:
            s.notes.append(f"no surface: the cells it can weigh have {len(values)} value{'s' if len(values) != 1 else ''}"
                           f" of {axis}, and a slope along it needs two")
            return s
    if len(keep) < 3:
        s.notes.append(f"no surface: {len(keep)} cells it can weigh, fewer than the 3 parameters of a plane")
        return s
    lr, lc = np.log2([p[0] for p in keep]), np.log2([p[1] for p in keep])
    cu, cv = (lr.min() + lr.max()) / 2, (lc.min() + lc.max()) / 2
    u, v = lr - cu, lc - cv
    y = np.array([p[2] for p in keep])
    se = np.array([p[3] for p in keep])
    w = 1.0 / se**2
    terms = ["intercept", f"log2 {row_short}", f"log2 {col_short}"]
    X = np.column_stack([np.ones_like(u), u, v])
    fit = None
    if len(keep) >= INTERACTION_CELLS:
        fit = wls(np.column_stack([X, u * v]), y, w)
        if fit is not None:
            X, terms = np.column_stack([X, u * v]), terms + [f"log2 {row_short} × log2 {col_short}"]
        else:
            s.notes.append("no interaction term: the cells do not determine it")
    if fit is None:
        fit = wls(X, y, w)
    if fit is None:
        s.notes.append("no surface: the cells lie on a line in the plane of the two axes and do not determine it")
        return s
    s.terms, s.cells, s.dof, s.chi2 = terms, len(keep), fit.dof, fit.chi2
    s.centre = (float(2**cu), float(2**cv))
    if fit.dof > 0:
        s.scale = fit.chi2 / fit.dof
        s.chi2_p = chi2_sf(fit.chi2, fit.dof)
        cov = fit.unscaled * s.scale
        s.covariance = cov.tolist()
        tq = t_ppf(0.5 + LEVEL / 2, fit.dof)
    else:
        cov = None
        s.notes.append(f"no intervals: {len(keep)} cells for {len(terms)} parameters leave no residual degree of "
                       "freedom to scale them")
    for k, term in enumerate(terms):
        b = float(fit.beta[k])
        if cov is None or cov[k, k] <= 0:
            s.coefficients.append(Coefficient(term, b, None, None, None, None, None))
            continue
        sd = float(math.sqrt(cov[k, k]))
        s.coefficients.append(Coefficient(term, b, sd, b - tq * sd, b + tq * sd, b / sd, t_two_sided_p(b / sd, fit.dof)))
    total_w = float(w.sum())
    s.residuals = [Residual(row=p[0], col=p[1], effect=p[2], se=p[3], fitted=float(f), residual=float(p[2] - f),
                            standardized=float((p[2] - f) / p[3]), weight_share=float(wi / total_w))
                   for p, f, wi in zip(keep, fit.fitted, w)]
    _contour(s, fit.beta, cov, (cu, cv), (lr, lc))
    return s


def _contour(s: Surface, beta: np.ndarray, cov: np.ndarray | None, centre: tuple[float, float],
             logs: tuple[Any, Any]) -> None:
    """The zero contour and its Fieller band, solved for the axis along which the effect changes
    more across the map."""
    import numpy as np

    spans = [float(logs[0].max() - logs[0].min()), float(logs[1].max() - logs[1].min())]
    solve_col = abs(beta[2]) * spans[1] >= abs(beta[1]) * spans[0]
    s.solved = "col" if solve_col else "row"
    free = 0 if solve_col else 1  # index into (row, col)
    measured_free = sorted(set(np.round(logs[free], 12)))
    lo, hi = min(measured_free), max(measured_free)
    pad = (hi - lo) / max(1, len(measured_free) - 1) / 2  # half a step: the map's edge
    grid = np.linspace(lo - pad, hi + pad, GRID)
    s.contour = [_point(s, beta, cov, g, centre, free) for g in grid]
    s.at_measured = [_point(s, beta, cov, g, centre, free) for g in measured_free]
    for p, value in zip(s.at_measured, s.measured["col" if free else "row"]):
        p.at = value  # the measured value itself, not 2**log2 of it


def _point(s: Surface, beta: np.ndarray, cov: np.ndarray | None, g: float, centre: tuple[float, float],
           free: int) -> ContourPoint:
    """At free-axis log2 value g: the prediction is a + b·x along the solved axis (centred), with
    variance A + 2B·x + D·x²; solve a + b·x = 0 and (a + b·x)² ≤ t²·(A + 2B·x + D·x²)."""
    import numpy as np

    gc = g - centre[free]
    solved_centre = centre[1 - free]
    p = len(beta)
    x0, x1 = np.zeros(p), np.zeros(p)  # prediction = (x0 + x·x1)·beta
    x0[0] = 1.0
    x0[1 + free] = gc
    x1[2 - free] = 1.0
    if p == 4:
        x1[3] = gc
    a, b = float(x0 @ beta), float(x1 @ beta)
    at = float(2**g)
    value = -a / b if b != 0 else None
    point = ContourPoint(at=at, value=None, low=None, high=None, bounded=False)
    if value is not None and abs(value) <= FAR:
        point.log_value = value + solved_centre
        point.value = float(2**point.log_value)
    if cov is None:
        return point
    tq2 = t_ppf(0.5 + LEVEL / 2, s.dof) ** 2
    A, B, D = float(x0 @ cov @ x0), float(x0 @ cov @ x1), float(x1 @ cov @ x1)
    alpha, beta2, gamma = b * b - tq2 * D, a * b - tq2 * B, a * a - tq2 * A
    # ≥ 0 in exact arithmetic when alpha > 0 (the set holds the contour's own point): clamp the rounding
    disc = max(0.0, beta2 * beta2 - alpha * gamma)
    if alpha > 0:  # a bounded interval: the slope along the solved axis is significant here
        r1, r2 = (-beta2 - math.sqrt(disc)) / alpha, (-beta2 + math.sqrt(disc)) / alpha
        point.bounded = True
        point.low = float(2 ** (r1 + solved_centre)) if abs(r1) <= FAR else None
        point.high = float(2 ** (r2 + solved_centre)) if abs(r2) <= FAR else None
    return point


# ============================================================================ the sentences


def _factor(value: float, measured: list[float]) -> str:
    """Where value lies against the measured range: 'inside', or 'a factor f below/above'."""
    lo, hi = min(measured), max(measured)
    if lo <= value <= hi:
        return "inside the measured range"
    if value < lo:
        return f"a factor {lo / value:.3g} below the smallest measured ({scalar(lo)})"
    return f"a factor {value / hi:.3g} above the largest measured ({scalar(hi)})"


def _band_words(p: ContourPoint, measured: list[float]) -> str:
    if p.low is None and p.high is None:
        return ("95% band unbounded (the slope along it is not significant there: the data do not place the line)"
                if not p.bounded else "95% band more than a factor 2^60 wide")
    lo = "unbounded" if p.low is None else f"{p.low:.3g}"
    hi = "unbounded" if p.high is None else f"{p.high:.3g}"
    m_lo, m_hi = min(measured), max(measured)
    outside = (p.high is not None and p.high < m_lo) or (p.low is not None and p.low > m_hi)
    within = p.low is not None and p.high is not None and m_lo <= p.low and p.high <= m_hi
    where = ("wholly outside the measured range" if outside else "within the measured range" if within
             else "reaching beyond the measured range" if m_lo <= p.value <= m_hi else "reaching into the measured range")
    return f"95% band {lo} to {hi}, {where}"


def surface_lines(s: Surface) -> list[str]:
    """The surface's sentences: the fit, its goodness, the zero contour at each measured value of
    the free axis, and where that line lies against the measured cells, with how sure."""
    if not s.fitted:
        why = "; ".join(n.removeprefix("no surface: ") for n in s.notes)
        return [f"No fitted surface over the map: {why}." if why else "No fitted surface over the map."]
    solved, free = (s.col_short, s.row_short) if s.solved == "col" else (s.row_short, s.col_short)
    shape = "with the interaction" if len(s.terms) == 4 else "a plane"
    cr, cc = s.centre
    names = {f"log2 {s.row_short}": f"log2({s.row_short}/{cr:.3g})", f"log2 {s.col_short}": f"log2({s.col_short}/{cc:.3g})"}
    names[f"log2 {s.row_short} × log2 {s.col_short}"] = " × ".join(names.values())
    body = " ".join(_coef_words(c, names.get(c.term), k == 0) for k, c in enumerate(s.coefficients))
    out = [f"Fitted surface ({shape}, weighted by 1/se², {s.cells} cells, {_dof(s.dof)} residual), "
           f"Δloss in nats with {LEVEL:.0%} intervals: Δloss = {body}."]
    if s.chi2_p is not None:
        verdict = ("the cells scatter about it more than their own intervals allow"
                   if s.chi2_p < 0.05 else "no more scatter than the cells' own intervals allow")
        out.append(f"Residual χ² = {s.chi2:.2f} on {_dof(s.dof)} (p = {s.chi2_p:.3g}): {verdict}; "
                   f"the intervals are scaled by χ²/dof = {s.scale:.3g}.")
    measured = s.measured["col" if s.solved == "col" else "row"]
    pts = [p for p in s.at_measured]
    if all(p.value is None for p in pts):
        out.append(f"No zero contour near the map: the fitted effect does not change sign along {solved} "
                   f"within a factor 2^60 of the measured cells.")
        return out + [f"Note: {n}." for n in s.notes]
    out.append(f"Fitted zero contour (where the surface predicts no effect), {solved} at each measured {free}:")
    for p in pts:
        if p.value is None:
            out.append(f"- at {free}={scalar(p.at)}: no crossing within a factor 2^60.")
            continue
        out.append(f"- at {free}={scalar(p.at)}: {solved} ≈ {p.value:.3g}, {_factor(p.value, measured)}; "
                   f"{_band_words(p, measured)}.")
    out.append(_where(s, pts, measured, solved, free))
    return out + [f"Note: {n}." for n in s.notes]


def _dof(n: int) -> str:
    return f"{n} degree{'s' if n != 1 else ''} of freedom"


def _coef_words(c: Coefficient, term: str | None, first: bool) -> str:
    """'+0.0051 [+0.0030, +0.0072]' for the intercept, '− 0.0221·log2(n_embd/128) [−0.0246, −0.0195]' after it."""
    ci = "" if c.ci_low is None else f" [{c.ci_low:+.4f}, {c.ci_high:+.4f}]".replace("-", "−")
    if first:
        return f"{c.estimate:.4f}".replace("-", "−") + ci
    sign = "−" if c.estimate < 0 else "+"
    return f"{sign} {abs(c.estimate):.4f}·{term}{ci}"


def nearest(s: Surface) -> ContourPoint | None:
    """The contour's point, at a measured value of the free axis, nearest the measured range of the
    solved axis (in doublings; 0 inside it); None without a contour."""
    measured = s.measured.get("col" if s.solved == "col" else "row") or []
    pts = [p for p in s.at_measured if p.value is not None]
    if not pts or not measured:
        return None

    def distance(p: ContourPoint) -> float:
        lo, hi = min(measured), max(measured)
        return 0.0 if lo <= p.value <= hi else abs(math.log2(p.value / (lo if p.value < lo else hi)))

    return min(pts, key=distance)


def _where(s: Surface, pts: list[ContourPoint], measured: list[float], solved: str, free: str) -> str:
    """One sentence: inside the measured cells or how far outside, and whether the band says so surely."""
    inside = [p for p in pts if p.value is not None and min(measured) <= p.value <= max(measured)]
    if inside:
        return (f"The line crosses the measured cells at {len(inside)} of {len(pts)} measured {free} values "
                f"(by the fit's point estimate).")
    near = nearest(s)
    edge = min(measured) if near.value < min(measured) else max(measured)
    doublings = abs(math.log2(near.value / edge))
    outside = ((near.high is not None and near.high < min(measured)) or
               (near.low is not None and near.low > max(measured)))
    sure = ("its 95% band lies wholly outside the measured range there: the line is outside the map with 95% "
            "confidence" if outside else "its 95% band reaches into the measured range (or is unbounded): the data "
            "do not place it outside with confidence")
    return (f"The line lies outside the measured cells: nearest at {free}={scalar(near.at)}, {solved} ≈ {near.value:.3g}, "
            f"{doublings:.2f} doublings (a factor {2**doublings:.3g}) beyond {solved}={scalar(edge)}; {sure}.")
