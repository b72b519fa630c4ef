"""tiedlm.data.documents: mapping splits by name, carving validation/test from train, the text
column, and splits without documents."""

import json

from tiedlm.errors import ConfigError, DataError

from .test_data import (
    DOCS,
    digests_in_a_fresh_process,
    prepare,
    raises,
    texts_of,
    token_digests,
    write_corpus,
)


def test_carving_is_deterministic_disjoint_and_recorded(tmp_path):
    text_file = write_corpus(tmp_path)
    args = ("data.path=text", f"data.data_files={text_file}", "tokenizer.kind=byte",
            "data.validation_fraction=0.1", "data.test_fraction=0.15")
    p = prepare(*args)
    train, val, test = (texts_of(p, s) for s in ("train", "validation", "test"))
    assert (len(val), len(test), len(train)) == (6, 9, 45)  # round(fraction * 60 documents)
    # every document in exactly one split: none shared, none twice, none lost
    assert sorted(train + val + test) == sorted(DOCS)
    assert not set(train) & set(val) and not set(train) & set(test) and not set(val) & set(test)
    assert p.info["carving"]["split_seed"] == 0 and p.info["carving"]["validation_fraction"] == 0.1
    assert "carved from train" in p.info["splits"]["validation"]

    # the same carving in another process, with its own empty cache
    assert digests_in_a_fresh_process(tmp_path / "other-cache", *args) == token_digests(p)
    other = prepare(*args, "data.split_seed=1")
    assert set(texts_of(other, "validation")) != set(val)


def test_validation_split_aliases_and_missing_splits(tmp_path):
    (tmp_path / "a.txt").write_text("\n".join(DOCS[:30]), encoding="utf-8")
    (tmp_path / "b.txt").write_text("\n".join(DOCS[30:]), encoding="utf-8")
    files = json.dumps({"train": str(tmp_path / "a.txt"), "valid": str(tmp_path / "b.txt")})
    p = prepare("data.path=text", f"data.data_files={files}", "tokenizer.kind=byte", "data.test_fraction=0")
    assert p.info["splits"]["validation"] == "valid" and texts_of(p, "validation") == DOCS[30:]
    with raises(ConfigError, match=r"no split 'dev'.*it has: train, valid"):
        prepare("data.path=text", f"data.data_files={files}", "data.validation_split=dev")
    with raises(ConfigError, match=r"no split 'training'.*data.train_split"):
        prepare("data.path=text", f"data.data_files={files}", "data.train_split=training")
    with raises(ConfigError, match="validation_fraction is 0"):
        prepare("data.path=text", f"data.data_files={tmp_path / 'a.txt'}", "data.validation_fraction=0")


def test_text_column_missing_lists_the_columns(tmp_path):
    (tmp_path / "d.jsonl").write_text("\n".join(json.dumps({"body": t, "n": 1}) for t in DOCS), encoding="utf-8")
    with raises(ConfigError, match=r"no column 'text'.*its columns are: body, n — set data.text_column"):
        prepare("data.path=json", f"data.data_files={tmp_path / 'd.jsonl'}")
    with raises(ConfigError, match=r"column 'n' .* holds int64 values, not text"):
        prepare("data.path=json", f"data.data_files={tmp_path / 'd.jsonl'}", "data.text_column=n")


def test_a_streamed_text_column_is_checked_as_it_is_read(tmp_path):
    (tmp_path / "d.jsonl").write_text("\n".join(json.dumps({"body": t, "n": 1}) for t in DOCS), encoding="utf-8")
    stream = ("data.path=json", f"data.data_files={tmp_path / 'd.jsonl'}", "data.streaming=true",
              "data.max_train_tokens=500", "tokenizer.kind=byte")
    with raises(ConfigError, match=r"no column 'text' in its train split; its columns are: body, n"):
        prepare(*stream)
    with raises(ConfigError, match=r"column 'n' .* holds int values, not text"):
        prepare(*stream, "data.text_column=n")


def test_empty_splits(tmp_path):
    (tmp_path / "blank.txt").write_text("\n \n\t\n", encoding="utf-8")
    (tmp_path / "ok.txt").write_text("\n".join(DOCS), encoding="utf-8")
    files = json.dumps({"train": str(tmp_path / "ok.txt"), "validation": str(tmp_path / "blank.txt")})
    with raises(ConfigError, match=r"data file .*blank.txt is empty — give a file with text"):
        prepare("data.path=text", f"data.data_files={files}")
    # records whose text is blank: the file is not empty, the split is
    (tmp_path / "blank.jsonl").write_text('{"text": "  "}\n{"text": ""}\n', encoding="utf-8")
    (tmp_path / "ok.jsonl").write_text("\n".join(json.dumps({"text": t}) for t in DOCS), encoding="utf-8")
    files = json.dumps({"train": str(tmp_path / "ok.jsonl"), "validation": str(tmp_path / "blank.jsonl")})
    with raises(DataError, match=r"the validation split .* has no non-empty documents"):
        prepare("data.path=json", f"data.data_files={files}")
    (tmp_path / "two.txt").write_text("one\ntwo\n", encoding="utf-8")
    with raises(DataError, match=r"2 non-empty documents, too few to carve"):
        prepare("data.path=text", f"data.data_files={tmp_path / 'two.txt'}")
