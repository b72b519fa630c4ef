"""The difference of two comparisons' tying effects (compare/effect_difference.py), against scipy's Welch
test, and the script that prints it."""

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
from scipy import stats

from tiedlm.compare.effect_difference import NotComparable, effect_difference, seed_differences

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


def script(*args, cwd=None):
    return subprocess.run([sys.executable, str(ROOT / "scripts" / "effect_difference.py"), *map(str, args)],
                          capture_output=True, text=True, timeout=60, cwd=cwd)


def one_line(r, exit_code=2) -> str:
    """The refusal's one line, after checking it is one, with no traceback and nothing printed."""
    assert r.returncode == exit_code and r.stdout == "" and "Traceback" not in r.stderr, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("effect_difference: ") and " — " in lines[0], r.stderr
    return lines[0]


def test_an_input_that_is_no_comparison_is_one_line_naming_it(tmp_path):
    pa = tmp_path / "a.json"
    pa.write_text(json.dumps(A))
    (tmp_path / "list.json").write_text("[]")
    (tmp_path / "latin1.json").write_bytes(b'{"variants": [], "runs": [], "note": "caf\xe9"}')
    (tmp_path / "empty").mkdir()
    (tmp_path / "nameless.json").write_text(json.dumps({"variants": [{"label": "tied", "runs": ["r"]}],
                                                        "runs": [{"name": "r", "test_loss": 1.0}]}))
    assert "list.json holds a JSON list, not a comparison" in one_line(script(pa, tmp_path / "list.json"))
    line = one_line(script(pa, tmp_path / "latin1.json"))
    assert "latin1.json is not UTF-8 text (byte 0xe9 at offset 41)" in line and "codec" not in line
    assert "empty is a folder without a comparison.json" in one_line(script(pa, tmp_path / "empty"))
    assert "run r has no whole-number seed" in one_line(script(pa, tmp_path / "nameless.json"))


def test_a_json_output_in_a_missing_folder_or_at_a_folder_is_refused_before_anything_is_read(tmp_path):
    pa, pb = tmp_path / "a.json", tmp_path / "b.json"
    pa.write_text(json.dumps(A))
    pb.write_text(json.dumps(B))
    line = one_line(script(pa, pb, "--json", tmp_path / "none" / "d.json"))
    assert f"the folder {tmp_path / 'none'} does not exist — create it" in line
    assert f"--json {tmp_path} is a folder — give a file name" in one_line(script(pa, pb, "--json", tmp_path))
    assert "is one of the comparisons compared" in one_line(script(pa, pb, "--json", pb))
    assert json.loads(pb.read_text()) == B  # the input is left as it was
    assert not (tmp_path / "none").exists()


@pytest.mark.parametrize("folder", ["compare-shakespeare", "compare"])  # compare/: before compare-NAME/
def test_a_runs_folder_stands_for_its_comparison(tmp_path, folder):
    (tmp_path / "a" / folder).mkdir(parents=True)
    (tmp_path / "a" / folder / "comparison.json").write_text(json.dumps(A))
    (tmp_path / "b.json").write_text(json.dumps(B))
    r = script(tmp_path / "a", tmp_path / "b.json", "--json", tmp_path / "d.json")
    assert r.returncode == 0 and r.stdout.startswith("a: tied vs untied on test +10.15%"), r.stderr
    assert json.loads((tmp_path / "d.json").read_text())["difference"]["test"] == "welch"


def test_a_runs_folder_of_several_comparisons_is_refused_naming_them(tmp_path):
    for folder in ("compare-one", "compare-two"):
        (tmp_path / "a" / folder).mkdir(parents=True)
        (tmp_path / "a" / folder / "comparison.json").write_text(json.dumps(A))
    (tmp_path / "b.json").write_text(json.dumps(B))
    line = one_line(script(tmp_path / "a", tmp_path / "b.json"))
    assert "holds 2 comparisons" in line and "compare-one" in line and "give the one you mean" in line


def with_paths(comparison: dict, folder: str) -> dict:
    return {**comparison, "runs": [{**r, "path": f"{folder}/{r['name']}"} for r in comparison["runs"]]}


def test_one_comparison_given_twice_is_refused_not_tested_as_two(tmp_path):
    """The same file, a copy, the same runs under another comparison (another `created`, the runs'
    paths relative), or the same runs at their absolute paths with other losses (another --select):
    Welch's test would take one set of runs as two ("+0.00%, p = 1.000")."""
    pa = tmp_path / "a.json"
    pa.write_text(json.dumps(A))
    assert "are the same comparison (one file)" in one_line(script(pa, pa))
    assert "are the same comparison (one file)" in one_line(script(pa, tmp_path / "." / "a.json"))
    (tmp_path / "copy.json").write_text(json.dumps(A, indent=2))
    assert "are the same comparison (the same contents)" in one_line(script(pa, tmp_path / "copy.json"))
    (tmp_path / "again.json").write_text(json.dumps({**with_paths(A, "runs"), "created": "later"}))
    line = one_line(script(pa, tmp_path / "again.json"))
    assert "compare the same runs (x-tied-s0, x-tied-s1, x-tied-s2, …)" in line
    assert "Welch's test would take one set of runs as two independent ones — give two comparisons trained apart" \
        in line
    absolute = with_paths(A, str(tmp_path / "runs"))
    (tmp_path / "abs.json").write_text(json.dumps(absolute))
    other = comparison([4.60, 4.61, 4.62], [4.50, 4.55, 4.52])  # other losses, the same runs on disk
    (tmp_path / "other.json").write_text(json.dumps(with_paths(other, str(tmp_path / "runs"))))
    assert "compare the same runs" in one_line(script(tmp_path / "abs.json", tmp_path / "other.json"))


def test_comparisons_sharing_some_runs_are_refused_and_same_names_elsewhere_are_not(tmp_path):
    """A shares its untied runs with C: not independent. B's runs have A's names (the same config
    on another corpus) but other losses and folders: two comparisons."""
    c = comparison([4.40, 4.41, 4.42], [4.58, 4.57, 4.60])  # A's untied losses, by name and seed
    for name, data in (("a", A), ("c", c), ("b", comparison([4.50, 4.52, 4.49], [4.49, 4.50, 4.51]))):
        (tmp_path / f"{name}.json").write_text(json.dumps(data))
    line = one_line(script(tmp_path / "a.json", tmp_path / "c.json"))
    assert "compare 3 of the same runs (x-untied-s0, x-untied-s1, x-untied-s2)" in line
    r = script(tmp_path / "a.json", tmp_path / "b.json")
    assert r.returncode == 0 and "Welch df" in r.stdout, r.stderr
