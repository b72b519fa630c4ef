"""scripts/walks.py, which counts docs/architecture.md's two walks by tracing the code that runs:
what it counts, what it leaves aside, and the one-way seam between running and judging that it
sees at run time (tests/test_architecture.py sees it in the imports)."""

from tests.conftest import script_module


def test_the_walks_name_the_files_that_run_and_which_of_them_call_into_another():
    found = script_module("walks").walks()
    compare, train = found["compare"], found["train"]

    counted = set(train.counted())
    assert {"cli", "config/__init__", "train/__init__", "train/step", "model/blocks", "model/loss", "data/__init__"} <= counted
    assert "files" in train.seen and "files" not in counted  # run (the run folder's writes), left aside as a leaf
    assert set(train.directing()) <= counted
    assert {"cli", "train/__init__"} <= set(train.directing())
    assert "model/loss" not in train.directing()  # called, and returns: nothing of tiedlm's runs below it

    judged = set(compare.counted())
    assert {"experiment/driver", "compare/__init__", "compare/verdicts"} <= judged
    assert "train/step" not in judged  # training runs untraced: it is the other walk
    assert "compare/__init__" in compare.calls["experiment/driver"]  # the driver hands its runs down
    climbs = {(a, b) for a, called in compare.calls.items() if a.startswith("compare/")
              for b in called if b.startswith("experiment/")}
    assert climbs == set()  # and nothing on the judging side calls back up into the experiment side
