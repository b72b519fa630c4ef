"""Carving evaluation splits out of plain text by fraction: data.carve (random | contiguous) and
data.test_from (train | validation), on small local text files with the exact documents expected
in each split; their place in the cache key and the data identity; their refusals."""

import json

import pytest

from tiedlm import data
from tiedlm.config import load_config
from tiedlm.config.identity import ADDED_KEYS, config_hash
from tiedlm.data import _split_settings
from tiedlm.data.cache import key_of
from tiedlm.data.sources import resolve_source
from tiedlm.errors import ConfigError

from .test_data import assert_one_line_error, cfg_for, cli_data, prepare, raises, texts_of

LINES = [f"line {i:02d} of the text" for i in range(20)]  # one document a line, in order
VALID = [f"held out {i:02d}" for i in range(10)]


def write(path, lines):
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


@pytest.fixture
def one_file(tmp_path):
    return ("data.path=text", f"data.data_files={write(tmp_path / 'all.txt', LINES)}", "tokenizer.kind=byte")


@pytest.fixture
def wiki_style(tmp_path):
    """A train file and a validation file, no test file (WikiText-style local copies)."""
    files = {"train": str(write(tmp_path / "wiki.train.txt", LINES)),
             "validation": str(write(tmp_path / "wiki.valid.txt", VALID))}
    return ("data.path=text", f"data.data_files={json.dumps(files)}", "tokenizer.kind=byte")


def splits_of(p) -> dict[str, list[str]]:
    return {name: texts_of(p, name) for name in p.splits}


def test_contiguous_carves_consecutive_blocks_at_the_end_in_order(one_file):
    p = prepare(*one_file, "data.carve=contiguous", "data.validation_fraction=0.1", "data.test_fraction=0.15")
    # round(0.1 x 20) = 2 and round(0.15 x 20) = 3 documents, at the end of train, in source order
    assert splits_of(p) == {"train": LINES[:15], "validation": LINES[15:17], "test": LINES[17:]}
    assert p.info["splits"]["validation"] == "carved from train (10%, contiguous)"
    assert p.info["splits"]["test"] == "carved from train (15%, contiguous)"
    assert p.info["carving"]["carve"] == "contiguous" and p.info["carving"]["split_seed"] is None
    assert "consecutive blocks" in p.info["carving"]["method"]
    # the split seed draws nothing: another one gives the same splits
    again = prepare(*one_file, "data.carve=contiguous", "data.validation_fraction=0.1", "data.test_fraction=0.15",
                    "data.split_seed=7")
    assert splits_of(again) == splits_of(p)


def test_contiguous_with_only_validation_carved(tmp_path):
    files = {"train": str(write(tmp_path / "a.txt", LINES)), "test": str(write(tmp_path / "t.txt", VALID))}
    p = prepare("data.path=text", f"data.data_files={json.dumps(files)}", "tokenizer.kind=byte",
                "data.carve=contiguous", "data.validation_fraction=0.25")
    assert splits_of(p) == {"train": LINES[:15], "validation": LINES[15:], "test": VALID}
    assert p.info["splits"]["test"] == "test"


def test_random_carving_is_unchanged_by_the_new_keys(one_file):
    """The default: the documents of the carving as before (a permutation by split_seed, validation
    first), recorded as before."""
    import numpy as np

    p = prepare(*one_file, "data.validation_fraction=0.1", "data.test_fraction=0.15")
    perm = np.random.default_rng(0).permutation(20)
    expected = {"validation": sorted(perm[:2]), "test": sorted(perm[2:5]), "train": sorted(perm[5:])}
    assert splits_of(p) == {s: [LINES[i] for i in idx] for s, idx in expected.items()}
    assert p.info["splits"]["validation"] == "carved from train (10%, split_seed 0)"
    assert p.info["carving"] == {"from": "train", "split_seed": 0,
                                 "method": "a random permutation of the train split's documents",
                                 "validation_fraction": 0.1, "test_fraction": 0.15}


def test_test_from_validation_halves_the_validation_file(wiki_style):
    p = prepare(*wiki_style, "data.test_from=validation", "data.test_fraction=0.5", "data.carve=contiguous")
    assert splits_of(p) == {"train": LINES, "validation": VALID[:5], "test": VALID[5:]}
    assert p.info["splits"] == {"train": "train", "validation": "validation",
                                "test": "carved from validation (50%, contiguous)"}
    assert p.info["carving"]["from"] == "validation" and p.info["carving"]["test_fraction"] == 0.5

    q = prepare(*wiki_style, "data.test_from=validation", "data.test_fraction=0.3")  # at random
    got = splits_of(q)
    assert got["train"] == LINES and len(got["test"]) == 3 and len(got["validation"]) == 7
    assert sorted(got["validation"] + got["test"]) == VALID and not set(got["validation"]) & set(got["test"])
    assert q.info["splits"]["test"] == "carved from validation (30%, split_seed 0)"


def test_test_from_validation_under_an_alias(tmp_path):
    """WikiText's own file names: the validation split found as "valid" is what test is carved from."""
    files = {"train": str(write(tmp_path / "a.txt", LINES)), "valid": str(write(tmp_path / "v.txt", VALID))}
    p = prepare("data.path=text", f"data.data_files={json.dumps(files)}", "tokenizer.kind=byte",
                "data.test_from=validation", "data.test_fraction=0.2", "data.carve=contiguous")
    assert splits_of(p) == {"train": LINES, "validation": VALID[:8], "test": VALID[8:]}
    assert p.info["splits"]["test"] == "carved from valid (20%, contiguous)"


def test_tiedlm_data_prints_the_origins(tmp_path, wiki_style):
    r = cli_data(tmp_path, *wiki_style, "data.test_from=validation", "data.test_fraction=0.5",
                 "data.carve=contiguous")
    assert r.exit_code == 0, r.output
    assert "carved from validation (50%, contiguous)" in r.stdout


def test_a_changed_carving_never_reuses_the_old_entries(one_file, wiki_style):
    base = ("data.validation_fraction=0.1", "data.test_fraction=0.15")
    a = prepare(*one_file, *base)
    b = prepare(*one_file, *base, "data.carve=contiguous")  # the same cache: must not read a's arrays
    assert a.info["fingerprint"] != b.info["fingerprint"]
    assert a.info["tokenizer"]["key"] != b.info["tokenizer"]["key"]
    assert splits_of(b)["test"] == LINES[17:] and splits_of(a)["test"] != LINES[17:]
    assert data.data_identity(a) != data.data_identity(b)

    c = prepare(*wiki_style, "data.test_from=validation", "data.test_fraction=0.5")
    d = prepare(*wiki_style, "data.test_from=validation", "data.test_fraction=0.5", "data.carve=contiguous")
    assert len({c.info["fingerprint"], d.info["fingerprint"]}) == 2


def test_the_data_key_of_default_configs_is_as_before(one_file, wiki_style):
    """Runs written before the keys existed keep their data identity: at the defaults, the
    settings that choose the splits are exactly the old ones."""
    for files in (one_file, wiki_style):
        d = cfg_for(*files).data
        source = resolve_source(d)
        old = {"text_column": "text", "train_split": "train", "validation_split": "validation", "test_split": "test",
               "validation_fraction": 0.05, "test_fraction": 0.05, "split_seed": 0, "streaming": False,
               "stream_limit": None}
        assert _split_settings(d, source) == old
        assert prepare(*files).info["fingerprint"] == key_of({"source": source.fingerprint, "splits": old})
    for extra, added in (("data.carve=contiguous", {"carve": "contiguous", "split_seed": None}),
                         ("data.test_from=validation", {"test_from": "validation"})):
        d = cfg_for(*wiki_style, extra).data
        assert _split_settings(d, resolve_source(d)) == {**old, **added}


def test_the_config_hash_is_unchanged_at_the_defaults():
    args = ["train.max_steps=1", "data.path=text", "data.data_files=wiki.txt"]
    base = load_config(None, args)
    assert {k: ADDED_KEYS[k] for k in ("data.carve", "data.test_from")} == {"data.carve": "random",
                                                                            "data.test_from": "train"}
    for extra in ("data.carve=random", "data.test_from=train"):
        assert config_hash(load_config(None, [*args, extra])) == config_hash(base)
    for extra in ("data.carve=contiguous", "data.test_from=validation"):
        assert config_hash(load_config(None, [*args, extra])) != config_hash(base)


@pytest.mark.parametrize("overrides, message", [
    (["data.carve=lines"], "data.carve must be random or contiguous, got 'lines'"),
    (["data.test_from=test"], "data.test_from must be train or validation, got 'test'"),
    (["data.test_from=validation", "data.test_fraction=0"],
     "data.test_from: validation carves the test split from validation, and data.test_fraction is 0 — set "
     "data.test_fraction (of the validation documents, e.g. 0.5 for half) or carve test from train "
     "(--set data.test_from=train)"),
    (["data.test_fraction=0.5"], "data.test_fraction 0.5 of the training documents would carve a test split larger "
                                 "than what is left to train on (0.45) — lower data.test_fraction (0.05 is the default)"),
])
def test_config_refusals(overrides, message):
    with raises(ConfigError, match=None) as info:
        cfg_for(*overrides)
    assert str(info.value) == message


def test_test_from_validation_needs_a_validation_split_and_no_test_split(tmp_path, one_file):
    r = cli_data(tmp_path, *one_file, "data.test_from=validation")
    assert_one_line_error(r, f"data.test_from: validation carves test from the validation split, and text files: "
                             f"all.txt (1 file, 400 B) has none (it has: train) — name it with "
                             "data.validation_split, or carve test from train (--set data.test_from=train)", 2)
    r = cli_data(tmp_path, *one_file, "data.test_from=validation", "data.test_from=train")  # the fix, as typed
    assert r.exit_code == 0, r.output
    r = cli_data(tmp_path, *one_file, "data.test_from=validation", "data.test_fraction=0.5")  # half of validation:
    fix = "--set data.test_from=train --set data.test_fraction=0.05"  # too much of train, so the fix says both
    assert r.exit_code == 2 and f"or carve test from train ({fix})" in r.stderr, r.output
    r = cli_data(tmp_path, *one_file, "data.test_from=validation", "data.test_fraction=0.5", "data.test_from=train",
                 "data.test_fraction=0.05")
    assert r.exit_code == 0, r.output
    files = {"train": str(write(tmp_path / "a.txt", LINES)), "validation": str(write(tmp_path / "v.txt", VALID)),
             "test": str(write(tmp_path / "t.txt", VALID))}
    with raises(ConfigError, match=r"has a test split of its own \('test'\) — use it \(--set data.test_from=train\), "
                                   "or set data.test_split: null to carve test from validation anyway"):
        prepare("data.path=text", f"data.data_files={json.dumps(files)}", "tokenizer.kind=byte",
                "data.test_from=validation")
    # ... and with test_split: null it does
    p = prepare("data.path=text", f"data.data_files={json.dumps(files)}", "tokenizer.kind=byte",
                "data.test_from=validation", "data.test_split=null", "data.test_fraction=0.5", "data.carve=contiguous")
    assert splits_of(p)["test"] == VALID[5:]


def test_too_few_validation_documents_to_carve_from(tmp_path):
    files = {"train": str(write(tmp_path / "a.txt", LINES)), "validation": str(write(tmp_path / "v.txt", VALID[:1]))}
    from tiedlm.errors import DataError

    with raises(DataError, match=r"the validation split of .* has 1 non-empty documents, too few to carve test from "
                                 r"— add data or name existing splits \(data.test_split\)"):
        prepare("data.path=text", f"data.data_files={json.dumps(files)}", "tokenizer.kind=byte",
                "data.test_from=validation", "data.test_fraction=0.5", block_size=4)


def test_a_stream_cannot_be_carved_contiguously(one_file):
    with raises(ConfigError, match=r"data.carve: contiguous puts validation and test at the end of the train split, "
                                   r"and a stream \(data.streaming: true\) has no end to find"):
        prepare(*one_file, "data.streaming=true", "data.max_train_tokens=1000", "data.carve=contiguous")


def test_a_stream_carves_test_from_validation_at_random(wiki_style):
    p = prepare(*wiki_style, "data.streaming=true", "data.max_train_tokens=10000", "data.test_from=validation",
                "data.test_fraction=0.5", block_size=4)
    got = splits_of(p)
    assert got["train"] == LINES and sorted(got["validation"] + got["test"]) == VALID
    assert got["validation"] and got["test"]
