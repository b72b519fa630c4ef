"""tiedlm.data: prepare_data end to end (builders, folders, built-in corpora, streaming, token
limits), what `tiedlm data` prints, and the helpers the other test_data_* modules share.

Everything here is offline and CPU-only: the tests write their own small files. Tests on the
real corpora in ../shared/data skip when that folder is absent.
"""

import contextlib
import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from tiedlm import data
from tiedlm.cli import app
from tiedlm.config import load_config
from tiedlm.errors import ConfigError, DataError

from .conftest import ROOT, SHARED_DATA

# Distinct, easily recognised documents so that carving can be checked by text.
DOCS = [f"document {i}: the quick brown fox {i} jumps over the lazy dog; ünïcödé ✓ {i * i}" for i in range(60)]


def cfg_for(*overrides, block_size=8):
    return load_config(None, ["train.max_steps=1", f"model.block_size={block_size}", *overrides])


def prepare(*overrides, block_size=8, **kwargs):
    return data.prepare_data(cfg_for(*overrides, block_size=block_size), progress=False, **kwargs)


def texts_of(prepared, split):
    """The documents of a split, decoded back from its tokens."""
    tok = prepared.tokenizer
    return tok.decode(np.asarray(prepared.splits[split].tokens)).split(
        "<|endoftext|>" if tok.kind == "bpe" else "<eot>")[:-1]


@contextlib.contextmanager
def raises(kind, match):
    """pytest.raises, and the error is exactly `kind` (not a subclass, not its base)."""
    with pytest.raises(kind, match=match) as info:
        yield info
    assert type(info.value) is kind, f"{type(info.value).__name__}: {info.value}"


def token_digests(prepared) -> dict[str, str]:
    return {s: hashlib.sha256(np.ascontiguousarray(v.tokens).tobytes()).hexdigest()
            for s, v in prepared.splits.items()}


def digests_in_a_fresh_process(cache: Path, *overrides, block_size=8) -> dict[str, str]:
    """token_digests of the same prepare, done by another Python process with an empty cache: no
    memo, cache or random state of this process can make the two agree."""
    code = ("import hashlib, json, sys\nimport numpy as np\nfrom tiedlm.config import load_config\n"
            "from tiedlm.data import prepare_data\n"
            "p = prepare_data(load_config(None, json.loads(sys.argv[1])), progress=False)\n"
            "print(json.dumps({s: hashlib.sha256(np.ascontiguousarray(v.tokens).tobytes()).hexdigest() "
            "for s, v in p.splits.items()}))")
    args = ["train.max_steps=1", f"model.block_size={block_size}", *overrides]
    r = subprocess.run([sys.executable, "-c", code, json.dumps(args)], cwd=ROOT, capture_output=True, text=True,
                       env={**os.environ, "TIEDLM_CACHE": str(cache)}, timeout=300)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout.strip().splitlines()[-1])


def write_corpus(folder: Path) -> Path:
    """DOCS as a text file, one document a line, with blank lines among them."""
    path = folder / "corpus.txt"
    path.write_text("\n".join(DOCS[:40]) + "\n\n   \n" + "\n".join(DOCS[40:]) + "\n", encoding="utf-8")
    return path


@pytest.fixture
def text_file(tmp_path):
    return write_corpus(tmp_path)


# Through the command line


def cli(*args):
    return CliRunner().invoke(app, [str(a) for a in args])


def data_command(tmp_path, *overrides) -> list[str]:
    """The arguments of `tiedlm data` with a small config and --set overrides."""
    config = tmp_path / "config.yaml"
    config.write_text("name: t\ntrain:\n  max_steps: 1\nmodel:\n  block_size: 8\n", encoding="utf-8")
    return ["data", "--config", str(config), *(x for o in overrides for x in ("--set", o))]


def cli_data(tmp_path, *overrides):
    return cli(*data_command(tmp_path, *overrides))


def assert_one_line_error(r, message, code):
    lines = r.stderr.strip().splitlines()  # datasets' progress bars included: there are none
    assert r.exit_code == code, r.output
    assert lines == [f"tiedlm: error: {message}"], r.stderr
    assert "Traceback" not in r.output and isinstance(r.exception, SystemExit)


# --------------------------------------------------------------------------------------------
# Sources, end to end


def test_text_builder_one_document_per_nonempty_line(text_file):
    p = prepare("data.path=text", f"data.data_files={text_file}", "tokenizer.kind=byte")
    assert set(p.splits) == {"train", "validation", "test"}
    assert sum(s.n_docs for s in p.splits.values()) == len(DOCS)  # blank lines are not documents
    assert sorted(sum((texts_of(p, s) for s in p.splits), [])) == sorted(DOCS)
    train = p.splits["train"]
    assert train.tokens.dtype == np.uint16 and train.tokens.ndim == 1
    assert isinstance(train.tokens, np.memmap)
    assert int(np.count_nonzero(np.asarray(train.tokens) == p.tokenizer.eot_id)) == train.n_docs
    assert train.tokens[-1] == p.tokenizer.eot_id  # an EOT after the last document too
    # bytes and words of the documents, plus one per separator
    kept = texts_of(p, "train")
    assert train.n_bytes == sum(len(t.encode()) for t in kept) + len(kept) == len(train.tokens)
    assert train.n_words == sum(len(t.split()) for t in kept) + len(kept)
    assert train.n_chars == sum(map(len, kept))


def test_data_files_mapping_glob_and_list(tmp_path):
    (tmp_path / "a").mkdir()
    for i in range(3):
        (tmp_path / "a" / f"part{i}.txt").write_text("\n".join(DOCS[i * 10:(i + 1) * 10]), encoding="utf-8")
    (tmp_path / "valid.txt").write_text("\n".join(DOCS[30:40]), encoding="utf-8")
    (tmp_path / "test.txt").write_text("\n".join(DOCS[40:50]), encoding="utf-8")
    files = {"train": str(tmp_path / "a" / "*.txt"), "validation": [str(tmp_path / "valid.txt")],
             "test": str(tmp_path / "test.txt")}
    p = prepare("data.path=text", f"data.data_files={json.dumps(files)}", "tokenizer.kind=char")
    assert sorted(texts_of(p, "train")) == sorted(DOCS[:30])
    assert texts_of(p, "validation") == DOCS[30:40]
    assert texts_of(p, "test") == DOCS[40:50]
    assert p.info["carving"] is None and p.info["splits"]["validation"] == "validation"

    # a list of files is the train split; validation and test are carved from it
    listed = json.dumps([str(tmp_path / "valid.txt"), str(tmp_path / "test.txt")])
    p = prepare("data.path=text", f"data.data_files={listed}", "tokenizer.kind=byte")
    assert p.splits["train"].n_docs + p.splits["validation"].n_docs + p.splits["test"].n_docs == 20


def test_jsonl_csv_parquet_with_text_column(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = [{"id": i, "body": t} for i, t in enumerate(DOCS)]
    (tmp_path / "d.jsonl").write_text("\n".join(json.dumps(r) for r in rows), encoding="utf-8")
    csv_lines = ["id,body"] + [f'{r["id"]},"{r["body"]}"' for r in rows]
    (tmp_path / "d.csv").write_text("\n".join(csv_lines), encoding="utf-8")
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "d.parquet")
    for path, name in (("jsonl", "d.jsonl"), ("json", "d.jsonl"), ("csv", "d.csv"), ("parquet", "d.parquet")):
        p = prepare(f"data.path={path}", f"data.data_files={tmp_path / name}", "data.text_column=body",
                    "tokenizer.kind=byte")
        assert sorted(sum((texts_of(p, s) for s in p.splits), [])) == sorted(DOCS), path
        assert p.info["source_kind"] == "files"


def test_save_to_disk_folder_and_local_dataset_folder(tmp_path):
    import datasets

    dd = datasets.DatasetDict({"train": datasets.Dataset.from_dict({"text": DOCS[:50]}),
                               "validation": datasets.Dataset.from_dict({"text": DOCS[50:]})})
    dd.save_to_disk(str(tmp_path / "saved"))
    p = prepare(f"data.path={tmp_path / 'saved'}", "data.test_fraction=0", "tokenizer.kind=byte")
    assert p.info["source_kind"] == "disk"
    assert texts_of(p, "validation") == DOCS[50:] and texts_of(p, "train") == DOCS[:50]
    assert "test" not in p.splits  # no test split and test_fraction 0: none

    folder = tmp_path / "folder"
    folder.mkdir()
    for split, docs in (("train", DOCS[:40]), ("validation", DOCS[40:50]), ("test", DOCS[50:])):
        (folder / f"{split}.jsonl").write_text("\n".join(json.dumps({"text": t}) for t in docs), encoding="utf-8")
    p = prepare(f"data.path={folder}", "tokenizer.kind=byte")
    assert p.info["source_kind"] == "folder"
    assert [texts_of(p, s) for s in ("train", "validation", "test")] == [DOCS[:40], DOCS[40:50], DOCS[50:]]


def test_local_file_path_infers_the_builder(text_file):
    p = prepare(f"data.path={text_file}", "tokenizer.kind=byte")
    assert p.info["source"].startswith("text files")


def test_builtin_pydoc_is_deterministic_real_text(tmp_path):
    args = ("data.path=builtin:pydoc", "tokenizer.kind=word", "tokenizer.vocab_size=2000")
    p = prepare(*args)
    assert set(p.splits) == {"train", "validation", "test"}
    assert p.splits["train"].n_chars > 200_000 and p.splits["validation"].n_docs > 50
    assert 0 < p.splits["validation"].oov_rate < 0.3  # real English, 2,000 words: some unseen in train
    assert p.floor is None
    # another process, with its own empty cache, trains the same vocabulary and gets the same tokens
    assert digests_in_a_fresh_process(tmp_path / "other-cache", *args) == token_digests(p)


def test_streaming_takes_max_train_tokens_and_carves(text_file, tmp_path):
    args = ("data.path=text", f"data.data_files={text_file}", "data.streaming=true", "data.max_train_tokens=1500",
            "data.validation_fraction=0.2", "data.test_fraction=0.2", "tokenizer.kind=byte")
    p = prepare(*args)
    assert len(p.splits["train"].tokens) == 1500
    assert p.splits["validation"].n_docs > 0 and p.splits["test"].n_docs > 0
    train, val, test = (texts_of(p, s) for s in ("train", "validation", "test"))
    assert not set(val) & set(train) and not set(test) & set(train) and not set(val) & set(test)
    assert len(set(train + val + test)) == len(train + val + test)  # no document twice
    again = prepare(*args)  # the same again, from the cache
    assert again.info["cache"]["hit"] and token_digests(again) == token_digests(p)
    data.clear_cache()
    fresh = prepare(*args)  # and after clearing it
    assert not fresh.info["cache"]["hit"] and token_digests(fresh) == token_digests(p)
    # deterministic for split_seed: the same in another process with an empty cache
    assert digests_in_a_fresh_process(tmp_path / "other-cache", *args) == token_digests(p)


def test_streaming_needs_a_limit():
    with raises(ConfigError, match="max_train_tokens"):
        cfg_for("data.streaming=true")


def test_token_limits_cut_exactly_and_keep_stats_consistent(text_file):
    p = prepare("data.path=text", f"data.data_files={text_file}", "tokenizer.kind=byte",
                "data.max_train_tokens=1000", "data.max_eval_tokens=150")
    train, val = p.splits["train"], p.splits["validation"]
    assert len(train.tokens) == 1000 and len(val.tokens) == 150
    assert val.n_bytes == 150  # byte tokenizer: one token per byte, separators included
    assert train.n_docs == int(np.count_nonzero(np.asarray(train.tokens) == 256)) + (train.tokens[-1] != 256)


def test_train_fraction_is_a_prefix_with_its_own_counts_and_the_same_evaluation(text_file):
    args = ("data.path=text", f"data.data_files={text_file}", "tokenizer.kind=word")
    whole, half = prepare(*args), prepare(*args, "data.train_fraction=0.5")
    n = len(whole.splits["train"].tokens)
    assert len(half.splits["train"].tokens) == round(n / 2)
    assert np.array_equal(half.splits["train"].tokens, whole.splits["train"].tokens[: round(n / 2)])
    assert half.vocab_size == whole.vocab_size  # one tokenizer, trained on the whole split
    want = np.bincount(np.asarray(half.splits["train"].tokens), minlength=half.model_vocab_size)
    assert np.array_equal(half.train_counts, want)  # counted on the prefix (the frequency buckets)
    for split in ("validation", "test"):
        assert np.array_equal(half.splits[split].tokens, whole.splits[split].tokens)
    assert half.splits["train"].n_bytes == pytest.approx(whole.splits["train"].n_bytes / 2, rel=0.01)
    assert half.info["limits"]["train_fraction"] == 0.5 and "train_fraction" not in whole.info["limits"]
    from tiedlm.data import data_identity

    assert data_identity(half) == data_identity(whole)  # the same tokens to compare on
    for bad in ("0", "1.5", "-0.1"):
        with pytest.raises(ConfigError, match="data.train_fraction must be in"):
            load_config(None, [*args, f"data.train_fraction={bad}", "train.max_steps=1"])


def test_splits_too_short_for_the_block_size(tmp_path):
    (tmp_path / "ok.txt").write_text("\n".join(DOCS), encoding="utf-8")
    with raises(DataError, match=r"validation split has \d+ tokens, fewer than model.block_size \+ 1 = 1001"):
        prepare("data.path=text", f"data.data_files={tmp_path / 'ok.txt'}", "tokenizer.kind=byte", block_size=1000)
    with raises(DataError, match=r"raise data.max_eval_tokens"):
        prepare("data.path=text", f"data.data_files={tmp_path / 'ok.txt'}", "tokenizer.kind=byte",
                "data.max_eval_tokens=10", block_size=16)


def test_data_identity_names_the_fingerprint_and_the_tokenizer(text_file):
    p = prepare("data.path=text", f"data.data_files={text_file}", "tokenizer.kind=byte")
    ident = data.data_identity(p)
    assert data.core_identity(ident) == {"fingerprint": p.info["fingerprint"], "tokenizer": p.info["tokenizer"]["key"]}
    # local files: the same two keys by modification time, as runs recorded them before content digests
    assert sorted(ident["by_mtime"]) == ["fingerprint", "tokenizer"] and ident["by_mtime"] != data.core_identity(ident)
    assert data.identity_fits(ident["by_mtime"], p) and data.identity_fits(ident, p)
    assert not data.identity_fits({"fingerprint": "another", "tokenizer": ident["tokenizer"]}, p)
    builtin = prepare("data.path=builtin:shakespeare", "tokenizer.kind=byte")
    assert "by_mtime" not in data.data_identity(builtin)  # nothing on disk of the user's: no older identity


# --------------------------------------------------------------------------------------------
# What `tiedlm data` prints


def test_summarize_shows_splits_and_cache(text_file):
    p = prepare("data.path=text", f"data.data_files={text_file}", "tokenizer.kind=word", "tokenizer.vocab_size=50",
                "tokenizer.pad_to_multiple=64")
    out = data.summarize(p)
    for word in ("train", "validation", "test", "documents", "characters", "tokens", "bytes/token", "OOV",
                 "carved from train", str(data.cache_root()), "padded to 64"):
        assert word in out, word
    assert f"{p.splits['train'].n_docs:,}" in out
    assert "%" in out  # the word tokenizer's OOV rate
    json.dumps(p.info)  # info is JSON-serialisable
    assert "hit" in data.summarize(prepare("data.path=text", f"data.data_files={text_file}", "tokenizer.kind=word",
                                           "tokenizer.vocab_size=50", "tokenizer.pad_to_multiple=64"))


# --------------------------------------------------------------------------------------------
# Real corpora in ../shared/data (optional)

SHAKESPEARE = SHARED_DATA / "tinyshakespeare" / "input.txt"
WIKITEXT = SHARED_DATA / "wikitext-2-small"


def refuse(*args, **kwargs):
    raise AssertionError("the cache should have made this unnecessary")


@pytest.mark.skipif(not SHAKESPEARE.exists(), reason=f"{SHAKESPEARE} is absent (shared data not mounted)")
def test_tiny_shakespeare_bpe_4096_and_a_second_prepare_from_the_cache(monkeypatch):
    """How fast the second prepare is, scripts/bench.py measures; here, that it does no work."""
    args = ("data.path=text", f"data.data_files={SHAKESPEARE}", "tokenizer.kind=bpe", "tokenizer.vocab_size=4096")
    cold = prepare(*args, block_size=256)
    assert cold.vocab_size == 4096 and cold.splits["train"].tokens.dtype == np.uint16
    assert 2.5 < cold.splits["train"].n_bytes / len(cold.splits["train"].tokens) < 4.5
    for name in ("train_tokenizer", "encode_split", "split_documents"):
        monkeypatch.setattr(data, name, refuse)
    warm = prepare(*args, block_size=256)
    assert warm.info["cache"]["hit"] and set(warm.info["timings"]) == {"total_s"}
    for name, s in warm.splits.items():  # the arrays are the cached files, memory-mapped
        assert isinstance(s.tokens, np.memmap)
        assert Path(s.tokens.filename) == Path(warm.info["cache"]["split_folders"][name]) / "tokens.npy"
    assert sum(s.n_docs for s in warm.splits.values()) == 32_777  # the non-empty lines


@pytest.mark.skipif(not WIKITEXT.exists(), reason=f"{WIKITEXT} is absent (shared data not mounted)")
def test_wikitext_small_word_level():
    files = json.dumps({"train": str(WIKITEXT / "valid.txt"), "validation": str(WIKITEXT / "test.txt")})
    p = prepare("data.path=text", f"data.data_files={files}", "tokenizer.kind=word", "tokenizer.vocab_size=10000",
                "data.test_fraction=0")
    assert p.info["splits"] == {"train": "train", "validation": "validation"}
    assert p.splits["validation"].oov_rate > 0.02  # its "<unk>" words plus words unseen in train
