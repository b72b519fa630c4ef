"""tiedlm.data: sources, splits, tokenizers, the token cache and the errors a user meets.

Everything here is offline and CPU-only: the tests write their own small files. Tests on the
real corpora in ../shared/data skip when that folder is absent.
"""

import errno
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from typer.testing import CliRunner

from .conftest import SHARED_DATA
from tiedlm import data
from tiedlm.cli import app
from tiedlm.config import load_config
from tiedlm.errors import ConfigError, DataError

try:
    import resource
except ImportError:  # not on Windows
    resource = None

# Three distinct, easily recognised documents per "paragraph" so that carving can be checked by text.
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


@pytest.fixture
def text_file(tmp_path):
    path = tmp_path / "corpus.txt"
    path.write_text("\n".join(DOCS[:40]) + "\n\n   \n" + "\n".join(DOCS[40:]) + "\n", encoding="utf-8")
    return path


# --------------------------------------------------------------------------------------------
# Sources


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


def test_builtin_pydoc_is_deterministic_real_text():
    p = prepare("data.path=builtin:pydoc", "tokenizer.kind=word", "tokenizer.vocab_size=2000")
    assert set(p.splits) == {"train", "validation", "test"}
    assert p.splits["train"].n_chars > 200_000 and p.splits["validation"].n_docs > 50
    assert 0 < p.splits["validation"].oov_rate < 0.3  # real English, 2,000 words: some unseen in train
    assert p.floor is None


def test_streaming_takes_max_train_tokens_and_carves(text_file):
    p = prepare("data.path=text", f"data.data_files={text_file}", "data.streaming=true",
                "data.max_train_tokens=1500", "data.validation_fraction=0.2", "data.test_fraction=0.2",
                "tokenizer.kind=byte")
    assert len(p.splits["train"].tokens) == 1500
    assert p.splits["validation"].n_docs > 0 and p.splits["test"].n_docs > 0
    seen = [texts_of(p, s) for s in p.splits]
    assert not set(seen[1]) & set(seen[0]) and not set(seen[2]) & set(seen[0])
    # the same again from the cache, and the same after clearing it (deterministic for split_seed)
    again = prepare("data.path=text", f"data.data_files={text_file}", "data.streaming=true",
                    "data.max_train_tokens=1500", "data.validation_fraction=0.2", "data.test_fraction=0.2",
                    "tokenizer.kind=byte")
    assert again.info["cache"]["hit"]
    data.clear_cache()
    fresh = prepare("data.path=text", f"data.data_files={text_file}", "data.streaming=true",
                    "data.max_train_tokens=1500", "data.validation_fraction=0.2", "data.test_fraction=0.2",
                    "tokenizer.kind=byte")
    assert not fresh.info["cache"]["hit"]
    for s in p.splits:
        assert np.array_equal(p.splits[s].tokens, fresh.splits[s].tokens)


# --------------------------------------------------------------------------------------------
# Carving validation/test from train


def test_carving_is_deterministic_disjoint_and_recorded(text_file):
    args = ("data.path=text", f"data.data_files={text_file}", "tokenizer.kind=byte",
            "data.validation_fraction=0.1", "data.test_fraction=0.15")
    p = prepare(*args)
    train, val, test = (set(texts_of(p, s)) for s in ("train", "validation", "test"))
    assert len(val) == 6 and len(test) == 9 and len(train) == 45  # round(fraction * 60 documents)
    assert not (train & val) and not (train & test) and not (val & test)
    assert train | val | test == set(DOCS)
    assert p.info["carving"]["split_seed"] == 0 and p.info["carving"]["validation_fraction"] == 0.1
    assert "carved from train" in p.info["splits"]["validation"]

    data.clear_cache()
    again = prepare(*args)
    assert set(texts_of(again, "validation")) == val  # same seed, same carving (no cache involved)
    other = prepare(*args, "data.split_seed=1")
    assert set(texts_of(other, "validation")) != val


def test_validation_split_aliases_and_missing_splits(tmp_path):
    (tmp_path / "a.txt").write_text("\n".join(DOCS[:30]), encoding="utf-8")
    (tmp_path / "b.txt").write_text("\n".join(DOCS[30:]), encoding="utf-8")
    files = json.dumps({"train": str(tmp_path / "a.txt"), "valid": str(tmp_path / "b.txt")})
    p = prepare("data.path=text", f"data.data_files={files}", "tokenizer.kind=byte", "data.test_fraction=0")
    assert p.info["splits"]["validation"] == "valid" and texts_of(p, "validation") == DOCS[30:]
    with pytest.raises(DataError, match=r"no split 'dev'.*it has: train, valid"):
        prepare("data.path=text", f"data.data_files={files}", "data.validation_split=dev")
    with pytest.raises(DataError, match=r"no split 'training'.*data.train_split"):
        prepare("data.path=text", f"data.data_files={files}", "data.train_split=training")
    with pytest.raises(DataError, match="validation_fraction is 0"):
        prepare("data.path=text", f"data.data_files={tmp_path / 'a.txt'}", "data.validation_fraction=0")


# --------------------------------------------------------------------------------------------
# Tokenizers

SAMPLE = "Hello, wörld! Ünïcode ✓ and  double  spaces,\ttabs\nand a new line. 123 + 456 = 579?"


@pytest.mark.parametrize("kind", ["byte", "char", "bpe", "word"])
def test_tokenizers_round_trip_and_save(tmp_path, kind):
    path = tmp_path / "t.txt"
    path.write_text("\n".join([SAMPLE.replace("\n", " ")] * 5 + DOCS), encoding="utf-8")
    p = prepare("data.path=text", f"data.data_files={path}", f"tokenizer.kind={kind}", "tokenizer.vocab_size=300")
    tok = p.tokenizer
    for text in DOCS[:5] + [SAMPLE.replace("\n", " ")]:
        ids = tok.encode(text)
        assert all(0 <= i < tok.vocab_size for i in ids) and tok.eot_id not in ids
        if kind == "word":  # up to <unk>, with whitespace normalised
            words = [w if tok.encode(w)[0] != tok.unk_id else "<unk>" for w in text.split()]
            assert tok.decode(ids) == " ".join(words)
        else:
            assert tok.decode(ids) == text
    assert p.vocab_size == tok.vocab_size <= 300
    saved = tmp_path / "saved"
    saved.mkdir()
    tok.save(saved)
    assert all(f.name in ("tokenizer.json", "tiedlm_tokenizer.json") for f in saved.iterdir())
    back = data.load_tokenizer(saved)
    assert (back.kind, back.vocab_size, back.eot_id, back.unk_id) == (tok.kind, tok.vocab_size, tok.eot_id, tok.unk_id)
    assert back.encode(SAMPLE) == tok.encode(SAMPLE)


def test_word_tokenizer_vocabulary_and_oov(tmp_path):
    path = tmp_path / "w.txt"
    path.write_text("\n".join(["a a a a b b b c c d <unk>"] * 30 + ["zzz yyy"] * 3), encoding="utf-8")
    p = prepare("data.path=text", f"data.data_files={path}", "tokenizer.kind=word", "tokenizer.vocab_size=5",
                "data.validation_fraction=0.1", "data.test_fraction=0.0")
    tok = p.tokenizer
    assert tok.vocab_size == 5 and tok.unk_id == 0 and tok.eot_id == 1  # <unk>, <eot>, a, b, c
    assert tok.encode("a b c d <unk> zzz") == [2, 3, 4, 0, 0, 0]
    train = p.splits["train"]
    n_words = train.n_words - train.n_docs  # the separators count as words too (PTB <eos>)
    unk = int(np.count_nonzero(np.asarray(train.tokens) == tok.unk_id))
    assert train.oov_rate == pytest.approx(unk / n_words)


def test_tokenizer_is_trained_on_train_only(tmp_path):
    (tmp_path / "train.txt").write_text("\n".join(["alpha beta"] * 20), encoding="utf-8")
    (tmp_path / "valid.txt").write_text("\n".join(["gamma delta"] * 20), encoding="utf-8")
    files = json.dumps({"train": str(tmp_path / "train.txt"), "validation": str(tmp_path / "valid.txt")})
    p = prepare("data.path=text", f"data.data_files={files}", "tokenizer.kind=word", "data.test_fraction=0")
    assert p.vocab_size == 4  # <unk> <eot> alpha beta
    assert p.splits["validation"].oov_rate == 1.0


def test_bpe_vocab_is_the_real_size_padded_for_the_model(text_file):
    p = prepare("data.path=text", f"data.data_files={text_file}", "tokenizer.kind=bpe",
                "tokenizer.vocab_size=100000", "tokenizer.pad_to_multiple=64")
    assert 257 < p.vocab_size < 100000  # a small corpus runs out of merges
    assert p.model_vocab_size % 64 == 0 and 0 <= p.model_vocab_size - p.vocab_size < 64
    assert p.train_counts.shape == (p.model_vocab_size,) and p.train_counts.dtype == np.int64
    assert p.train_counts.sum() == len(p.splits["train"].tokens)
    assert p.train_counts[p.tokenizer.eot_id] == p.splits["train"].n_docs
    assert p.info["tokenizer"]["padding"] == p.model_vocab_size - p.vocab_size


def _pretrained_file(tmp_path, specials=("<|endoftext|>",)):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=list(specials),
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(DOCS, trainer)
    path = tmp_path / "tok.json"
    tok.save(str(path))
    return path


def test_pretrained_tokenizer_and_its_errors(tmp_path, text_file):
    path = _pretrained_file(tmp_path, specials=("<s>", "</s>"))
    p = prepare("data.path=text", f"data.data_files={text_file}", "tokenizer.kind=pretrained", f"tokenizer.path={path}")
    tok = p.tokenizer
    assert tok.kind == "pretrained" and tok.eot_id == 1  # found "</s>"
    assert tok.decode(tok.encode(DOCS[3])) == DOCS[3]
    assert texts_of_pretrained(p) == sorted(DOCS)

    with pytest.raises(DataError, match=r"tokenizer.path .*missing.json does not exist"):
        prepare("data.path=builtin:pydoc", "tokenizer.kind=pretrained", f"tokenizer.path={tmp_path / 'missing.json'}")
    bad = tmp_path / "bad.json"
    bad.write_text("{not json", encoding="utf-8")
    with pytest.raises(DataError, match="cannot read tokenizer.path"):
        prepare("data.path=builtin:pydoc", "tokenizer.kind=pretrained", f"tokenizer.path={bad}")
    (tmp_path / "other").mkdir()
    no_eot = _pretrained_file(tmp_path / "other", specials=("<pad>",))
    with pytest.raises(DataError, match="no end-of-text token.*tokenizer.eot_token"):
        prepare("data.path=builtin:pydoc", "tokenizer.kind=pretrained", f"tokenizer.path={no_eot}")
    p = prepare("data.path=text", f"data.data_files={text_file}", "tokenizer.kind=pretrained",
                f"tokenizer.path={no_eot}", "tokenizer.eot_token=<pad>")
    assert p.tokenizer.eot_id == 0


def texts_of_pretrained(p):
    eot = p.tokenizer.decode([p.tokenizer.eot_id])
    docs = []
    for s in p.splits.values():
        docs += p.tokenizer.decode(np.asarray(s.tokens)).split(eot)[:-1]
    return sorted(docs)


# --------------------------------------------------------------------------------------------
# Token limits


def test_token_limits_cut_exactly_and_keep_stats_consistent(text_file):
    p = prepare("data.path=text", f"data.data_files={text_file}", "tokenizer.kind=byte",
                "data.max_train_tokens=1000", "data.max_eval_tokens=150")
    train, val = p.splits["train"], p.splits["validation"]
    assert len(train.tokens) == 1000 and len(val.tokens) == 150
    assert val.n_bytes == 150  # byte tokenizer: one token per byte, separators included
    assert train.n_docs == int(np.count_nonzero(np.asarray(train.tokens) == 256)) + (train.tokens[-1] != 256)


# --------------------------------------------------------------------------------------------
# The token cache


def test_second_prepare_is_a_cache_hit(text_file, monkeypatch):
    args = ("data.path=text", f"data.data_files={text_file}", "tokenizer.kind=bpe", "tokenizer.vocab_size=300")
    first = prepare(*args)
    assert not first.info["cache"]["hit"]

    def boom(*a, **k):
        raise AssertionError("the cache should have made this unnecessary")

    monkeypatch.setattr(data, "train_tokenizer", boom)
    monkeypatch.setattr(data, "encode_split", boom)
    monkeypatch.setattr(data, "_load_raw", boom)  # not even `datasets` is needed
    second = prepare(*args)
    assert second.info["cache"]["hit"] and second.info["cache"]["tokenizer_hit"]
    for s in first.splits:
        assert np.array_equal(first.splits[s].tokens, second.splits[s].tokens)
        assert dataclass_stats(first.splits[s]) == dataclass_stats(second.splits[s])
    assert np.array_equal(first.train_counts, second.train_counts)
    assert second.tokenizer.encode(DOCS[0]) == first.tokenizer.encode(DOCS[0])
    assert second.info["fingerprint"] == first.info["fingerprint"]


def dataclass_stats(s):
    return (s.n_docs, s.n_chars, s.n_bytes, s.n_words, s.oov_rate)


def test_cache_is_invalidated_by_the_file_and_the_tokenizer(text_file, monkeypatch):
    args = ["data.path=text", f"data.data_files={text_file}", "tokenizer.kind=char", "tokenizer.vocab_size=300"]
    prepare(*args)
    trained = []
    real = data.train_tokenizer
    monkeypatch.setattr(data, "train_tokenizer", lambda *a, **k: trained.append(1) or real(*a, **k))

    p = prepare(*args[:-1], "tokenizer.vocab_size=20")  # the tokenizer changed
    assert trained == [1] and p.vocab_size == 20
    with open(text_file, "a", encoding="utf-8") as f:
        f.write("one more document\n")
    p = prepare(*args)  # the file changed
    assert trained == [1, 1] and not p.info["cache"]["hit"]
    assert sum(s.n_docs for s in p.splits.values()) == len(DOCS) + 1
    p = prepare(*args, "data.max_eval_tokens=200")  # only the eval splits change: no new tokenizer
    assert trained == [1, 1] and p.info["cache"]["tokenizer_hit"] and len(p.splits["validation"].tokens) == 200


def test_cache_list_and_clear(text_file):
    assert data.cache_entries() == [] and data.clear_cache().freed_bytes == 0
    p = prepare("data.path=text", f"data.data_files={text_file}", "tokenizer.kind=byte")
    entries = data.cache_entries()
    tokens = [e for e in entries if e["kind"] == "tokens"]
    assert sorted(e["split"] for e in tokens) == ["test", "train", "validation"]
    assert sum(e["tokens"] for e in tokens) == sum(len(s.tokens) for s in p.splits.values())
    assert all(e["bytes"] > 0 and os.path.isdir(e["path"]) and "text files" in e["source"] for e in tokens)
    assert any(e["kind"] == "tokenizer" for e in entries)
    assert str(data.cache_root()) in p.info["cache"]["split_folders"]["train"]
    cleared = data.clear_cache()
    assert cleared.freed_bytes >= sum(e["bytes"] for e in entries) and data.cache_entries() == []
    assert cleared.left_alone == [] and not data.cache_root().exists() or not any(data.cache_root().iterdir())


def test_cache_root_follows_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("TIEDLM_CACHE", str(tmp_path / "c"))
    assert data.cache_root() == tmp_path / "c"
    monkeypatch.delenv("TIEDLM_CACHE")
    assert data.cache_root() == Path("~/.cache/tiedlm").expanduser()


def test_concurrent_prepares_do_not_corrupt_the_cache(text_file):
    cfg = cfg_for("data.path=text", f"data.data_files={text_file}", "tokenizer.kind=char")
    results, errors = [], []

    def work():
        try:
            results.append(data.prepare_data(cfg, progress=False))
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=work) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and len(results) == 3
    for r in results[1:]:
        assert np.array_equal(r.splits["train"].tokens, results[0].splits["train"].tokens)
    assert not [p for p in (data.cache_root() / "tokens").iterdir() if p.name.startswith(".tmp")]
    assert len([e for e in data.cache_entries() if e["kind"] == "tokens"]) == 3


def test_a_broken_cache_entry_is_rebuilt(text_file):
    args = ("data.path=text", f"data.data_files={text_file}", "tokenizer.kind=byte")
    p = prepare(*args)
    folder = Path(p.info["cache"]["split_folders"]["train"])
    n = len(p.splits["train"].tokens)
    del p
    (folder / "tokens.npy").write_bytes(b"garbage")
    again = prepare(*args)
    assert len(again.splits["train"].tokens) == n and not again.info["cache"]["hit"]


# --------------------------------------------------------------------------------------------
# Errors: one line, what is wrong and what to do


def test_hub_unreachable_offline_says_what_to_do(monkeypatch):
    import datasets
    import huggingface_hub

    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)  # in case datasets was imported earlier
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    with pytest.raises(DataError) as err:
        prepare("data.path=wikitext", "data.name=wikitext-2-raw-v1")
    msg = str(err.value)
    assert "wikitext" in msg and "HF_DATASETS_OFFLINE" in msg and "builtin:synthetic" in msg
    assert "data.path: text" in msg and "\n" not in msg


def test_config_name_not_found(tmp_path):
    (tmp_path / "train.txt").write_text("\n".join(DOCS), encoding="utf-8")
    with pytest.raises(DataError, match=r"data.name 'nope' is not a config of .*; it has: 'default'"):
        prepare(f"data.path={tmp_path}", "data.name=nope")


def test_missing_paths_and_files(tmp_path):
    with pytest.raises(DataError, match=r"data.path \./no/such/folder does not exist"):
        prepare("data.path=./no/such/folder")
    with pytest.raises(DataError, match=r"matches no file"):
        prepare("data.path=text", f"data.data_files={tmp_path / '*.nothing'}")
    with pytest.raises(DataError, match=r"needs data.data_files"):
        prepare("data.path=text")
    with pytest.raises(DataError, match=r"unknown built-in corpus builtin:nope — use builtin:synthetic or builtin:"):
        prepare("data.path=builtin:nope")
    (tmp_path / "empty").mkdir()
    with pytest.raises(DataError, match=r"is an empty folder — add data files"):
        prepare(f"data.path={tmp_path / 'empty'}")


def test_text_column_missing_lists_the_columns(tmp_path):
    (tmp_path / "d.jsonl").write_text("\n".join(json.dumps({"body": t, "n": 1}) for t in DOCS), encoding="utf-8")
    with pytest.raises(DataError, match=r"no column 'text'.*its columns are: body, n — set data.text_column"):
        prepare("data.path=json", f"data.data_files={tmp_path / 'd.jsonl'}")
    with pytest.raises(DataError, match=r"column 'n' .* holds int64 values, not text"):
        prepare("data.path=json", f"data.data_files={tmp_path / 'd.jsonl'}", "data.text_column=n")


def test_empty_and_too_short_splits(tmp_path):
    (tmp_path / "blank.txt").write_text("\n \n\t\n", encoding="utf-8")
    (tmp_path / "ok.txt").write_text("\n".join(DOCS), encoding="utf-8")
    files = json.dumps({"train": str(tmp_path / "ok.txt"), "validation": str(tmp_path / "blank.txt")})
    with pytest.raises(ConfigError, match=r"data file .*blank.txt is empty — give a file with text"):
        prepare("data.path=text", f"data.data_files={files}")
    # records whose text is blank: the file is not empty, the split is
    (tmp_path / "blank.jsonl").write_text('{"text": "  "}\n{"text": ""}\n', encoding="utf-8")
    (tmp_path / "ok.jsonl").write_text("\n".join(json.dumps({"text": t}) for t in DOCS), encoding="utf-8")
    files = json.dumps({"train": str(tmp_path / "ok.jsonl"), "validation": str(tmp_path / "blank.jsonl")})
    with pytest.raises(DataError, match=r"the validation split .* has no non-empty documents"):
        prepare("data.path=json", f"data.data_files={files}")
    with pytest.raises(DataError, match=r"validation split has \d+ tokens, fewer than model.block_size \+ 1 = 1001"):
        prepare("data.path=text", f"data.data_files={tmp_path / 'ok.txt'}", "tokenizer.kind=byte", block_size=1000)
    with pytest.raises(DataError, match=r"raise data.max_eval_tokens"):
        prepare("data.path=text", f"data.data_files={tmp_path / 'ok.txt'}", "tokenizer.kind=byte",
                "data.max_eval_tokens=10", block_size=16)
    (tmp_path / "two.txt").write_text("one\ntwo\n", encoding="utf-8")
    with pytest.raises(DataError, match=r"2 non-empty documents, too few to carve"):
        prepare("data.path=text", f"data.data_files={tmp_path / 'two.txt'}")


def test_not_utf8_names_the_file(tmp_path):
    (tmp_path / "good.txt").write_text("\n".join(DOCS), encoding="utf-8")
    (tmp_path / "latin.txt").write_bytes("\n".join(DOCS[:3]).encode("utf-8") + "\ncaf\xe9\n".encode("latin-1"))
    with pytest.raises(DataError, match=r"latin.txt is not UTF-8 text \(byte 0xe9 at offset \d+\) — convert it"):
        prepare("data.path=text", f"data.data_files={tmp_path / '*.txt'}")


def test_vocab_size_too_small_for_the_kind():
    with pytest.raises(ConfigError, match=r"too small for tokenizer.kind=byte: it needs at least 257"):
        cfg_for("tokenizer.kind=byte", "tokenizer.vocab_size=256")
    with pytest.raises(ConfigError, match=r"tokenizer.kind=bpe: it needs at least 257"):
        cfg_for("tokenizer.kind=bpe", "tokenizer.vocab_size=100")
    cfg_for("tokenizer.kind=word", "tokenizer.vocab_size=3")


def test_streaming_needs_a_limit():
    with pytest.raises(ConfigError, match="max_train_tokens"):
        cfg_for("data.streaming=true")


# --------------------------------------------------------------------------------------------
# Through the command line: `cache clear`, a full disk, empty data files


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
    lines = [line for line in r.stderr.strip().splitlines() if "examples/s]" not in line]  # datasets' progress
    assert r.exit_code == code, r.output
    assert lines == [f"tiedlm: error: {message}"], r.stderr
    assert "Traceback" not in r.output and isinstance(r.exception, SystemExit)


def dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def test_cache_clear_leaves_alone_what_tiedlm_did_not_make(text_file):
    root = data.cache_root()
    (root / "datasets").mkdir(parents=True)
    (root / "datasets" / "precious.csv").write_text("d\n")
    (root / "notes.txt").write_text("mine\n")
    prepare("data.path=text", f"data.data_files={text_file}", "tokenizer.kind=byte")
    (root / "tokens" / "mine").mkdir()
    (root / "tokens" / "mine" / "manifest.json").write_text("{}")  # a manifest, but not a tiedlm one
    tokens = root / "tokens"
    dead = tokens / f".tmp-{'0' * 20}-{data._HOST}-{dead_pid()}-0000dead"  # left by a killed process
    live = tokens / f".tmp-{'1' * 20}-{data._HOST}-{os.getpid()}-0000beef"  # a process still writing it
    old = tokens / f".tmp-{'2' * 20}-{os.getpid()}-0000001d"  # an older name, without the host
    for folder in (dead, live, old):
        folder.mkdir()
        (folder / "tokens.npy").write_bytes(b"x" * 100)
    week_ago = time.time() - 7 * 86400
    for f in (old / "tokens.npy", old):
        os.utime(f, (week_ago, week_ago))
    memo_tmp = root / f".hub-revisions.json.{data._HOST}-{dead_pid()}-0000dead.tmp"  # see _replace_atomically
    memo_tmp.write_text("{")

    r = cli("cache", "clear")
    assert r.exit_code == 0, r.output
    lines = r.stdout.splitlines()
    assert lines[0].startswith(f"cleared {root}: ") and "MiB freed" in lines[0]
    assert lines[1:] == [f"left alone: {root / 'datasets' / 'precious.csv'} (not made by tiedlm)",
                         f"left alone: {root / 'notes.txt'} (not made by tiedlm)",
                         f"left alone: {live} (being written by process {os.getpid()} on this machine)",
                         f"left alone: {tokens / 'mine'} (not made by tiedlm)"]
    assert (root / "datasets" / "precious.csv").read_text() == "d\n" and (root / "notes.txt").exists()
    assert sorted(p.name for p in (root / "datasets").iterdir()) == ["precious.csv"]  # the arrow copy is gone
    assert sorted(p.name for p in tokens.iterdir()) == sorted([live.name, "mine"])
    assert not (root / "tokenizers").exists() and not memo_tmp.exists() and data.cache_entries() == []


def test_cache_clear_removes_only_what_tiedlm_made_in_the_datasets_folder(text_file):
    root = data.cache_root()
    prepare("data.path=text", f"data.data_files={text_file}", "tokenizer.kind=byte")
    assert (root / "datasets").is_dir()  # made by tiedlm's load; then someone puts files in it
    yours = [root / "datasets" / f"yours{i}.txt" for i in range(7)]
    for f in yours:
        f.write_text("keep me")
    r = cli("cache", "clear")
    assert r.exit_code == 0, r.output
    assert sorted(p for p in (root / "datasets").iterdir() if p.name != ".tiedlm-made") == yours
    assert r.stdout.splitlines()[1:] == [f"left alone: {f} (not made by tiedlm)" for f in yours[:5]] + [
        "left alone: 2 more, not made by tiedlm or in use"]
    for f in yours:
        f.unlink()
    r = cli("cache", "clear")  # the folder tiedlm made is removed once nothing else is in it
    assert r.exit_code == 0 and r.stdout.splitlines()[1:] == [] and not (root / "datasets").exists()


@pytest.mark.skipif(resource is None or not hasattr(resource, "RLIMIT_FSIZE") or not hasattr(signal, "SIGXFSZ"),
                    reason="needs resource.RLIMIT_FSIZE and SIGXFSZ (POSIX)")
@pytest.mark.parametrize("stage, kind", [("datasets", "byte"), ("tokenizers", "bpe"), ("tokens", "byte")])
def test_a_full_disk_leaves_no_temporary_folder_and_says_what_to_do(tmp_path, stage, kind):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n".join(DOCS * 3), encoding="utf-8")  # about 15 KB: every file it makes is > 4 KB
    sets = ["data.path=text", f"data.data_files={corpus}", f"tokenizer.kind={kind}", "tokenizer.vocab_size=300"]
    if stage != "datasets":  # `datasets` has made its arrow copy: the first big write is tiedlm's own
        prepare(*sets[:2], "tokenizer.kind=char")
    root = data.cache_root()
    published = sorted(root.glob("tokens/*/manifest.json"))

    def small_files():  # in the child: a write past 4 KB fails with EFBIG, as on a full disk
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # (instead of killing it); stays ignored across exec
        resource.setrlimit(resource.RLIMIT_FSIZE, (4096, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))

    r = subprocess.run([sys.executable, "-m", "tiedlm", *data_command(tmp_path, *sets)],
                       preexec_fn=small_files, capture_output=True, text=True, timeout=300)
    errors = [line for line in r.stderr.splitlines() if line.startswith("tiedlm")]
    assert r.returncode == 1, r.stderr
    assert errors == [f"tiedlm: error: File too large while writing the token cache ({root / stage}) — free some "
                      "disk space (or set TIEDLM_CACHE to a disk with room, or raise the file-size limit: "
                      "ulimit -f), then run the same command again"], r.stderr
    assert r.stderr.strip().splitlines()[-1] == errors[0] and "Traceback" not in r.stderr
    assert not list(root.rglob(".tmp-*")) and not list(root.rglob("*.incomplete"))
    assert sorted(root.glob("tokens/*/manifest.json")) == published  # (the byte tokenizer's entry fits in 4 KB)
    # the same command with room succeeds, and what the failed one left is tiedlm's to clear
    prepare(*sets)
    assert data.clear_cache().left_alone == []


def _wrapped(code):
    """What torch.save or safetensors raise: their own error, with the OSError as its cause."""
    try:
        raise OSError(code, os.strerror(code))
    except OSError as cause:
        exc = RuntimeError("unexpected pos 128 vs 64")
        exc.__cause__ = cause
        return exc


@pytest.mark.parametrize("exc, code", [
    pytest.param(OSError(errno.ENOSPC, os.strerror(errno.ENOSPC)), errno.ENOSPC, id="OSError"),
    pytest.param(_wrapped(errno.EDQUOT), errno.EDQUOT, id="wrapped"),
    pytest.param(Exception(f"{os.strerror(errno.ENOSPC)} (os error {errno.ENOSPC})"), errno.ENOSPC,
                 id="rust"),  # as the Rust tokenizer says it
])
def test_a_write_failure_in_the_token_cache_is_one_line(tmp_path, monkeypatch, exc, code):
    def refuse(path, array):  # half a file, then the failure
        path.write_bytes(b"\x93NUMPY half")
        raise exc

    monkeypatch.setattr(data, "_save_npy", refuse)
    r = cli_data(tmp_path, "data.path=builtin:synthetic", "tokenizer.kind=byte")
    root = data.cache_root()
    assert_one_line_error(r, f"{os.strerror(code)} while writing the token cache ({root / 'tokens'}) — free some "
                             "disk space (or set TIEDLM_CACHE to a disk with room), then run the same command again", 1)
    assert not list(root.rglob(".tmp-*")) and not list((root / "tokens").iterdir())


def test_a_cache_folder_that_cannot_be_written_names_the_path(tmp_path, monkeypatch):
    not_a_folder = tmp_path / "cache"
    not_a_folder.write_text("a file")
    monkeypatch.setenv("TIEDLM_CACHE", str(not_a_folder))
    r = cli_data(tmp_path, "data.path=builtin:synthetic", "tokenizer.kind=byte")
    assert_one_line_error(r, f"cannot write the token cache ({not_a_folder / 'tokenizers'}): "
                             f"{os.strerror(errno.ENOTDIR)} — check the path and its permissions (or set "
                             "TIEDLM_CACHE to a folder you can write), then run the same command again", 1)


def test_write_json_removes_its_temporary_file_when_the_write_fails(tmp_path, monkeypatch):
    target = tmp_path / "manifest.json"
    target.write_text('{"old": 1}')

    def refuse(src, dst):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    with monkeypatch.context() as m:
        m.setattr(data.os, "replace", refuse)
        with pytest.raises(OSError):
            data._write_json(target, {"new": 2})
    assert os.listdir(tmp_path) == ["manifest.json"] and json.loads(target.read_text()) == {"old": 1}


def test_a_hub_memo_that_cannot_be_written_leaves_no_temporary_file(monkeypatch):
    import huggingface_hub

    class Api:
        def dataset_info(self, path, revision=None, timeout=None):
            return type("Info", (), {"sha": "c" * 40})()

    def refuse(src, dst):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.delenv("HF_DATASETS_OFFLINE")
    monkeypatch.delenv("HF_HUB_OFFLINE")
    monkeypatch.setattr(huggingface_hub, "HfApi", Api)
    with monkeypatch.context() as m:
        m.setattr(data.os, "replace", refuse)
        assert data._hub_revision("someone/corpus", None) == "c" * 40  # the memo only helps offline
    assert os.listdir(data.cache_root()) == []


@pytest.mark.parametrize("files, content, overrides, message", [
    (["empty.txt"], "", ["data.path=text", "data.data_files=empty.txt"],
     "data file empty.txt is empty — give a file with text, or check data.data_files"),
    (["blank.txt"], "\n   \n\t\n", ["data.path=text", "data.data_files=blank.txt"],
     "data file blank.txt is empty — give a file with text, or check data.data_files"),
    (["empty.txt"], "", ["data.path=./empty.txt"],
     "data file empty.txt is empty — give a file with text, or check data.path"),
    (["a.csv", "b.csv"], "", ["data.path=csv", "data.data_files=[good.csv, a.csv, b.csv]"],
     "data files a.csv, b.csv are empty — give files with text, or check data.data_files"),
    (["blank.jsonl"], "\n\n", ["data.path=json", "data.data_files=[blank.jsonl, good.jsonl]"],
     "data file blank.jsonl is empty — give a file with text, or check data.data_files"),
    # a local dataset folder: `datasets` finds the files, and its own error is recognised
    (["folder/train.txt"], "", ["data.path=./folder"],
     "data file folder/train.txt is empty — give a file with text, or check data.path"),
])
def test_an_empty_data_file_is_named(tmp_path, monkeypatch, files, content, overrides, message):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "good.csv").write_text("text\n" + "\n".join(DOCS), encoding="utf-8")
    (tmp_path / "good.jsonl").write_text("\n".join(json.dumps({"text": t}) for t in DOCS), encoding="utf-8")
    (tmp_path / "folder").mkdir()
    for name in files:
        (tmp_path / name).write_text(content, encoding="utf-8")
    assert_one_line_error(cli_data(tmp_path, *overrides, "tokenizer.kind=byte"), message, 2)


def test_an_empty_text_file_among_others_adds_no_documents(tmp_path, text_file):
    (tmp_path / "empty.txt").write_text("")
    p = prepare("data.path=text", f"data.data_files={json.dumps([str(text_file), str(tmp_path / 'empty.txt')])}",
                "tokenizer.kind=byte")
    assert sum(s.n_docs for s in p.splits.values()) == len(DOCS)


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


@pytest.mark.skipif(not SHAKESPEARE.exists(), reason=f"{SHAKESPEARE} is absent (shared data not mounted)")
def test_tiny_shakespeare_bpe_4096_and_fast_second_prepare():
    args = ("data.path=text", f"data.data_files={SHAKESPEARE}", "tokenizer.kind=bpe", "tokenizer.vocab_size=4096")
    cold = prepare(*args, block_size=256)
    assert cold.vocab_size == 4096 and cold.splits["train"].tokens.dtype == np.uint16
    assert 2.5 < cold.splits["train"].n_bytes / len(cold.splits["train"].tokens) < 4.5
    t = time.perf_counter()
    warm = prepare(*args, block_size=256)
    assert time.perf_counter() - t < 0.5 and warm.info["cache"]["hit"]
    assert sum(s.n_docs for s in warm.splits.values()) == 32_777  # the non-empty lines


@pytest.mark.skipif(not WIKITEXT.exists(), reason=f"{WIKITEXT} is absent (shared data not mounted)")
def test_wikitext_small_word_level():
    files = json.dumps({"train": str(WIKITEXT / "valid.txt"), "validation": str(WIKITEXT / "test.txt")})
    p = prepare("data.path=text", f"data.data_files={files}", "tokenizer.kind=word", "tokenizer.vocab_size=10000",
                "data.test_fraction=0")
    assert p.info["splits"] == {"train": "train", "validation": "validation"}
    assert p.splits["validation"].oov_rate > 0.02  # its "<unk>" words plus words unseen in train
