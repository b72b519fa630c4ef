"""compare/trajectory.py: the effect at each periodic evaluation (checked against scipy.stats on
the same per-seed losses), the crossover, whether the effect is still moving, the plot and its
place in comparison.json, .md and the terminal; and the FLOPs sentence when runs stopped early."""

import json
import math

import pytest

import tiedlm.compare as C
import tiedlm.experiment as E
from tests.test_compare import PNG, TIED, UNTIED, _strict_json, edit_report, make_run
from tests.test_compare_config import fake_training, write_config  # noqa: F401 (a fixture)
from tiedlm import runs as run_folder
from tiedlm.compare.trajectory import TrajectoryPoint, crossover, still_moving
from tiedlm.errors import ConfigError
from .conftest import comparison_dir

scipy_stats = pytest.importorskip("scipy.stats")

TOKENS_PER_STEP = 4096
STEPS = (25, 50, 75, 100)


def fabricate(runs, tag: str, overrides, seed: int, losses, steps=STEPS):
    """A finished run whose periodic validation losses are `losses` at `steps` (metrics.jsonl)."""
    run = make_run(runs, f"{tag}-s{seed}", seed, overrides, val=math.exp(losses[-1]), curve=False)
    run_folder.append_metrics(run, [{"kind": "eval", "step": s, "tokens": s * TOKENS_PER_STEP, "split": "validation",
                                     "loss": loss, "perplexity": math.exp(loss)} for s, loss in zip(steps, losses)])
    return run


def untied_loss(i: int, seed: int) -> float:
    return 5.0 - 0.1 * i + 0.03 * seed


def with_effects(runs, effects, jitter, steps=STEPS):
    """Tied and untied runs, one per jitter entry (seed): tied's loss is untied's + log(1 + effect)
    + that seed's jitter, so that with jitter summing to 0 the mean effect is exactly `effects`."""
    for seed, j in enumerate(jitter):
        fabricate(runs, "untied", UNTIED, seed, [untied_loss(i, seed) for i in range(len(steps))], steps)
        fabricate(runs, "tied", TIED, seed, [untied_loss(i, seed) + math.log1p(e) + j for i, e in enumerate(effects)],
                  steps)


def trajectory_json(out):
    data = _strict_json(out / "comparison.json")
    tied = next(v for v in data["variants"] if v["label"] == "tied")
    return tied["vs_baseline"]["trajectory"]


# ------------------------------------------------------------------ the points, against scipy


def test_paired_effect_and_interval_at_each_evaluation_match_scipy(tmp_path):
    runs = tmp_path / "runs"
    tied = {0: [5.0, 4.6, 4.41, 4.30], 1: [5.1, 4.62, 4.45, 4.31], 2: [4.95, 4.58, 4.40, 4.27]}
    untied = {0: [4.9, 4.61, 4.47, 4.36], 1: [5.02, 4.66, 4.50, 4.40], 2: [4.93, 4.6, 4.43, 4.35]}
    for seed in tied:
        fabricate(runs, "tied", TIED, seed, tied[seed])
        fabricate(runs, "untied", UNTIED, seed, untied[seed])
    c = C.compare_runs(runs_dir=runs)
    points = trajectory_json(comparison_dir(runs))["points"]
    assert [p["step"] for p in points] == list(STEPS)
    assert [p["tokens"] for p in points] == [s * TOKENS_PER_STEP for s in STEPS]
    for i, p in enumerate(points):
        a, b = [tied[s][i] for s in (0, 1, 2)], [untied[s][i] for s in (0, 1, 2)]
        d = [x - y for x, y in zip(a, b)]
        mean, se = sum(d) / 3, scipy_stats.sem(d)
        q = scipy_stats.t.ppf(0.975, 2)
        assert p["effect"] == pytest.approx(math.expm1(mean), rel=1e-9)
        assert p["ci_low"] == pytest.approx(math.expm1(mean - q * se), rel=1e-9)
        assert p["ci_high"] == pytest.approx(math.expm1(mean + q * se), rel=1e-9)
        assert p["p_value"] == pytest.approx(scipy_stats.ttest_rel(a, b).pvalue, rel=1e-7)
        assert (p["n_seeds"], p["test"]) == (3, "paired")
    # the last evaluation here is the final one: the trajectory ends where the verdict's numbers are
    assert c.trajectories["tied"].points[-1].effect == pytest.approx(c.variant("tied").contrast("validation").relative)


def test_welch_when_the_seeds_do_not_pair_matches_scipy(tmp_path):
    runs = tmp_path / "runs"
    tied = {0: [5.0, 4.5], 1: [5.2, 4.62], 2: [4.9, 4.41]}
    untied = {0: [5.1, 4.7], 1: [5.05, 4.66], 3: [5.3, 4.8]}
    for seed, losses in tied.items():
        fabricate(runs, "tied", TIED, seed, losses, steps=(50, 100))
    for seed, losses in untied.items():
        fabricate(runs, "untied", UNTIED, seed, losses, steps=(50, 100))
    C.compare_runs(runs_dir=runs)
    for i, p in enumerate(trajectory_json(comparison_dir(runs))["points"]):
        a, b = [v[i] for v in tied.values()], [v[i] for v in untied.values()]
        va, vb = scipy_stats.tvar(a) / 3, scipy_stats.tvar(b) / 3
        df = (va + vb) ** 2 / (va ** 2 / 2 + vb ** 2 / 2)  # Welch–Satterthwaite
        diff, half = sum(a) / 3 - sum(b) / 3, scipy_stats.t.ppf(0.975, df) * math.sqrt(va + vb)
        assert p["test"] == "welch" and p["n_seeds"] == 3
        assert p["effect"] == pytest.approx(math.expm1(diff), rel=1e-9)
        assert (p["ci_low"], p["ci_high"]) == pytest.approx((math.expm1(diff - half), math.expm1(diff + half)), rel=1e-9)
        assert p["p_value"] == pytest.approx(scipy_stats.ttest_ind(a, b, equal_var=False).pvalue, rel=1e-7)


def test_one_seed_gives_point_estimates_only_and_says_so(tmp_path):
    runs = tmp_path / "runs"
    with_effects(runs, [0.02, 0.01, -0.01, -0.02], [0.0])
    c = C.compare_runs(runs_dir=runs)
    t = trajectory_json(comparison_dir(runs))
    assert all(p["ci_low"] is None and p["ci_high"] is None and p["n_seeds"] == 1 for p in t["points"])
    assert [p["effect"] for p in t["points"]] == pytest.approx([0.02, 0.01, -0.01, -0.02], abs=1e-12)
    assert t["still_moving"] is None and t["final_half_width"] is None and "point estimates only" in t["note"]
    assert t["last_quarter_change"] == pytest.approx(-0.01, abs=1e-12)  # 75% of 410k: the evaluation at 307k
    md = (comparison_dir(runs) / "comparison.md").read_text()
    assert "With one seed per variant there is no interval: the plot shows point estimates only." in md
    assert c.trajectories["tied"].crossover is not None  # a sign change needs no interval


# ------------------------------------------------------------------ crossover


def points(effects, tokens=(100.0, 200.0, 300.0, 400.0)):
    return [TrajectoryPoint(tokens=t, step=None, effect=e, ci_low=None, ci_high=None, n_seeds=1, test="paired",
                            p_value=None) for t, e in zip(tokens, effects)]


def test_crossover_is_the_last_sign_change_interpolated_in_tokens():
    once = crossover(points([0.02, 0.01, -0.01, -0.03]), "tied", "untied")
    assert once.tokens == pytest.approx(250.0) and once.between == (200.0, 300.0)
    assert (once.direction, once.leader, once.text) == ("variant_ahead", "tied", "tied pulls ahead of untied after 250 tokens")
    assert crossover(points([-0.01, -0.02, -0.005, -0.03]), "tied", "untied") is None
    assert crossover(points([0.01, 0.02, 0.03]), "tied", "untied") is None
    back = crossover(points([0.02, -0.01, -0.02, 0.01]), "tied", "untied")  # changes, and changes back: the last
    assert back.tokens == pytest.approx(300 + 100 * 0.02 / 0.03) and back.between == (300.0, 400.0)
    assert (back.direction, back.leader) == ("reference_ahead", "untied")
    zero = crossover(points([0.01, 0.0, -0.01]), "tied", "untied")  # an exact zero has no sign: passed over
    assert zero.tokens == pytest.approx(200.0) and zero.between == (100.0, 300.0)


def test_crossover_in_the_outputs(tmp_path):
    runs = tmp_path / "runs"
    with_effects(runs, [0.03, 0.01, -0.01, -0.02], [-0.002, 0.002])
    c = C.compare_runs(runs_dir=runs)
    x = trajectory_json(comparison_dir(runs))["crossover"]
    assert list(x) == ["tokens", "between", "direction", "leader", "text"]
    assert x["tokens"] == pytest.approx(256_000, rel=1e-6) and x["between"] == [204_800, 307_200]
    assert x["direction"] == "variant_ahead" and x["leader"] == "tied"
    line = ("Over training, tied pulls ahead of untied after 256k tokens (the last change of sign of the effect on "
            "validation, between the evaluations at 205k and 307k tokens).")
    assert line in C.format_terminal_table(c).splitlines()
    md = (comparison_dir(runs) / "comparison.md").read_text()
    assert "- Over training, **tied** pulls ahead of **untied** after 256k tokens" in md


def test_no_crossover_is_null(tmp_path):
    runs = tmp_path / "runs"
    with_effects(runs, [-0.01, -0.02, -0.03, -0.03], [-0.002, 0.002])
    c = C.compare_runs(runs_dir=runs)
    assert trajectory_json(comparison_dir(runs))["crossover"] is None
    assert "pulls ahead" not in C.format_terminal_table(c)


# ------------------------------------------------------------------ still moving


EIGHT = tuple(range(10, 90, 10))  # evaluations at steps 10..80; 75% of the last one's tokens is step 60
JITTER = (-0.005, 0.0, 0.005)


def test_still_moving_when_the_late_change_exceeds_the_half_width(tmp_path):
    runs = tmp_path / "runs"
    effects = [-0.01] * 6 + [-0.03, -0.06]
    with_effects(runs, effects, JITTER, steps=EIGHT)
    c = C.compare_runs(runs_dir=runs)
    t = trajectory_json(comparison_dir(runs))
    last = [math.log1p(-0.06) + j for j in JITTER]
    h = scipy_stats.t.ppf(0.975, 2) * scipy_stats.sem(last)
    m = sum(last) / 3
    half = (math.exp(m + h) - math.exp(m - h)) / 2
    assert t["still_moving"] is True
    assert t["last_quarter_change"] == pytest.approx(-0.05, abs=1e-9)
    assert t["last_quarter_from_tokens"] == 60 * TOKENS_PER_STEP
    assert t["final_half_width"] == pytest.approx(half, rel=1e-9) and half < 0.05
    sentence = (f"is still moving: it changed by −5.0 points over the last quarter of training (246k to 328k tokens), "
                f"more than its interval's half-width (±{half * 100:.1f}) — train longer before trusting the verdict.")
    assert f"The effect of tied vs untied {sentence}" in C.format_terminal_table(c).splitlines()
    md = (comparison_dir(runs) / "comparison.md").read_text()
    assert f"- The effect of **tied** vs **untied** {sentence}" in md
    assert "| yes |" in md


def test_flat_effect_is_not_still_moving(tmp_path):
    runs = tmp_path / "runs"
    with_effects(runs, [-0.03] * 8, JITTER, steps=EIGHT)
    c = C.compare_runs(runs_dir=runs)
    t = trajectory_json(comparison_dir(runs))
    assert t["still_moving"] is False and t["last_quarter_change"] == pytest.approx(0.0, abs=1e-9)
    assert t["crossover"] is None
    assert "still moving" not in C.format_terminal_table(c)
    assert "still moving:" not in (comparison_dir(runs) / "comparison.md").read_text()


def test_still_moving_measures_from_the_evaluation_nearest_three_quarters():
    pts = points([0.0, -0.01, -0.02, -0.05], tokens=(100.0, 200.0, 290.0, 400.0))
    for p in pts:  # an interval of ±1 point around each
        p.ci_low, p.ci_high = p.effect - 0.01, p.effect + 0.01
    moving, change, start, half = still_moving(pts)
    assert (moving, start) == (True, 290.0) and change == pytest.approx(-0.03) and half == pytest.approx(0.01)
    assert still_moving(pts[:1]) == (None, None, None, None)


# ------------------------------------------------------------------ the plot, the JSON, --select best, --config


def test_plot_written_recorded_and_the_json_fields(tmp_path):
    runs = tmp_path / "runs"
    with_effects(runs, [0.03, 0.01, -0.01, -0.02], [-0.002, 0.002])
    c = C.compare_runs(runs_dir=runs)
    out = comparison_dir(runs)
    png = out / "tying_effect_vs_tokens.png"
    assert C.PLOTS["trajectory"] == png.name == C.TRAJECTORY_PLOT
    assert png.read_bytes()[:8] == PNG and c.files["plot_trajectory"] == str(png)
    record = json.loads((out / ".tiedlm-written.json").read_text())["files"]
    assert isinstance(record.get(png.name), str)  # recorded as tiedlm's, with its hash
    assert f"]({png.name})" in (out / "comparison.md").read_text()
    t = trajectory_json(out)
    assert list(t) == ["split", "variant", "reference", "points", "crossover", "still_moving", "last_quarter_change",
                       "last_quarter_from_tokens", "final_half_width", "note"]
    assert list(t["points"][0]) == ["tokens", "step", "effect", "ci_low", "ci_high", "n_seeds", "test", "p_value"]
    assert (t["split"], t["variant"], t["reference"]) == ("validation", "tied", "untied")
    assert _strict_json(out / "comparison.json")["variants"][0]["vs_baseline"] is None  # the baseline: no contrast
    C.compare_runs(runs_dir=runs)  # its own plot: replaced without a word
    png.write_bytes(PNG + b"mine")
    with pytest.raises(ConfigError, match="tying_effect_vs_tokens.png"):
        C.compare_runs(runs_dir=runs)


def test_with_the_best_weights_the_caption_says_the_trajectory_is_on_validation(tmp_path):
    from tests.test_compare_select import make_runs

    make_runs(tmp_path)
    c = C.compare_runs(runs_dir=tmp_path)
    assert c.select == "best" and c.primary == "test"
    md = (comparison_dir(tmp_path) / "comparison.md").read_text()
    assert ("The verdict is on test (the kept best weights); this trajectory is on validation, the only split "
            "evaluated during training.") in md
    assert (comparison_dir(tmp_path) / C.TRAJECTORY_PLOT).read_bytes()[:8] == PNG


def test_early_stopped_runs_end_the_trajectory_at_the_shared_evaluations(tmp_path):
    runs = tmp_path / "runs"
    for seed in (0, 1):
        fabricate(runs, "tied", TIED, seed, [5.0 - 0.1 * i + 0.01 * seed for i in range(4)])
        fabricate(runs, "untied", UNTIED, seed, [5.05 - 0.1 * i + 0.012 * seed for i in range(3)], steps=STEPS[:3])
    c = C.compare_runs(runs_dir=runs)
    t = c.trajectories["tied"]
    assert [p.step for p in t.points] == list(STEPS[:3]) and "stopped early" in t.note


def test_grid_has_a_trajectory_per_matched_contrast(tmp_path):
    runs = tmp_path / "runs"
    for d in (64, 128):
        for seed in (0, 1):
            make_run(runs, f"t{d}-s{seed}", seed, TIED + [f"model.n_embd={d}"], val=55.0 + seed)
            make_run(runs, f"u{d}-s{seed}", seed, UNTIED + [f"model.n_embd={d}"], val=58.0 + seed)
    c = C.compare_runs(runs_dir=runs)
    assert c.mode == "matched" and set(c.trajectories) == {m.tied for m in c.matched} and len(c.matched) == 2
    assert all(len(t.points) == 4 for t in c.trajectories.values())
    assert (comparison_dir(runs) / C.TRAJECTORY_PLOT).read_bytes()[:8] == PNG


def test_compare_config_writes_the_trajectory_too(tmp_path, fake_training):  # noqa: F811
    result = E.compare_config(write_config(tmp_path), [], seeds=2, runs_dir=tmp_path / "runs", progress=False,
                              train=fake_training.train)
    assert len(result.trajectories["tied"].points) == 4
    assert (comparison_dir(tmp_path / "runs") / C.TRAJECTORY_PLOT).read_bytes()[:8] == PNG


# ------------------------------------------------------------------ the FLOPs sentence


def test_flops_per_token_and_total_are_told_apart_when_runs_stopped_early(tmp_path):
    runs = tmp_path / "runs"
    for seed in (0, 1, 2):
        make_run(runs, f"tied-s{seed}", seed, TIED, val=57.0 + seed)
        untied = make_run(runs, f"untied-s{seed}", seed, UNTIED, val=59.0 + seed)
        edit_report(untied, tokens_seen=80 * TOKENS_PER_STEP, steps=80,
                    stopped_early={"step": 80, "budget_steps": 100, "reason": "no improvement"})
    c = C.compare_runs(runs_dir=runs)
    verdict = c.variant("tied").verdicts[0]
    assert ("It spends the same FLOPs per token (30M) and +25% total training FLOPs (12.3T vs 9.83T), because the "
            "**untied** runs stopped earlier (328k vs 410k tokens seen, mean over seeds).") in verdict
    assert "30M vs 30M" not in verdict
    vs = c.variant("tied").vs_baseline
    assert vs.train_flops_per_token == vs.baseline_train_flops_per_token == 3e7
    assert vs.train_flops_relative == pytest.approx(0.25) and not vs.compute_matched


def test_the_same_tokens_keep_the_per_token_sentence(tmp_path):
    runs = tmp_path / "runs"
    for seed in (0, 1):
        make_run(runs, f"tied-s{seed}", seed, TIED, val=57.0 + seed)
        untied = make_run(runs, f"untied-s{seed}", seed, UNTIED, val=59.0 + seed)
        edit_report(untied, flops_per_token={"forward": 1e7, "train": 2.4e7})
    verdict = C.compare_runs(runs_dir=runs).variant("tied").verdicts[0]
    assert "It spends +25% training FLOPs (30M vs 24M per token)." in verdict and "total" not in verdict


def test_the_summary_line_gives_the_path_and_whether_it_settled():
    from tiedlm.compare.sections import summary_sentence
    from tiedlm.compare.trajectory import Trajectory, TrajectoryPoint

    def point(tokens, effect):
        return TrajectoryPoint(tokens=tokens, step=None, effect=effect, ci_low=effect - 0.02, ci_high=effect + 0.02,
                               n_seeds=3, test="paired", p_value=0.01)

    t = Trajectory(variant="tied", reference="untied",
                   points=[point(100_000, 0.30), point(200_000, 0.20), point(300_000, 0.12), point(400_000, 0.10)],
                   still_moving=False, last_quarter_change=-0.02, final_half_width=0.02)
    line = summary_sentence(t)
    assert "over training, on validation: +30.0% at 100k, +20.0% at 200k, +10.0% at 400k tokens" in line
    assert "The verdict" not in line  # on validation, the verdict is the line's own last point
    assert "keeps its sign" in line and "settled: -2.0 points" in line.replace("−", "-")
    t.still_moving = None
    assert "cannot be judged" in summary_sentence(t)
    t.points = t.points[:1]
    assert summary_sentence(t) is None


def test_a_verdict_on_test_stands_beside_the_validation_line_in_words_and_on_the_figure(tmp_path):
    """The trajectory is on validation; where the verdict is on test, the line gives the verdict's
    own figure, and the figure draws it as a diamond with its interval at the end of the line."""
    from types import SimpleNamespace

    from tiedlm.compare.sections import summary_sentence
    from tiedlm.compare.trajectory import Trajectory, TrajectoryPoint

    t = Trajectory(variant="tied", reference="untied",
                   points=[TrajectoryPoint(tokens=k * 100_000, step=None, effect=0.2, ci_low=0.1, ci_high=0.3,
                                           n_seeds=3, test="paired", p_value=0.01) for k in (1, 2)],
                   still_moving=False, last_quarter_change=0.0, final_half_width=0.1)
    line = summary_sentence(t, ("test", SimpleNamespace(relative=0.0988)))
    assert "on validation: +20.0% at 100k" in line and line.endswith("The verdict, on test, is +9.88%.")
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.figure import Figure

    from tiedlm.compare.plots import _draw_verdict

    ax = Figure().add_subplot()
    d = SimpleNamespace(relative=0.0988, relative_ci_low=0.05, relative_ci_high=0.15)
    assert _draw_verdict(ax, d, t, "C0") == 1 and _draw_verdict(ax, None, t, "C0") == 0
    x, y = ax.lines[0].get_data()
    assert list(x) == [200_000] and abs(y[0] - 9.88) < 1e-9  # at the line's end, in percent
