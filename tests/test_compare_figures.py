"""The comparison's figures as a reader meets them: one colour per variant in every figure (the
tuning's included), the bucket figure on the verdict's split, the parameters figure naming the
weights compared, every figure captioned in comparison.md (what, on which split, which weights),
the tuning's perplexity axis ending at a labelled tick at or above its top point, and the runs
line saying how many were compared of how many trained. What was drawn is read from matplotlib's
objects (each figure's axes, recorded as plots.py opens them), not from pixels."""

import contextlib
import math
import re
from pathlib import Path

import pytest

import tiedlm.compare as C
import tiedlm.experiment as E
import tiedlm.compare.plots as plots
from tests.test_compare import TIED, UNTIED, make_run
from tests.test_compare_grid import make_grid
from tests.test_compare_select import UNTIED_BEST, make_runs
from tests.test_compare_tuning import run as tuned, stand_in  # noqa: F401 (stand_in: the fixture)
from tiedlm.config.naming import scalar
from .conftest import comparison_dir

@pytest.fixture
def drawn(monkeypatch):
    """File name -> the axes (one, or a list for two panels) each figure was drawn on."""
    seen: dict[str, object] = {}
    real = plots.figure

    @contextlib.contextmanager
    def recording(path, title, panels=1):
        with real(path, title, panels) as ax:
            seen[Path(path).name] = ax
            yield ax

    monkeypatch.setattr(plots, "figure", recording)
    return seen


def colours(ax) -> dict[str, str]:
    """Legend label -> colour (hex) of every labelled line, bar group and error bar on ax."""
    from matplotlib.colors import to_hex
    from matplotlib.container import BarContainer, ErrorbarContainer

    out = {}
    for line in ax.lines:
        if not line.get_label().startswith("_"):
            out[line.get_label()] = to_hex(line.get_color())
    for group in ax.containers:
        if group.get_label().startswith("_"):
            continue
        if isinstance(group, BarContainer):
            out[group.get_label()] = to_hex(group.patches[0].get_facecolor())
        elif isinstance(group, ErrorbarContainer):
            out[group.get_label()] = to_hex(group.lines[0].get_color())
    return out


def variant_artists(figs: dict) -> dict[str, dict[str, str]]:
    """Per figure, variant label -> the colour it was drawn in (a contrast's line counts as its variant's)."""
    return {
        **({"tune_curves.png": colours(figs["tune_curves.png"])} if "tune_curves.png" in figs else {}),
        "perplexity_vs_tokens.png": {k.split(" (n=")[0]: v for k, v in colours(figs["perplexity_vs_tokens.png"]).items()
                                     if " (n=" in k},
        "perplexity_vs_params.png": colours(figs["perplexity_vs_params.png"]),
        "bucket_loss.png": colours(figs["bucket_loss.png"]),
        "tying_effect_vs_tokens.png": {k.split(" vs ")[0]: v
                                       for k, v in colours(figs["tying_effect_vs_tokens.png"]).items()},
    }


def test_tied_and_untied_have_one_colour_each_in_every_figure(tmp_path, stand_in, drawn):  # noqa: F811
    """tune_curves.png drew tied in C0 and untied in C1 while every other figure, in the order of
    the comparison's variants (untied, the baseline, first), drew them the other way round."""
    from matplotlib.colors import to_hex

    c = tuned(tmp_path, stand_in, ["train.lr=3e-4,1e-3,3e-3,1e-2"], seeds=2)
    assert [v.label for v in c.variants] == ["untied", "tied"]
    per_figure = variant_artists(drawn)
    for name, found in per_figure.items():
        want = {"tied": to_hex("C1"), "untied": to_hex("C0")}
        if name == "tying_effect_vs_tokens.png":
            want = {"tied": want["tied"]}  # the one contrast, tied vs untied, in tied's colour
        assert found == want, name


def test_every_plot_function_draws_a_variant_in_the_one_mapping(tmp_path, stand_in, drawn, monkeypatch):  # noqa: F811
    """plots.variant_colors is the only place a variant's colour comes from: replaced, every figure
    that draws variants (or their contrasts) follows it, the tuning's and a grid's included."""
    palette = ["#a00001", "#a00002", "#a00003", "#a00004"]
    monkeypatch.setattr(plots, "variant_colors", lambda c: {v.label: palette[i] for i, v in enumerate(c.variants)})
    c = tuned(tmp_path / "tuned", stand_in, ["train.lr=3e-4,1e-3,3e-3,1e-2"], seeds=2)
    mine = {v.label: palette[i] for i, v in enumerate(c.variants)}
    for name, found in variant_artists(drawn).items():
        assert found and all(found[label] == mine[label] for label in found), name

    drawn.clear()
    runs = tmp_path / "grid"
    make_grid(runs)
    g = C.compare_runs(runs_dir=runs)
    mine = {v.label: palette[i] for i, v in enumerate(g.variants)}
    from matplotlib.colors import to_hex

    left, right = drawn[C.MATCHED_PLOT]
    for panel in (left, right):  # a point per setting, in its tied variant's colour, in the order of g.matched
        points = [to_hex(line.get_color()) for line in panel.lines if line.get_marker() == "o"]
        assert points == [mine[m.tied] for m in g.matched]
    trajectory = colours(drawn["tying_effect_vs_tokens.png"])
    assert trajectory == {m.label: mine[m.tied] for m in g.matched}
    assert variant_artists(drawn)["perplexity_vs_tokens.png"] == mine
    assert colours(drawn["bucket_loss.png"]) == mine and colours(drawn["perplexity_vs_params.png"]) == mine


def test_the_bucket_figure_is_on_the_verdicts_split(tmp_path, drawn):
    """bucket_loss.png drew validation while the table and the verdict were on test."""
    runs = tmp_path / "runs"
    for s in (0, 1):
        make_run(runs, f"b-tied-s{s}", s, TIED, val=50.0 + s, test=70.0 + s)
        make_run(runs, f"b-untied-s{s}", s, UNTIED, val=52.0 + s, test=90.0 + s)
    c = C.compare_runs(runs_dir=runs, primary="test")
    ax = drawn["bucket_loss.png"]
    assert ax.get_title().startswith("Test loss by token frequency") and ax.get_ylabel() == "test loss (nats per token)"
    names = c.bucket_names("test")
    bars = [group for group in ax.containers if not group.get_label().startswith("_")]
    assert [group.get_label() for group in bars] == ["untied", "tied"]
    for group in bars:
        v = c.variant(group.get_label())
        heights = [bar.get_height() for bar in group.patches]
        assert heights == pytest.approx([b.loss.mean for b in v.buckets("test")])
        assert heights != pytest.approx([b.loss.mean for b in v.buckets("validation")])
    assert [t.get_text() for t in ax.get_xticklabels()] == names
    md = (comparison_dir(runs) / "comparison.md").read_text()
    assert "## Loss by token frequency (test, secondary)" in md
    assert "![test loss by frequency bucket](bucket_loss.png)" in md

    drawn.clear()  # validation carries the verdict: the figure follows it
    C.compare_runs(runs_dir=runs, out=tmp_path / "val")
    assert drawn["bucket_loss.png"].get_title().startswith("Validation loss by token frequency")


@pytest.mark.parametrize("select, words", [("best", "best weights"), ("final", "last weights")])
def test_the_parameters_figure_names_the_weights_compared(tmp_path, drawn, select, words):
    """perplexity_vs_params.png said "final" where each run's best weights were compared."""
    make_runs(tmp_path)
    c = C.compare_runs(runs_dir=tmp_path, select=select, primary="test")
    assert c.select == select
    ax = drawn["perplexity_vs_params.png"]
    title = ax.get_title()
    assert title.startswith(f"Test perplexity of each run's {words}") and "final" not in title.lower()
    assert ax.get_ylabel() == "test perplexity"
    dots = next(col for col in ax.collections if len(col.get_offsets()) == 3
                and to_hex_of(col) == to_hex_of_label(ax, "untied"))
    ys = sorted(float(y) for _, y in dots.get_offsets())
    if select == "best":
        assert ys == pytest.approx(sorted(UNTIED_BEST))  # the best weights' test scores, as the verdict's
    caption = caption_after(comparison_dir(tmp_path) / "comparison.md", "perplexity_vs_params.png")
    assert f"Test perplexity of each run's {words}" in caption


def to_hex_of(collection) -> str:
    from matplotlib.colors import to_hex

    return to_hex(collection.get_facecolor()[0], keep_alpha=False)


def to_hex_of_label(ax, label) -> str:
    return colours(ax)[label]


IMAGE = re.compile(r"!\[[^\]]*\]\(([^)]+)\)")


def captions(md_path: Path) -> dict[str, str]:
    """Each figure of comparison.md -> the line after the blank line under it (its caption)."""
    lines = md_path.read_text().splitlines()
    return {m.group(1): lines[i + 2] for i, line in enumerate(lines) if (m := IMAGE.fullmatch(line))
            and lines[i + 1] == ""}


def caption_after(md_path: Path, name: str) -> str:
    return captions(md_path)[name]


def check_captioned(out: Path, c) -> dict[str, str]:
    """Every figure written is in comparison.md, each with a one-sentence caption under it that
    names the split it is drawn on and the weights."""
    md = (out / "comparison.md").read_text()
    images = IMAGE.findall(md)
    pngs = sorted(p.name for p in out.glob("*.png"))
    assert sorted(images) == pngs
    found = captions(out / "comparison.md")
    assert sorted(found) == pngs  # each image has a caption line after one blank line
    for name, caption in found.items():
        assert caption.startswith("*") and caption.endswith(".*") and caption.count(". ") == 0, (name, caption)
        text = caption.lower()
        assert "validation" in text or c.primary in text, (name, caption)
        assert "weights" in text, (name, caption)
    return found


def test_every_figure_in_comparison_md_has_a_caption(tmp_path, stand_in):  # noqa: F811
    c = tuned(tmp_path / "tuned", stand_in, ["train.lr=3e-4,1e-3,3e-3,1e-2"], seeds=2)
    found = check_captioned(comparison_dir(tmp_path / "tuned" / "runs"), c)
    assert {"tune_curves.png", "tying_effect_vs_tokens.png", *C.PLOTS.values()} == set(found)
    assert "Test perplexity of each run's last weights" in found["perplexity_vs_params.png"]
    assert "Test loss (nats per token) of each run's last weights" in found["bucket_loss.png"]
    assert "Validation perplexity of every point of the tuning (train.lr; final weights, tuning seed 0)" in \
        found["tune_curves.png"]
    assert "the verdict is on test" in found["tying_effect_vs_tokens.png"]

    runs = tmp_path / "grid"  # a grid's tying-effect figure
    make_grid(runs)
    g = C.compare_runs(runs_dir=runs)
    found = check_captioned(comparison_dir(runs), g)
    assert "The tying effect on validation perplexity of each run's last weights" in found[C.MATCHED_PLOT]
    assert "against model.n_embd (left)" in found[C.MATCHED_PLOT]

    runs = tmp_path / "map"  # a two-key grid's map and its buckets
    same = {"fingerprint": "wikitext", "tokenizer": "bpe"}  # one data set: the training fraction a prefix of it
    for (d, f), ratio in {(32, 0.5): 1.2, (32, 1.0): 1.3, (64, 0.5): 0.8, (64, 1.0): 1.1}.items():
        for seed in range(2):
            setting = [f"model.n_embd={d}", f"data.train_fraction={f}"]
            make_run(runs, f"u-{d}-{f}-s{seed}", seed, UNTIED + setting, val=100.0 + seed, identity=same)
            make_run(runs, f"t-{d}-{f}-s{seed}", seed, TIED + setting, val=(100.0 + seed) * ratio * (1 + 0.01 * seed),
                     identity=same)
    m = C.compare_runs(runs_dir=runs)
    assert m.tying_map is not None
    found = check_captioned(comparison_dir(runs), m)
    assert {C.TYING_MAP_PLOT, plots.TYING_MAP_BUCKETS_PLOT} <= set(found)
    assert "The tying effect on validation perplexity of each run's last weights in each cell" in \
        found[C.TYING_MAP_PLOT]


def test_best_weights_are_named_in_the_captions(tmp_path):
    make_runs(tmp_path)
    c = C.compare_runs(runs_dir=tmp_path)
    assert c.select == "best" and c.primary == "test"
    found = check_captioned(comparison_dir(tmp_path), c)
    for name in ("perplexity_vs_params.png", "bucket_loss.png"):
        assert "each run's best weights (its best validation evaluation)" in found[name]


def test_the_runs_line_says_how_many_were_compared_of_how_many_trained(tmp_path, stand_in):  # noqa: F811
    """comparison.md said "4 finished runs" after the command had trained 10 (8 of them tuning runs)."""
    c = tuned(tmp_path, stand_in, ["train.lr=3e-4,1e-3,3e-3,1e-2"], seeds=2)
    trained = len(set(stand_in.calls))
    md = (comparison_dir(tmp_path / "runs") / "comparison.md").read_text()
    line = md.splitlines()[2]
    assert line.startswith("4 runs compared of 10 trained (the other 6 are the tuning's: see *Each variant at its "
                           "own setting*), in 2 variants; baseline **untied**")
    assert trained == 2 * 4 + 2 and len(c.runs) == 4 and c.trained == trained
    # run again: every run is found finished, and the count is the same
    again = tuned(tmp_path, stand_in, ["train.lr=3e-4,1e-3,3e-3,1e-2"], seeds=2)
    assert len(stand_in.calls) == trained and again.trained == trained
    assert (comparison_dir(tmp_path / "runs") / "comparison.md").read_text().splitlines()[2].startswith(
        "4 runs compared of 10 trained")

    untuned = E.compare_config(tmp_path / "tiny.yaml", [], seeds=3, runs_dir=tmp_path / "plain", progress=False,
                               train=stand_in.train)
    assert untuned.trained == 6
    assert (comparison_dir(tmp_path / "plain") / "comparison.md").read_text().splitlines()[2].startswith(
        "6 runs compared of 6 trained, in 2 variants")

    runs = tmp_path / "found"  # compare of finished runs: nothing trained, so no "of"
    for s in (0, 1):
        make_run(runs, f"f-tied-s{s}", s, TIED)
        make_run(runs, f"f-untied-s{s}", s, UNTIED)
    found = C.compare_runs(runs_dir=runs)
    assert found.trained is None
    assert (comparison_dir(runs) / "comparison.md").read_text().splitlines()[2].startswith("4 finished runs compared, in 2")


def test_the_tuning_axis_is_labelled_at_its_top_point_and_at_each_value_tried(tmp_path, stand_in, drawn):  # noqa: F811
    """Validation perplexity from 50 to about 1,200 (more than 20×): only 100 and 1k were labelled,
    so the top point stood above the last label. The axis now ends at a labelled tick at or above
    it, and the tuned key's axis names each value tried."""
    c = tuned(tmp_path, stand_in, ["train.lr=1e-6,1e-5,1e-4,1e-3,1e-2"])
    ax = drawn["tune_curves.png"]
    ax.figure.canvas.draw()
    ys = [p.perplexity for v in c.tuning.variants for p in v.points]
    top, bottom = max(ys), min(ys)
    assert top / bottom > 20
    lo, hi = ax.get_ylim()
    labelled = [t.get_loc() for t in ax.yaxis.get_major_ticks() + ax.yaxis.get_minor_ticks()
                if t.label1.get_text() and lo <= t.get_loc() <= hi]
    assert max(labelled) * 1.02 >= top and min(labelled) <= bottom * 1.02  # a label at (within 2%) or beyond each end
    assert len(labelled) >= 4  # 1-2-5 steps over a span of more than 20×, not the decades alone
    tried = sorted({p.point["train.lr"] for v in c.tuning.variants for p in v.points})
    assert [t.get_text() for t in ax.get_xticklabels()] == [scalar(x) for x in tried]


@pytest.mark.parametrize("lo, hi", [(38.5, 201.6), (81, 2017), (2017, 2110), (0.5, 3e5), (11.7, 52.0)])
def test_log_ticks_bracket_the_data(lo, hi):
    from tiedlm.figures import log_ticks

    ticks = log_ticks(lo, hi)
    assert ticks == sorted(ticks) and ticks[0] <= lo and ticks[-1] >= hi
    assert sum(1 for t in ticks if lo <= t <= hi) >= 2
    assert all(math.isfinite(t) and t > 0 for t in ticks)
