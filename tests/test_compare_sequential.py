"""compare --config --seeds auto (compare/sequential.py): the group-sequential design's false-positive
rate under no effect (simulated through the very decision function the command uses), its power, its
boundaries against an independent numerical integration of the Brownian-motion design (itself checked
against the published Lan–DeMets values), the driver with a stand-in trainer, and the CLI's refusals."""

import json
import math
import shutil
import types
from functools import lru_cache
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

import tiedlm.compare as C
import tiedlm.experiment as E
from tests.test_compare import V, make_run
from tiedlm import runs as run_folder
from tiedlm.cli import app
from tiedlm.compare import sequential as S
from tiedlm.experiment import seeds
from tiedlm.compare.stats import ALPHA, detectable_nc, norm_cdf, paired_test, power_analysis, t_two_sided_p
from tiedlm.errors import ConfigError, DivergedError
from .conftest import comparison_dir

K = 10  # --max-seeds's default: the design simulated here


# ------------------------------------------------------------------ simulated comparisons


def simulate(diffs: np.ndarray, min_effect: float, decide=S.next_decision) -> tuple[np.ndarray, np.ndarray, list]:
    """Apply the design look by look to simulated per-seed loss differences (comparisons x seeds),
    as the command does: the paired t-test's p-value and the smallest detectable effect (what
    stats.paired_test and stats.power_analysis give, vectorised: the same formulas) go into
    next_decision. Returns each comparison's decision and seeds at its stop, and the naive verdicts
    (p < 0.05 at any look)."""
    n_sims = diffs.shape[0]
    looks: list[list[S.Look]] = [[] for _ in range(n_sims)]
    decision = np.array(["continue"] * n_sims, dtype=object)
    stopped_at = np.zeros(n_sims, dtype=int)
    naive = np.zeros(n_sims, dtype=bool)
    for n in range(S.FIRST_SEEDS, K + 1):
        x = diffs[:, :n]
        se = x.std(axis=1, ddof=1) / math.sqrt(n)
        t = x.mean(axis=1) / se
        mde_relative = np.expm1(detectable_nc(n - 1) * se)  # power_analysis's mde_relative
        for i in np.flatnonzero(decision == "continue"):
            p = t_two_sided_p(float(t[i]), n - 1)
            naive[i] |= p < ALPHA
            looks[i].append(S.Look(n, p, mde_relative=float(mde_relative[i])))
            decision[i] = looks[i][-1].decision = decide(looks[i], K, ALPHA, min_effect)
            stopped_at[i] = n
        for i in np.flatnonzero(decision != "continue"):  # the naive procedure goes on to every look
            if stopped_at[i] < n:
                naive[i] |= t_two_sided_p(float(t[i]), n - 1) < ALPHA
    return decision, stopped_at, naive


def test_the_vectorised_look_is_what_paired_test_and_power_analysis_give():
    d = [0.013, -0.004, 0.021, 0.002]
    test = paired_test(d, [0.0] * 4)
    se = np.std(d, ddof=1) / 2.0
    assert t_two_sided_p(float(np.mean(d) / se), 3) == pytest.approx(test.p_value, rel=1e-12)
    assert math.expm1(detectable_nc(3) * se) == pytest.approx(power_analysis(test).mde_relative, rel=1e-9)


def test_under_no_effect_the_design_keeps_false_positives_at_alpha_and_naive_looks_do_not():
    n_sims = 4000
    rng = np.random.default_rng(7)
    diffs = rng.normal(0.0, 0.03, size=(n_sims, K))  # per-seed Δloss, no true effect
    bound = ALPHA + 2 * math.sqrt(ALPHA * (1 - ALPHA) / n_sims)  # α plus two Monte-Carlo standard errors
    # futility off (the worst case: non-binding futility only removes chances to reject)
    decision, stopped_at, naive = simulate(diffs, min_effect=1e-12)
    rate, naive_rate = float(np.mean(decision == "efficacy")), float(np.mean(naive))
    print(f"null, {n_sims} comparisons: sequential {rate:.4f}, naive p < 0.05 at every look {naive_rate:.4f}")
    assert rate <= bound
    assert naive_rate > 0.10  # repeated testing at 0.05 over 8 looks: about 0.16
    assert set(decision) <= {"efficacy", "max"} and np.all(stopped_at[decision == "max"] == K)
    # with futility at 2% (σ = 0.03: it stops about one in six early), fewer still
    decision_f, stopped_f, _ = simulate(diffs, min_effect=S.MIN_EFFECT)
    assert np.mean(decision_f == "efficacy") <= rate and np.mean(decision_f == "futility") > 0.1


def test_under_a_large_effect_it_mostly_stops_early_for_efficacy():
    rng = np.random.default_rng(8)
    diffs = rng.normal(-0.05, 0.03, size=(500, K))  # tied 5% better, seed-to-seed SD 3%
    decision, stopped_at, _ = simulate(diffs, min_effect=1e-12)
    early = np.mean((decision == "efficacy") & (stopped_at < K))
    assert early > 0.8, early
    assert np.median(stopped_at[decision == "efficacy"]) <= 6


def test_the_calibrated_thresholds_hold_on_fresh_null_comparisons():
    """200,000 null comparisons with another seed than the calibration's: the design (|t| above the
    look's critical value, i.e. p below its threshold) crosses with probability α(t) by each look;
    the shortcut (Brownian z-boundaries converted to nominal t-test levels) is over α."""
    n_sims, rng = 200_000, np.random.default_rng(9)
    design = S.design(K)
    z_ref = brownian(K)
    from tiedlm.compare.stats import t_ppf

    total, squares = np.zeros(n_sims), np.zeros(n_sims)
    ours, shortcut = np.zeros(n_sims, dtype=bool), np.zeros(n_sims, dtype=bool)
    se = math.sqrt(ALPHA * (1 - ALPHA) / n_sims)
    for n in range(1, K + 1):
        x = rng.standard_normal(n_sims)
        total += x
        squares += x * x
        if n < S.FIRST_SEEDS:
            continue
        b = design[n - S.FIRST_SEEDS]
        t = np.abs(total) / np.sqrt((squares - total ** 2 / n) / (n - 1) * n)
        ours |= t > b.critical
        nominal = 2 * norm_cdf(-z_ref[n - S.FIRST_SEEDS][0])
        shortcut |= t > t_ppf(1 - nominal / 2, n - 1)
        assert abs(ours.mean() - b.spent) <= 3 * math.sqrt(b.spent / n_sims) + 1e-5, (n, ours.mean(), b.spent)
    assert ours.mean() <= ALPHA + 2 * se
    assert shortcut.mean() > ALPHA + 4 * se  # about 0.057: why the thresholds are calibrated on t


# ------------------------------------------------------------------ the boundaries


def test_the_spending_and_the_thresholds_have_the_designs_shape():
    design = S.design(K)
    assert [b.seeds for b in design] == list(range(3, K + 1))
    spent = [b.spent for b in design]
    assert all(a < b for a, b in zip(spent, spent[1:])) and spent[-1] == pytest.approx(ALPHA)
    assert spent[0] == pytest.approx(2 - 2 * norm_cdf(S.norm_isf(ALPHA / 2) / math.sqrt(0.3)))
    assert all(b.crossed <= b.spent for b in design)  # never more than it may spend
    assert all(b.spent - b.crossed < 2e-6 for b in design)  # and all of it (1,000,000 paths)
    thresholds = [b.threshold for b in design]
    assert all(a < b for a, b in zip(thresholds, thresholds[1:]))
    assert thresholds[0] < 1e-3  # the first look: nearly nothing spent
    assert 0.02 < thresholds[-1] < ALPHA  # the last: close to, and below, α
    assert S.design(K) is design  # computed once (cached) ...
    S.calibrate.cache_clear()
    assert S.design(K) == design  # ... and deterministic


def test_a_long_design_spends_nothing_at_first_and_alpha_by_the_end():
    design = S.calibrate(20, paths=100_000)
    assert design[0].threshold == 0.0 and design[0].critical == math.inf  # α(3/20) is 4e-7: under one path
    assert design[-1].crossed == pytest.approx(ALPHA, abs=1e-5) and 0.02 < design[-1].threshold < ALPHA
    assert not S.efficacy(1e-9, 0.0)  # a threshold of 0: no stop possible at that look ...
    assert S.efficacy(0.0, 0.0)  # ... but no spread between seeds and a difference is significant at any level
    assert S.mc_paths(10) == S.mc_paths(42) == 1_000_000 and S.mc_paths(1000) == 100_000


# The reference: the Brownian-motion design by recursive numerical integration (Armitage, McPherson
# & Rowe 1969; Jennison & Turnbull 2000, ch. 19), independent of the module's Monte Carlo.


def _tail(x):
    return np.array([0.5 * math.erfc(v / math.sqrt(2)) for v in np.ravel(x).tolist()]).reshape(np.shape(x))


def _simpson(b, h):
    m = max(2, 2 * math.ceil(b / h))
    s = np.linspace(-b, b, m + 1)
    w = np.ones(m + 1)
    w[1:-1:2], w[2:-1:2] = 4.0, 2.0
    return s, w * (2.0 * b / m) / 3.0


def _crossing(g, s, b, sd):
    return float((g * (_tail((b + s) / sd) + _tail((b - s) / sd))).sum())


def _solve(g, s, sd, target):
    lo, hi = 0.0, 12.0 * (abs(s).max() + sd)
    for _ in range(100):
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if _crossing(g, s, mid, sd) > target else (lo, mid)
    return 0.5 * (lo + hi)


@lru_cache(maxsize=None)
def z_boundaries(fractions: tuple, cumulative: tuple, step: float = 0.2, cap: float = 10.0) -> tuple:
    """(z boundary, crossing probability by then) per look: two-sided, symmetric, crossing by look k
    with probability cumulative[k]; S_k ~ N(0, t_k) with independent increments, the density of the
    paths not yet stopped on a Simpson grid aligned with each boundary (spacing `step` x the SD of the
    next increment, cut at |Z| = cap)."""
    out, crossed = [], 0.0
    for k, t in enumerate(fractions):
        target = cumulative[k] - crossed
        if k == 0:
            c = S.norm_isf(target / 2)
            b, p = c * math.sqrt(t), 2 * norm_cdf(-c)
            s, w = _simpson(b, step * math.sqrt(min(t, fractions[1] - t)))
            g = w * np.exp(-0.5 * s ** 2 / t) / math.sqrt(2 * math.pi * t)
        else:
            sd = math.sqrt(t - fractions[k - 1])
            b = _solve(g, s, sd, target) if target > 1e-15 else cap * math.sqrt(t)
            p, c = (_crossing(g, s, b, sd), b / math.sqrt(t)) if target > 1e-15 else (0.0, math.inf)
            if k + 1 < len(fractions):
                s_new, w = _simpson(min(b, cap * math.sqrt(t)), step * min(sd, math.sqrt(fractions[k + 1] - t)))
                kernel = np.exp(-0.5 * ((s_new[:, None] - s[None, :]) / sd) ** 2) / (sd * math.sqrt(2 * math.pi))
                s, g = s_new, w * (kernel @ g)
        crossed += p
        out.append((c, crossed))
    return tuple(out)


def brownian(max_seeds: int) -> tuple:
    fractions = tuple(n / max_seeds for n in range(S.FIRST_SEEDS, max_seeds + 1))
    return z_boundaries(fractions, tuple(S.spent(t) for t in fractions))


def test_the_reference_integration_gives_the_published_lan_demets_boundaries():
    """Five equally spaced looks, O'Brien–Fleming-type spending of 0.025 on each side (gsDesign
    sfLDOF, test.type = 2; ldbounds): 4.8769, 3.3569, 2.6803, 2.2898, 2.0310."""
    fractions = (0.2, 0.4, 0.6, 0.8, 1.0)
    z = S.norm_isf(0.0125)
    cumulative = tuple(2 * (2 - 2 * norm_cdf(z / math.sqrt(t))) for t in fractions)
    got = [c for c, _ in z_boundaries(fractions, cumulative)]
    assert got == pytest.approx([4.8769, 3.3569, 2.6803, 2.2898, 2.0310], abs=3e-4)


def test_with_a_known_variance_the_calibration_finds_the_integrated_boundaries():
    reference = brownian(K)
    calibrated = S.calibrate(K, statistic="z")
    spent_before = 0.0
    for (c, crossed), b in zip(reference, calibrated):
        assert b.crossed == pytest.approx(crossed, abs=2e-6)
        # Monte-Carlo error: a look whose boundary stops m of the 1,000,000 paths has a tail
        # probability off by about 1/√m relative, its boundary by about 1/(c·√m)
        m = (crossed - spent_before) * S.mc_paths(K)
        assert b.critical == pytest.approx(c, abs=4 / (c * math.sqrt(m))), (b.seeds, b.critical, c)
        spent_before = crossed
    # the t-test's own thresholds are lower than the z-boundaries' nominal levels: heavier tails at few seeds
    assert all(t.threshold < 2 * norm_cdf(-c) for t, (c, _) in zip(S.design(K), reference))


# ------------------------------------------------------------------ the decision


def looks(*ps, mde=0.5):
    return [S.Look(S.FIRST_SEEDS + i, p, mde_relative=mde) for i, p in enumerate(ps)]


def test_next_decision():
    first, last = S.threshold(3, K), S.threshold(K, K)
    assert S.next_decision(looks(first * 0.99)) == "efficacy"
    assert S.next_decision(looks(first * 1.01)) == "continue"
    assert S.next_decision(looks(0.5, mde=0.019)) == "futility"
    assert S.next_decision(looks(first * 0.5, mde=0.001)) == "efficacy"  # efficacy first
    assert S.next_decision(looks(None, mde=None)) == "continue"  # no p-value yet
    assert S.next_decision(looks(*[0.5] * 8)) == "max"
    assert S.next_decision(looks(*[0.5] * 7, last * 0.99)) == "efficacy"
    assert S.next_decision(looks(*[0.5] * 3), max_seeds=5) == "max"
    assert S.next_decision(looks(0.5, mde=0.3), min_effect=0.4) == "futility"
    with pytest.raises(ValueError, match="look 1 is at 4"):
        S.next_decision([S.Look(4, 0.5)])
    stopped = looks(0.5, 0.5)
    stopped[0].decision = "futility"
    with pytest.raises(ValueError, match="already stopped"):
        S.next_decision(stopped)


def drive(train, contrast_at, **design):
    """Run a SeedDesign as compare does: train each span it gives, tell it what was seen."""
    seq = seeds.SeedDesign("auto", **design)
    span = seq.first()
    while span is not None:
        ok = train(*span)
        span = seq.after(ok, contrast_at(seq.seeds))
    return seq.record


def test_the_design_trains_one_seed_per_variant_per_look_until_decided(monkeypatch):
    ps = {3: 0.2, 4: 0.01, 5: 1e-4}  # thresholds: 0.00034, 0.0016, 0.0041
    trained, lines = [], []

    def train(first, stop):
        trained.append((first, stop))
        return True

    def contrast_at(n):
        return types.SimpleNamespace(difference=-0.03, relative=math.expm1(-0.03), p_value=ps[n], se=0.01,
                                     df=n - 1, test="paired", power=types.SimpleNamespace(mde_relative=0.05))

    monkeypatch.setattr(seeds, "log", lines.append)  # imported by name at the top of experiment/seeds.py
    seq = drive(train, contrast_at, progress=True)
    assert trained == [(0, 3), (3, 4), (4, 5)]
    assert [x.decision for x in seq.looks] == ["continue", "continue", "efficacy"] and seq.stopped_because == "efficacy"
    assert [x.threshold for x in seq.looks] == [S.threshold(n, 10) for n in (3, 4, 5)]
    assert lines[0].startswith("sequential look 1 (3 seeds per variant): −2.96%, p=0.200 (threshold p < 0.000")
    last = seq.looks[-1]  # the interval at the adjusted level: Δ ± t(1 − threshold/2, 4)·se
    from tiedlm.compare.stats import t_ppf
    half = t_ppf(1 - last.threshold / 2, 4) * 0.01
    assert (last.ci_low, last.ci_high) == pytest.approx((math.expm1(-0.03 - half), math.expm1(-0.03 + half)))
    assert drive(lambda a, b: False, contrast_at).stopped_because == "failed"


def test_a_fixed_number_of_seeds_is_one_stage():
    seq = seeds.SeedDesign(4)
    assert seq.first() == (0, 4) and seq.after(True) is None and seq.seeds == 4 and seq.record is None


def test_check_auto_refuses_what_auto_cannot_take():
    assert seeds.check_auto("auto", None, None) == (10, 0.02)
    assert seeds.check_auto(3, None, None) == (10, 0.02)
    for bad in [("auto", 2, None), ("auto", 1001, None), ("auto", None, 0.0),
                ("auto", None, 1.0), ("auto", None, math.nan),
                (3, 5, None), (3, None, 0.1), ("three", None, None)]:
        with pytest.raises(ConfigError):
            seeds.check_auto(*bad)


# ------------------------------------------------------------------ the driver


@pytest.fixture
def stand_in(monkeypatch):
    """A train_run stand-in: the untied run's validation perplexity is 60 + 0.4·seed, the tied run's
    that times exp(state.diff(seed)) (the per-seed Δloss); train.lr moves both (a parabola in log lr
    with its best at 3e-3) for tuning. Records the runs it trained; `fail` names runs that diverge.
    Plots are not drawn (they cost seconds and say nothing here)."""
    import tiedlm.data

    state = types.SimpleNamespace(calls=[], fail=set(), diff=lambda seed: -0.05)

    def train_run(cfg, out=Path("runs"), name=None, overwrite=False, progress=True, **_):
        run_dir = Path(out) / name
        if run_folder.existing_state(run_dir, cfg) == "finished":
            return run_dir
        state.calls.append(name)
        if name in state.fail:
            raise DivergedError(f"{name}: loss is nan at step 3")
        shutil.rmtree(run_dir, ignore_errors=True)
        val = (60.0 + 0.4 * cfg.seed) * (1.0 + math.log(cfg.train.lr / 3e-3) ** 2)
        if cfg.model.tie_embeddings:
            val *= math.exp(state.diff(cfg.seed))
        return make_run(Path(out), name, cfg.seed, val=val, test=val * 1.01, cfg=cfg)

    monkeypatch.setattr(tiedlm.data, "prepare_data",
                        lambda cfg, progress=True: types.SimpleNamespace(model_vocab_size=V))
    monkeypatch.setattr("tiedlm.compare.outputs.write_plots", lambda c, out: None)
    state.train = train_run
    return state


def write_config(tmp_path: Path) -> Path:
    path = tmp_path / "tiny.yaml"
    path.write_text("name: tiny\nmodel:\n  n_layer: 2\n  n_head: 2\n  n_embd: 64\n  block_size: 64\n"
                    "train:\n  max_steps: 20\n  warmup_steps: 2\n  lr: 3.0e-3\n")
    return path


def auto(tmp_path, stand_in, **kw):
    return E.compare_config(write_config(tmp_path), [], seeds="auto", runs_dir=tmp_path / "runs", progress=False,
                            train=stand_in.train, **kw)


def trained_seeds(calls) -> list[int]:
    return sorted({int(name.rsplit("-s", 1)[1]) for name in calls})


def test_a_huge_effect_stops_at_three_seeds_and_the_reports_say_so(tmp_path, stand_in):
    c = auto(tmp_path, stand_in)
    assert trained_seeds(stand_in.calls) == [0, 1, 2] and len(stand_in.calls) == 6
    seq = c.sequential
    assert seq.stopped_because == "efficacy" and seq.seeds == 3 and len(seq.looks) == 1
    d = c.variant("tied").contrast("validation")
    assert d.n == 3 and d.significant and d.p_value < seq.threshold == S.threshold(3, 10)
    thr = S.fmt_threshold(seq.threshold)
    assert "stopped after 3 seeds (1 look) because the interval at the adjusted level" in seq.summary()
    verdict = c.variant("tied").verdicts[0]
    assert f"(sequential threshold p < {thr})" in verdict
    assert f"significant at the sequential design's adjusted level (p < {thr} at 3 seeds" in verdict
    assert "at 0.05" not in verdict

    data = json.loads((comparison_dir(tmp_path / "runs") / "comparison.json").read_text())["sequential"]
    assert data["rule"] == S.RULE and data["max_seeds"] == 10 and data["min_effect"] == 0.02
    assert data["calibration"] == {"statistic": "paired t", "paths": 1_000_000, "seed": S.MC_SEED}
    assert data["stopped_because"] == "efficacy" and data["contrast"] == "tied vs untied on validation"
    assert [set(x) >= {"seeds", "p_value", "threshold", "mde_relative", "decision"} for x in data["looks"]] == [True]
    assert data["looks"][0]["decision"] == "efficacy" and data["looks"][0]["threshold"] == seq.threshold
    md = (comparison_dir(tmp_path / "runs") / "comparison.md").read_text()
    assert "## Sequential design" in md and seq.summary() in md
    text = C.format_terminal_table(c)
    assert seq.summary() in text and "  3 seeds: " in text


def test_seeds_are_added_while_undecided_then_it_stops_for_efficacy(tmp_path, stand_in):
    d = [-0.03, -0.01, -0.05] + [-0.03] * 7  # significant at the adjusted level from 6 seeds on
    stand_in.diff = lambda seed: d[seed]
    c = auto(tmp_path, stand_in, min_effect=0.01)
    assert [x.decision for x in c.sequential.looks] == ["continue"] * 3 + ["efficacy"]
    assert trained_seeds(stand_in.calls) == list(range(6)) and c.sequential.seeds == 6
    assert [v.n_seeds for v in c.variants] == [6, 6]
    p4 = c.sequential.looks[1].p_value
    assert S.threshold(4, 10) < p4 < 0.05  # the naive test would have stopped at 4 seeds
    stand_in.calls.clear()
    again = auto(tmp_path, stand_in, min_effect=0.01)  # a rerun trains nothing, and looks the same way
    assert stand_in.calls == [] and [x.to_json() for x in again.sequential.looks] == \
        [x.to_json() for x in c.sequential.looks]


def test_no_effect_goes_on_to_max_seeds_and_is_not_significant(tmp_path, stand_in):
    noise = [0.011, -0.013, 0.004, -0.009, 0.012]
    stand_in.diff = lambda seed: noise[seed]
    c = auto(tmp_path, stand_in, max_seeds=5, min_effect=1e-6)
    assert c.sequential.stopped_because == "max" and [x.seeds for x in c.sequential.looks] == [3, 4, 5]
    assert trained_seeds(stand_in.calls) == [0, 1, 2, 3, 4]
    assert c.variant("tied").contrast("validation").significant is False
    assert "stopped at the maximum, after 5 seeds (3 looks)" in c.sequential.summary()
    assert "not significant at the sequential design's adjusted level" in c.variant("tied").verdicts[0]


def test_futility_stops_when_the_seeds_already_detect_effects_below_min_effect(tmp_path, stand_in):
    stand_in.diff = lambda seed: [0.002, -0.003, 0.001][seed]
    c = auto(tmp_path, stand_in, min_effect=0.5)
    look = c.sequential.looks[-1]
    assert c.sequential.stopped_because == "futility" and c.sequential.seeds == 3 and look.mde_relative < 0.5
    assert "for futility" in c.sequential.summary() and "below --min-effect 50%" in c.sequential.summary()


def test_a_failed_run_stops_the_design(tmp_path, stand_in):
    stand_in.diff = lambda seed: [0.011, -0.013, 0.004, -0.009][seed]
    stand_in.fail.add("tiny-tied-s3")
    c = auto(tmp_path, stand_in, min_effect=1e-6)
    assert c.sequential.stopped_because == "failed" and c.sequential.seeds == 4
    assert [f.name for f in c.train_failures] == ["tiny-tied-s3"]
    assert "a run failed to train" in c.sequential.summary()


def test_tuning_then_auto_seeds_at_the_chosen_values(tmp_path, stand_in):
    c = auto(tmp_path, stand_in, tune=["train.lr=1e-3,3e-3,1e-2"])
    assert c.primary == "test" and c.sequential.stopped_because == "efficacy" and c.sequential.seeds == 3
    assert c.sequential.contrast == "tied vs untied on test"
    assert {v.n_seeds for v in c.variants} == {3}


def test_a_number_of_seeds_is_unchanged_and_has_no_design(tmp_path, stand_in):
    c = E.compare_config(write_config(tmp_path), [], seeds=2, runs_dir=tmp_path / "runs", progress=False,
                         train=stand_in.train)
    assert c.sequential is None and c.to_json()["sequential"] is None and len(stand_in.calls) == 4
    assert "significant at 0.05" in c.variant("tied").verdicts[0]


# ------------------------------------------------------------------ the command line


runner = CliRunner()


@pytest.mark.parametrize("args, message", [
    (["--seeds", "3", "--max-seeds", "5"], "--max-seeds only applies with --seeds auto"),
    (["--min-effect", "0.1"], "--min-effect only applies with --seeds auto"),
    (["--seeds", "auto", "--max-seeds", "2"], "--max-seeds must be a whole number from 3 to 1000"),
    (["--seeds", "auto", "--max-seeds", "1001"], "--max-seeds must be"),
    (["--seeds", "auto", "--min-effect", "0"], "--min-effect must be a fraction between 0 and 1"),
    (["--seeds", "auto", "--min-effect", "1"], "--min-effect must be"),
    (["--seeds", "auto", "--min-effect", "nan"], "--min-effect must be"),
    (["--seeds", "auto", "--match", "flops"], "--match 'flops' is not known"),
    (["--seeds", "three"], "--seeds must be a whole number or auto"),
    (["--seeds", "0"], "--seeds must be positive"),
    (["--seeds", "1001"], "--seeds must be at most 1,000"),
])
def test_the_command_refuses_in_one_line(tmp_path, args, message):
    r = runner.invoke(app, ["compare", "--config", str(write_config(tmp_path)), "--out", str(tmp_path / "runs"),
                            *args])
    assert r.exit_code == 2, r.output
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], lines
    assert not (tmp_path / "runs").exists()


def test_auto_options_need_config(tmp_path):
    r = runner.invoke(app, ["compare", "--out", str(tmp_path / "runs"), "--max-seeds", "5"])
    assert r.exit_code == 2 and "--max-seeds only applies with --config" in r.stderr


def test_the_adjusted_level_is_an_input_of_the_verdict_not_a_rewrite_of_it():
    """verdicts.verdict judges a contrast at the level it is given (stats.AdjustedLevel): a p-value
    between the threshold and 0.05 is not significant there, and the sentence says the threshold;
    the sequential design only hands the level over (no verdict string is edited after it is made)."""
    import inspect

    from tiedlm.compare.stats import AdjustedLevel
    from tiedlm.compare.variants import SplitContrast
    from tiedlm.compare.verdicts import verdict

    d = SplitContrast(difference=0.03, ci_low=0.001, ci_high=0.06, p_value=0.02, n=4, test="paired", relative=0.0305,
                      relative_ci_low=0.001, relative_ci_high=0.0618, significant=False, variant_mean=103.0,
                      baseline_mean=100.0, adjusted=AdjustedLevel(0.0125, 4, -0.004, 0.066))
    line = verdict("tied", "untied", d, "test")
    assert "p=0.020 (sequential threshold p < 0.0125)" in line
    assert line.endswith("not significant at the sequential design's adjusted level (p < 0.0125 at 4 seeds; its "
                         "98.75% interval, −0.40% to +6.60%, includes 0%).")
    d.adjusted = None
    assert verdict("tied", "untied", d, "test").endswith(": not significant at 0.05 (the interval includes 0%).")
    source = inspect.getsource(S)
    assert ".replace(" not in source and "verdicts[0] =" not in source
