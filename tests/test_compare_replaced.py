"""A comparison never silently replaces one of other runs: comparing other runs into a folder that
holds an earlier comparison says so on the terminal; comparing the same runs again, or more of
them, does not."""

import tiedlm.compare as C
from tests.test_compare import make_run

TIED, UNTIED = ["model.tie_embeddings=true", "train.warmup_steps=10"], ["model.tie_embeddings=false",
                                                                        "train.warmup_steps=10"]


def test_comparing_other_runs_into_the_same_folder_says_it_replaced_the_earlier_one(tmp_path):
    a, b, out = tmp_path / "a", tmp_path / "b", tmp_path / "cmp"
    for runs, base in ((a, "main"), (b, "mine")):
        for seed in (0, 1):
            make_run(runs, f"{base}-tied-s{seed}", seed, TIED, val=60.0 + seed)
            make_run(runs, f"{base}-untied-s{seed}", seed, UNTIED, val=61.0 + seed)
    first = C.compare_runs([str(a)], out=out)
    assert first.replaced is None and "replaced" not in C.format_terminal_table(first)
    again = C.compare_runs([str(a)], out=out)  # the same runs: nothing replaced
    assert again.replaced is None
    other = C.compare_runs([str(b)], out=out)
    last = C.format_terminal_table(other).splitlines()[-1]
    assert last == (f"replaced the comparison in {out}, which compared other runs (main-tied-s0, main-tied-s1, "
                    "main-untied-s0 and 1 more) — give --into DIR to keep each comparison in a folder of its own")
