"""perplexity.py, the one place a loss becomes a perplexity or a relative effect, and what a run does
with a loss too large to have one: the run ends as diverged in one line, every rerun says so,
and no JSON file holds Infinity or NaN."""

import ast
import json
import math
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tiedlm.cli import app
from tiedlm.files import json_text
from tiedlm.formatting import fmt
from tiedlm.perplexity import MAX_LOSS, perplexity, relative, representable
from tiedlm.train.selection import BestTracker

from .conftest import TINY

PACKAGE = Path(__file__).resolve().parents[1] / "tiedlm"


def test_perplexity_is_exp_and_an_explicit_overflow_past_the_largest_float():
    assert perplexity(math.log(97.2)) == pytest.approx(97.2, rel=1e-15)
    assert perplexity(0.0) == 1.0
    assert perplexity(MAX_LOSS - 1e-9) == pytest.approx(sys.float_info.max, rel=1e-8)
    for loss in (MAX_LOSS, 710.0, 1e7, math.inf):
        assert perplexity(loss) == math.inf  # never OverflowError
    assert math.isnan(perplexity(math.nan))
    assert perplexity(None) is None


def test_relative_is_exp_minus_one_or_none():
    assert relative(math.log(1.0988)) == pytest.approx(0.0988, rel=1e-12)
    assert relative(-math.log(2)) == pytest.approx(-0.5)
    assert relative(1e6) is None and relative(math.nan) is None and relative(None) is None


def test_representable_is_exactly_where_perplexity_is_finite():
    for loss in (0.0, 10.0, 709.0, MAX_LOSS - 1e-9, MAX_LOSS, 710.0, 1e30, math.inf, math.nan):
        assert representable(loss) == math.isfinite(perplexity(loss)), loss
    assert not representable(None) and not representable(-math.inf)  # no NLL is -inf: a broken number


def test_an_overflow_is_null_in_json_and_infinity_in_text():
    assert json.loads(json_text({"perplexity": perplexity(1e6), "loss": 1e6})) == {"perplexity": None, "loss": 1e6}
    assert fmt(perplexity(1e6), 2) == "∞"
    assert fmt(math.nan, 2) == "—"


def test_the_best_tracker_summarises_a_huge_finite_loss():
    # the summary of report.json raised OverflowError for a best loss past exp()'s range
    t = BestTracker()
    t.observe(4, 256, 9_859_666.5, 0.0)
    t.observe(6, 384, 6_738_346.5, 0.0)
    s = t.summary()
    assert s["perplexity"] == math.inf and s["last_perplexity"] == math.inf
    assert json.loads(json_text(s))["perplexity"] is None


def test_no_module_but_nats_takes_exp_of_a_loss():
    """math.exp appears only in perplexity.py and in the special functions of the statistics (beta and
    noncentral-t series, whose exponentials are of log-terms, not of losses); geometry's effective
    rank is exp of an entropy."""
    allowed = {"perplexity.py", "compare/stats.py", "analyze/geometry.py"}
    found = []
    for path in PACKAGE.rglob("*.py"):
        rel = path.relative_to(PACKAGE).as_posix()
        for node in ast.walk(ast.parse(path.read_text())):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in ("exp", "expm1")
                    and isinstance(node.func.value, ast.Name) and node.func.value.id == "math" and rel not in allowed):
                found.append(f"{rel}:{node.lineno}")
    assert not found, f"exp of a loss outside perplexity.perplexity / perplexity.relative: {found}"


def test_geometry_keeps_its_exp_to_the_effective_rank():
    text = (PACKAGE / "analyze" / "geometry.py").read_text()
    assert text.count("math.exp(") == 1 and "math.exp(-math.fsum(" in text


def test_a_huge_finite_loss_ends_the_run_as_diverged_and_every_rerun_says_so(tmp_path):
    # lr 1000 with no clipping: losses in the millions of nats, finite, before any gradient overflows
    args = ["train", "--config", str(tmp_path / "c.yaml"), "--out", str(tmp_path / "runs"), "-q"]
    (tmp_path / "c.yaml").write_text("{}\n")
    for o in TINY + ["train.lr=1000", "train.grad_clip=0", "train.weight_decay=0", "train.max_steps=6"]:
        args += ["--set", o]
    runner = CliRunner()
    for _ in range(2):
        r = runner.invoke(app, args)
        assert r.exit_code == 1, r.output
        lines = [ln for ln in r.stderr.splitlines() if ln.startswith("tiedlm: error")]
        assert len(lines) == 1 and "training diverged at step" in lines[0], r.stderr
        assert "Traceback" not in r.stderr and "OverflowError" not in r.stderr
    run = tmp_path / "runs" / "tiny-s0"
    report = json.loads((run / "report.json").read_text())
    assert report["status"] == "diverged" and "no perplexity" in report["error"]
    for line in (run / "metrics.jsonl").read_text().splitlines():
        json.loads(line, parse_constant=lambda c: pytest.fail(f"metrics.jsonl holds {c}"))


def test_bits_per_byte_is_the_total_over_ln2_over_the_bytes():
    from tiedlm.perplexity import bits_per_byte

    assert bits_per_byte(math.log(2) * 12.0, 3) == pytest.approx(4.0)  # 12 bits over 3 bytes
    assert bits_per_byte(5.0, 0) is None and bits_per_byte(5.0, None) is None
