"""Results that read right: "parameter-matched" only within its stated tolerance, analyze naming
a run's tie by its config's label, no empty interval in the shared-value line, and one rule for
"no finished runs" (2 for what the user typed, 1 for what happened)."""

import pytest
from typer.testing import CliRunner

import tiedlm.compare as C
from tests.test_compare import UNTIED, TIED, make_run
from tests.test_compare_tuning import run as tuned_run
from tests.test_compare_tuning import stand_in  # noqa: F401 (the fixture)
from tiedlm.cli import app
from tiedlm.compare.variants import PARAM_MATCH


def test_a_one_layer_model_with_a_fifth_fewer_parameters_is_not_called_matched(tmp_path):
    # half of this one layer (12·512² + 13·512 parameters) is more than V·d, which the old rule took as matched
    wide = ["model.n_layer=1", "model.n_head=2", "model.n_embd=512"]
    for s in (0, 1):
        make_run(tmp_path / "runs", f"w-tied-s{s}", s, TIED + wide, val=60.0 + s)
        make_run(tmp_path / "runs", f"w-untied-s{s}", s, UNTIED + wide, val=59.0 + s)
    c = C.compare_runs(runs_dir=tmp_path / "runs")
    vs = c.variant("tied").vs_baseline
    assert vs.params_relative < -PARAM_MATCH and vs.parameter_matched is False
    verdict = " ".join(c.variant("tied").verdicts)
    assert "parameter-matched" not in verdict and "fewer parameters" in verdict


def test_matched_is_said_with_its_tolerance(tmp_path):
    # two untied variants 1.6% apart in parameters (block_size 64 vs 128 adds position rows)
    for s in (0, 1):
        make_run(tmp_path / "runs", f"a-s{s}", s, UNTIED + ["model.block_size=64"], val=60.0 + s)
        make_run(tmp_path / "runs", f"b-s{s}", s, UNTIED + ["model.block_size=128"], val=61.0 + s)
    c = C.compare_runs(runs_dir=tmp_path / "runs", baseline="block_size=64")
    other = next(v for v in c.variants if v.vs_baseline is not None)
    assert 0 < other.vs_baseline.params_relative <= PARAM_MATCH and other.vs_baseline.parameter_matched
    assert f"within the {PARAM_MATCH:.0%} that counts as parameter-matched" in " ".join(other.verdicts)


def test_the_shared_value_line_says_no_interval_with_one_seed(tmp_path, stand_in):  # noqa: F811
    c = tuned_run(tmp_path, stand_in, ["train.lr=1e-3,3e-3,1e-2", "shared_seeds=true"], seeds=1)
    text = C.format_terminal_table(c)
    line = next(ln for ln in text.splitlines() if "each at its own best" in ln)
    assert "no interval (one seed)" in line and "95% CI – to –" not in line and "CI —" not in line


@pytest.mark.parametrize("status", ["failed", "diverged", "interrupted", "running"])
def test_no_finished_run_after_runs_ended_badly_exits_1(tmp_path, status):
    make_run(tmp_path / "runs", "x-s0", 0, TIED, status=status, error="boom" if status == "failed" else None)
    r = CliRunner().invoke(app, ["compare", str(tmp_path / "runs" / "x-s0"), "--out", str(tmp_path / "cmp")])
    assert r.exit_code == 1 and "no finished runs" in r.output and "Traceback" not in r.output
    assert not (tmp_path / "cmp").exists()


def test_no_run_at_all_exits_2(tmp_path):
    r = CliRunner().invoke(app, ["compare", str(tmp_path / "nothing-s0"), "--out", str(tmp_path / "cmp")])
    assert r.exit_code == 2 and "does not exist" in r.output


@pytest.fixture(scope="module")
def lowrank_run(tmp_path_factory):
    from tests.test_analyze import TINY
    from tiedlm.config import load_config
    from tiedlm.train import train_run

    root = tmp_path_factory.mktemp("runs")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TIEDLM_CACHE", str(tmp_path_factory.mktemp("cache")))
        cfg = load_config(None, TINY + ["model.tie_mode=lowrank", "model.untie_rank=2", "train.max_steps=4",
                                        "train.warmup_steps=1"])
        return train_run(cfg, out=root, name="lr-s0", progress=False)


def test_analyze_names_a_lowrank_run_by_its_mode(lowrank_run):
    r = CliRunner().invoke(app, ["analyze", str(lowrank_run)])
    assert r.exit_code == 0, r.output
    assert "(lowrank r=2, " in r.output and "(untied, " not in r.output
    md = (lowrank_run / "analysis.md").read_text()
    assert md.splitlines()[2].startswith("lowrank r=2; checkpoint")
