"""builtin:shakespeare: Tiny Shakespeare shipped in the package, checked by SHA-256 when read,
split into contiguous blocks of lines at speech boundaries (one document per speech), offline and
cached like every source; a tampered copy is one line; a tiny model trains on it."""

import gzip
import hashlib
import json
import tomllib

import numpy as np
import pytest

from tiedlm.data import builtin
from tiedlm.config import load_config
from tiedlm.data import prepare_data
from tiedlm.errors import ConfigError, DataError
from tiedlm.train import train_run

from .conftest import ROOT, SHARED_DATA, TINY
from .test_data import assert_one_line_error, cli_data, raises

SHAKESPEARE = "data.path=builtin:shakespeare"
N_LINES, N_BYTES = 40_000, 1_115_394
# The documented split, in lines [start, end) of the text: train to the first blank line at or
# after line round(0.90 x 40,000) = 36,000, validation to the first at or after 38,000, test the rest.
RANGES = {"train": (0, 36_009), "validation": (36_009, 38_000), "test": (38_000, 40_000)}
SPEECHES = {"train": 6_381, "validation": 418, "test": 423}
CHARS = {"train": 1_003_863, "validation": 50_506, "test": 46_580}  # of the speeches (no separators)


def raw_text() -> bytes:
    return gzip.decompress(builtin.SHAKESPEARE_FILE.read_bytes())


def prepare(*overrides, block_size=16):
    return prepare_data(load_config(None, ["train.max_steps=1", f"model.block_size={block_size}", SHAKESPEARE,
                                           *overrides]), progress=False)


def test_the_bundled_text_is_tiny_shakespeare_byte_for_byte():
    raw = raw_text()
    assert len(raw) == N_BYTES and raw.count(b"\n") == N_LINES
    assert hashlib.sha256(raw).hexdigest() == builtin.SHAKESPEARE_SHA256
    assert hashlib.md5(raw).hexdigest() == "6fb458f1232090904fb40fe944165e91"  # char-rnn's input.txt
    assert builtin.shakespeare_text() == raw.decode("utf-8")
    copy = SHARED_DATA / "tinyshakespeare" / "input.txt"
    if copy.exists():
        assert copy.read_bytes() == raw


def test_it_is_package_data_and_a_builtin():
    """A non-editable install ships it: pyproject declares it as package data of tiedlm."""
    meta = tomllib.loads((ROOT / "pyproject.toml").read_text())
    globs = meta["tool"]["setuptools"]["package-data"]["tiedlm"]
    package = ROOT / "tiedlm"
    assert builtin.SHAKESPEARE_FILE in {p for g in globs for p in package.glob(g)}
    assert "shakespeare" in builtin.BUILTINS


def test_the_splits_are_contiguous_blocks_in_order_cut_between_speeches():
    lines = raw_text().decode().split("\n")[:-1]
    layout_lines, ranges = builtin._shakespeare_layout()
    assert layout_lines == lines and ranges == RANGES
    for split, (a, b) in RANGES.items():
        assert a == 0 or not lines[a].strip(), f"{split} starts inside a speech"
    splits = builtin.shakespeare_splits()
    assert {s: len(d) for s, d in splits.items()} == SPEECHES
    assert {s: sum(map(len, d)) for s, d in splits.items()} == CHARS
    # every non-blank line exactly once, in text order, in the split its line number says
    for split, (a, b) in RANGES.items():
        assert [x for doc in splits[split] for x in doc.split("\n")] == [x for x in lines[a:b] if x.strip()]
    assert splits["train"][0] == "First Citizen:\nBefore we proceed any further, hear me speak."
    assert splits["validation"][0].startswith("BAPTISTA:\nI know not what to say")
    assert splits["test"][-1].endswith("Whiles thou art waking.")


def test_prepare_offline_is_cached_and_records_its_origins():
    import os

    assert os.environ["HF_DATASETS_OFFLINE"] == "1"  # conftest: no network
    p = prepare("tokenizer.kind=char")
    assert {s: v.n_docs for s, v in p.splits.items()} == SPEECHES
    assert {s: v.n_chars for s, v in p.splits.items()} == CHARS
    assert p.info["splits"]["validation"] == "built in: lines 36,010-38,000 of 40,000 (contiguous)"
    assert p.info["source"].startswith("builtin:shakespeare") and p.floor is None
    again = prepare("tokenizer.kind=char")
    assert again.info["cache"]["hit"] and again.info["fingerprint"] == p.info["fingerprint"]
    # the carving keys do not apply to a built-in corpus's own splits, nor change its entries
    assert prepare("tokenizer.kind=char", "data.carve=contiguous").info["cache"]["hit"]


@pytest.mark.parametrize("kind, extra", [("char", []), ("word", ["tokenizer.vocab_size=4096"]),
                                         ("bpe", ["tokenizer.vocab_size=512"])])
def test_every_tokenizer_sees_one_document_per_speech(kind, extra):
    p = prepare(f"tokenizer.kind={kind}", *extra)
    for name, s in p.splits.items():
        tokens = np.asarray(s.tokens)
        assert int(np.count_nonzero(tokens == p.tokenizer.eot_id)) == SPEECHES[name] == s.n_docs
        assert s.n_chars == CHARS[name] and 1.0 <= s.n_bytes / len(tokens) < 8
    if kind == "word":
        assert 0 < p.splits["validation"].oov_rate < 0.3


def tamper(tmp_path, monkeypatch, content: bytes):
    bad = tmp_path / "tinyshakespeare.txt.gz"
    bad.write_bytes(content)
    monkeypatch.setattr(builtin, "SHAKESPEARE_FILE", bad)
    return bad


def test_a_tampered_copy_is_one_line(tmp_path, monkeypatch):
    raw = bytearray(raw_text())
    raw[1000] ^= 0x20  # one byte: a letter's case
    bad = tamper(tmp_path, monkeypatch, gzip.compress(bytes(raw)))
    got = hashlib.sha256(bytes(raw)).hexdigest()
    assert_one_line_error(cli_data(tmp_path, SHAKESPEARE, "tokenizer.kind=char"),
                          f"the bundled corpus {bad} is not the text tiedlm shipped (SHA-256 {got[:16]}..., expected "
                          f"{builtin.SHAKESPEARE_SHA256[:16]}...) — reinstall tiedlm (pip install --force-reinstall "
                          "--no-deps tiedlm)", 1)


def test_a_damaged_or_missing_file_is_one_line(tmp_path, monkeypatch):
    bad = tamper(tmp_path, monkeypatch, builtin.SHAKESPEARE_FILE.read_bytes()[:5000])  # cut short
    with raises(DataError, match=rf"the bundled corpus {bad} is damaged \(.*\) — reinstall tiedlm"):
        builtin.shakespeare_text()
    bad.unlink()
    with raises(DataError, match=rf"the bundled corpus {bad} is missing — reinstall tiedlm"):
        builtin.shakespeare_text()


def test_test_from_validation_is_refused_for_a_builtin():
    with raises(ConfigError, match="data.test_from: validation carves test from validation, and builtin:shakespeare "
                                   r"brings its own train, validation and test splits — use them \(--set "
                                   r"data.test_from=train\)"):
        load_config(None, ["train.max_steps=1", SHAKESPEARE, "data.test_from=validation"])


def test_the_unknown_builtin_message_names_it():
    with raises(ConfigError, match="unknown built-in corpus builtin:nope — use builtin:synthetic, builtin:pydoc "
                                   "or builtin:shakespeare"):
        prepare("data.path=builtin:nope")


def test_a_tiny_model_trains_on_it(tmp_path):
    cfg = load_config(None, TINY + [SHAKESPEARE, "tokenizer.kind=char", "data.max_eval_tokens=2000"])
    run = train_run(cfg, out=tmp_path, progress=False)
    r = json.loads((run / "report.json").read_text())
    assert r["status"] == "finished" and r["steps"] == 12
    for split in ("validation", "test"):
        assert 1 < r["final"][split]["perplexity"] < 100  # 67 characters: a start, not a collapse
