"""tiedlm.data: sources, splits, tokenizers, the token cache and the errors a user meets.

Everything here is offline and CPU-only: the tests write their own small files. Tests on the
real corpora in ../shared/data skip when that folder is absent.
"""

import json
import os
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from .conftest import SHARED_DATA
from tiedlm import data
from tiedlm.config import load_config
from tiedlm.errors import ConfigError, DataError

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
    assert data.cache_entries() == [] and data.clear_cache() == 0
    p = prepare("data.path=text", f"data.data_files={text_file}", "tokenizer.kind=byte")
    entries = data.cache_entries()
    tokens = [e for e in entries if e["kind"] == "tokens"]
    assert sorted(e["split"] for e in tokens) == ["test", "train", "validation"]
    assert sum(e["tokens"] for e in tokens) == sum(len(s.tokens) for s in p.splits.values())
    assert all(e["bytes"] > 0 and os.path.isdir(e["path"]) and "text files" in e["source"] for e in tokens)
    assert any(e["kind"] == "tokenizer" for e in entries)
    assert str(data.cache_root()) in p.info["cache"]["split_folders"]["train"]
    freed = data.clear_cache()
    assert freed >= sum(e["bytes"] for e in entries) and data.cache_entries() == []


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
    with pytest.raises(DataError, match=r"the validation split .* has no non-empty documents"):
        prepare("data.path=text", f"data.data_files={files}")
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
