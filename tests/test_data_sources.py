"""tiedlm.data.sources: what data.path names, loading through `datasets`, and the one-line error
of each way that fails: a ConfigError (exit 2) for what the config names and is not there or is
empty, a DataError (exit 1) for what the world does."""

import errno
import json
import os

import pytest

from tiedlm import data
from tiedlm.data import sources
from tiedlm.errors import ConfigError, DataError

from .test_data import (
    DOCS,
    assert_one_line_error,
    cli_data,
    prepare,
    raises,
    write_corpus,
)


def test_hub_unreachable_offline_says_what_to_do(monkeypatch):
    import datasets
    import huggingface_hub

    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)  # in case datasets was imported earlier
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    with raises(DataError, match="HF_DATASETS_OFFLINE") as err:
        prepare("data.path=wikitext", "data.name=wikitext-2-raw-v1")
    msg = str(err.value)
    assert "wikitext" in msg and "HF_DATASETS_OFFLINE" in msg and "builtin:synthetic" in msg
    assert "data.path: text" in msg and "\n" not in msg


def test_config_name_not_found(tmp_path):
    (tmp_path / "train.txt").write_text("\n".join(DOCS), encoding="utf-8")
    with raises(ConfigError, match=r"data.name 'nope' is not a config of .*; it has: 'default'"):
        prepare(f"data.path={tmp_path}", "data.name=nope")


def test_missing_paths_and_files(tmp_path):
    with raises(ConfigError, match=r"data.path \./no/such/folder does not exist"):
        prepare("data.path=./no/such/folder")
    with raises(ConfigError, match=r"matches no file"):
        prepare("data.path=text", f"data.data_files={tmp_path / '*.nothing'}")
    with raises(ConfigError, match=r"needs data.data_files"):
        prepare("data.path=text")
    with raises(ConfigError, match=r"unknown built-in corpus builtin:nope — use builtin:synthetic, builtin:pydoc or builtin:shakespeare"):
        prepare("data.path=builtin:nope")
    (tmp_path / "empty").mkdir()
    with raises(ConfigError, match=r"is an empty folder — add data files"):
        prepare(f"data.path={tmp_path / 'empty'}")
    (tmp_path / "notes.rtf").write_text("text")
    with raises(ConfigError, match=r"cannot tell the format of .*notes.rtf from its extension"):
        prepare(f"data.path={tmp_path / 'notes.rtf'}")


def test_not_utf8_names_the_file(tmp_path):
    (tmp_path / "good.txt").write_text("\n".join(DOCS), encoding="utf-8")
    (tmp_path / "latin.txt").write_bytes("\n".join(DOCS[:3]).encode("utf-8") + "\ncaf\xe9\n".encode("latin-1"))
    with raises(DataError, match=r"latin.txt is not UTF-8 text \(byte 0xe9 at offset \d+\) — convert it"):
        prepare("data.path=text", f"data.data_files={tmp_path / '*.txt'}")


@pytest.mark.parametrize("overrides, message, code", [
    (["data.path=./no/such/folder"],
     "data.path ./no/such/folder does not exist (relative to {cwd}) — check the path; a Hugging Face dataset id "
     "looks like owner/name", 2),
    (["data.path=text", "data.data_files=nothing*.txt"],
     "data.data_files: 'nothing*.txt' matches no file (relative paths start at {cwd}) — check the path or the "
     "glob", 2),
    (["data.path=builtin:nope"], "unknown built-in corpus builtin:nope — use builtin:synthetic, builtin:pydoc or "
     "builtin:shakespeare", 2),
    (["data.path=json", "data.data_files=d.jsonl"],
     "json files: d.jsonl (1 file, {size}) has no column 'text' in its train split; its columns are: body — "
     "set data.text_column", 2),
    (["data.path=json", "data.data_files=d.jsonl", "data.text_column=body", "data.train_split=training"],
     "json files: d.jsonl (1 file, {size}) has no split 'training'; it has: train — set data.train_split", 2),
    (["data.path=builtin:pydoc", "tokenizer.kind=pretrained", "tokenizer.path=missing.json"],
     "tokenizer.path missing.json does not exist — point it at a tokenizer.json file (as saved by the `tokenizers` "
     "library or found in a Hugging Face model repo)", 2),
    (["data.path=text", "data.data_files=latin.txt"],
     "{cwd}/latin.txt is not UTF-8 text (byte 0xe9 at offset 3) — convert it to UTF-8, e.g. iconv -f latin1 -t "
     "utf-8 {cwd}/latin.txt > {cwd}/latin.txt.utf8", 1),
])
def test_what_the_config_names_is_exit_2_and_what_the_data_holds_exit_1(tmp_path, monkeypatch, overrides, message,
                                                                        code):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "d.jsonl").write_text("\n".join(json.dumps({"body": t}) for t in DOCS), encoding="utf-8")
    (tmp_path / "latin.txt").write_bytes("caf\xe9\n".encode("latin-1") * 3)
    size = sources._human_bytes((tmp_path / "d.jsonl").stat().st_size)
    message = message.format(cwd=tmp_path.resolve(), size=size)
    assert_one_line_error(cli_data(tmp_path, "tokenizer.kind=byte", *overrides), message, code)


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


def test_an_empty_text_file_among_others_adds_no_documents(tmp_path):
    text_file = write_corpus(tmp_path)
    (tmp_path / "empty.txt").write_text("")
    p = prepare("data.path=text", f"data.data_files={json.dumps([str(text_file), str(tmp_path / 'empty.txt')])}",
                "tokenizer.kind=byte")
    assert sum(s.n_docs for s in p.splits.values()) == len(DOCS)


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
        m.setattr(os, "replace", refuse)
        assert sources.hub_revision("someone/corpus", None) == "c" * 40  # the memo only helps offline
    assert os.listdir(data.cache_root()) == []


def test_the_hub_revision_is_remembered_for_offline_runs(monkeypatch):
    import huggingface_hub

    class Api:
        def dataset_info(self, path, revision=None, timeout=None):
            return type("Info", (), {"sha": "d" * 40})()

    monkeypatch.delenv("HF_DATASETS_OFFLINE")
    monkeypatch.delenv("HF_HUB_OFFLINE")
    monkeypatch.setattr(huggingface_hub, "HfApi", Api)
    assert sources.hub_revision("someone/corpus", None) == "d" * 40
    assert json.loads((data.cache_root() / "hub-revisions.json").read_text()) == {"someone/corpus@main": "d" * 40}
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(huggingface_hub, "HfApi", None)  # offline: the hub is not asked
    assert sources.hub_revision("someone/corpus", None) == "d" * 40
    assert sources.hub_revision("someone/corpus", "e" * 40) == "e" * 40  # a pinned commit names itself


@pytest.fixture
def no_hang():
    """Fails the test after 60 s rather than letting a read of a FIFO with no writer block forever."""
    import signal

    def stuck(signum, frame):
        raise AssertionError("blocked for 60 s: something opened data.path before checking what it is")

    old = signal.signal(signal.SIGALRM, stuck)
    signal.alarm(60)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


@pytest.mark.skipif(not hasattr(os, "mkfifo") or not os.path.exists("/dev/zero"), reason="POSIX FIFOs and /dev/zero")
@pytest.mark.parametrize("target, kind", [("fifo", "a FIFO"), ("/dev/zero", "a character device")])
def test_a_fifo_or_a_device_as_data_path_is_named_for_what_it_is(tmp_path, monkeypatch, no_hang, target, kind):
    """Not "an empty folder": the path is refused from its stat, before anything opens it (a FIFO
    with no writer would block the reader)."""
    monkeypatch.chdir(tmp_path)
    if target == "fifo":
        os.mkfifo(tmp_path / "fifo")
        target = str(tmp_path / "fifo")
    message = (f"data.path {target} is not a regular file or folder ({kind}) — point data.path at a text file, a "
               "folder of them, or a dataset id")
    assert_one_line_error(cli_data(tmp_path, "tokenizer.kind=byte", f"data.path={target}"), message, 2)
    with raises(ConfigError, match="is not a regular file"):
        prepare("data.path=text", f"data.data_files={target}")
