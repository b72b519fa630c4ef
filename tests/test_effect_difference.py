"""The difference of two comparisons' tying effects (compare/between.py), against scipy's Welch
test, and the script that prints it."""

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
from scipy import stats

from tiedlm.compare.between import NotComparable, effect_difference, seed_differences

ROOT = Path(__file__).resolve().parent.parent


def comparison(tied: list[float], untied: list[float], split="test") -> dict:
    runs, variants = [], []
    for label, losses in (("tied", tied), ("untied", untied)):
        names = [f"x-{label}-s{s}" for s in range(len(losses))]
        variants.append({"label": label, "runs": names, "seeds": list(range(len(losses)))})
        runs += [{"name": n, "seed": s, f"{split}_loss": v, "variant": label} for s, (n, v) in enumerate(zip(names, losses))]
    # a tuning run that is no variant's: never counted
    runs.append({"name": "x-tied-lr=1-s0", "seed": 0, f"{split}_loss": 99.0})
    return {"variants": variants, "runs": runs}


A = comparison([4.68, 4.66, 4.70], [4.58, 4.57, 4.60])
B = comparison([4.50, 4.52, 4.49, 4.55], [4.49, 4.50, 4.51, 4.50])


def test_per_seed_differences_pair_the_variants_runs_by_seed():
    assert seed_differences(A, "tied", "untied", "test") == pytest.approx({0: 0.10, 1: 0.09, 2: 0.10})


def test_the_difference_is_welchs_test_on_the_per_seed_differences():
    r = effect_difference(A, B)
    da, db = [0.10, 0.09, 0.10], [0.01, 0.02, -0.02, 0.05]
    ref = stats.ttest_ind(da, db, equal_var=False)
    assert r.difference.difference == pytest.approx(sum(da) / 3 - sum(db) / 4)
    assert r.difference.p_value == pytest.approx(ref.pvalue, rel=1e-6)
    lo, hi = ref.confidence_interval(0.95)
    assert (r.difference.ci_low, r.difference.ci_high) == pytest.approx((lo, hi), rel=1e-6)
    own = stats.ttest_1samp(da, 0.0)
    assert r.effect_a.p_value == pytest.approx(own.pvalue, rel=1e-6)
    assert math.exp(r.effect_a.difference) - 1 == pytest.approx(math.exp(sum(da) / 3) - 1)


def test_a_missing_variant_or_split_is_named():
    with pytest.raises(NotComparable, match="no variant 'projection'"):
        effect_difference(A, B, variant="projection")
    with pytest.raises(NotComparable, match="no seed with a validation loss"):
        effect_difference(A, B, split="validation")


def test_the_script_prints_both_effects_and_their_difference(tmp_path):
    pa, pb = tmp_path / "a.json", tmp_path / "b.json"
    pa.write_text(json.dumps(A))
    pb.write_text(json.dumps(B))
    out = tmp_path / "d.json"
    r = subprocess.run([sys.executable, str(ROOT / "scripts" / "effect_difference.py"), str(pa), str(pb),
                        "--name-a", "gpt2", "--name-b", "llama", "--json", str(out)],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.strip().splitlines()
    assert lines[0].startswith("gpt2: tied vs untied on test +10.15% (95% CI")
    assert "beyond the noise" in lines[2]
    assert json.loads(out.read_text())["difference"]["test"] == "welch"
    bad = subprocess.run([sys.executable, str(ROOT / "scripts" / "effect_difference.py"), str(pa),
                          str(tmp_path / "none.json")], capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "Traceback" not in bad.stderr and len(bad.stderr.strip().splitlines()) == 1
