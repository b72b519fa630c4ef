"""tiedlm.data.cache: cache hits, what invalidates an entry, concurrent writers, broken entries,
a full disk, and `tiedlm cache list/clear`."""

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

from tiedlm import data
from tiedlm.data import cache
from tiedlm.files import HOST

from .conftest import ROOT
from .test_data import (
    DOCS,
    assert_one_line_error,
    cfg_for,
    cli,
    cli_data,
    data_command,
    prepare,
    refuse,
    write_corpus,
)

try:
    import resource
except ImportError:  # not on Windows
    resource = None


@pytest.fixture
def text_file(tmp_path):
    return write_corpus(tmp_path)


def test_second_prepare_is_a_cache_hit(text_file, monkeypatch):
    args = ("data.path=text", f"data.data_files={text_file}", "tokenizer.kind=bpe", "tokenizer.vocab_size=300")
    first = prepare(*args)
    assert not first.info["cache"]["hit"]

    monkeypatch.setattr(data, "train_tokenizer", refuse)
    monkeypatch.setattr(data, "encode_split", refuse)
    monkeypatch.setattr(data, "split_documents", refuse)  # not even `datasets` is needed
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


def test_a_cache_hit_in_another_process_imports_neither_datasets_nor_tokenizers(text_file):
    args = ["train.max_steps=1", "model.block_size=8", "data.path=text", f"data.data_files={text_file}",
            "tokenizer.kind=char"]
    cold = prepare(*args[2:])
    code = ("import json, sys\nfrom tiedlm.config import load_config\nfrom tiedlm.data import prepare_data\n"
            "p = prepare_data(load_config(None, json.loads(sys.argv[1])), progress=False)\n"
            "print(json.dumps([p.info['cache']['hit'], sorted({m.split('.')[0] for m in sys.modules} & "
            "{'datasets', 'pyarrow', 'tokenizers'}), {s: len(v.tokens) for s, v in p.splits.items()}]))")
    r = subprocess.run([sys.executable, "-c", code, json.dumps(args)], cwd=ROOT, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr
    hit, heavy, lengths = json.loads(r.stdout)
    assert hit and heavy == [] and lengths == {s: len(v.tokens) for s, v in cold.splits.items()}


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
# `tiedlm cache clear`


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
    dead = tokens / f".tmp-{'0' * 20}-{HOST}-{dead_pid()}-0000dead"  # left by a killed process
    live = tokens / f".tmp-{'1' * 20}-{HOST}-{os.getpid()}-0000beef"  # a process still writing it
    old = tokens / f".tmp-{'2' * 20}-{os.getpid()}-0000001d"  # an older name, without the host
    for folder in (dead, live, old):
        folder.mkdir()
        (folder / "tokens.npy").write_bytes(b"x" * 100)
    week_ago = time.time() - 7 * 86400
    for f in (old / "tokens.npy", old):
        os.utime(f, (week_ago, week_ago))
    memo_tmp = root / f".hub-revisions.json.{HOST}-{dead_pid()}-0000dead.tmp"  # see files.replace_atomically
    memo_tmp.write_text("{")
    digests_tmp = root / f".file-digests.json.{HOST}-{dead_pid()}-0000dead.tmp"
    digests_tmp.write_text("{")
    assert (root / "file-digests.json").is_file()  # the text file's digest, remembered

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
    assert not (root / "file-digests.json").exists() and not digests_tmp.exists()


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


# --------------------------------------------------------------------------------------------
# Writes that fail: one line, exit 1, nothing half-written left behind


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
    def refuse_to_write(path, array):  # half a file, then the failure
        path.write_bytes(b"\x93NUMPY half")
        raise exc

    monkeypatch.setattr(cache, "save_npy", refuse_to_write)
    r = cli_data(tmp_path, "data.path=builtin:synthetic", "tokenizer.kind=byte")
    root = data.cache_root()
    assert_one_line_error(r, f"{os.strerror(code)} while writing the token cache ({root / 'tokens'}) — free some "
                             "disk space (or set TIEDLM_CACHE to a disk with room), then run the same command again", 1)
    assert not list(root.rglob(".tmp-*")) and not list((root / "tokens").iterdir())


def test_a_write_failure_without_an_errno_names_the_error(tmp_path, monkeypatch):
    def refuse_to_write(path, array):
        raise RuntimeError("the writer broke\nwith a second line")

    monkeypatch.setattr(cache, "save_npy", refuse_to_write)
    r = cli_data(tmp_path, "data.path=builtin:synthetic", "tokenizer.kind=byte")
    assert_one_line_error(r, f"cannot write the token cache ({data.cache_root() / 'tokens'}): the writer broke — "
                             "check the path and its permissions, and the free disk space (or set TIEDLM_CACHE to a "
                             "folder you can write), then run the same command again", 1)


def test_a_cache_folder_that_cannot_be_written_names_the_path(tmp_path, monkeypatch):
    not_a_folder = tmp_path / "cache"
    not_a_folder.write_text("a file")
    monkeypatch.setenv("TIEDLM_CACHE", str(not_a_folder))
    r = cli_data(tmp_path, "data.path=builtin:synthetic", "tokenizer.kind=byte")
    assert_one_line_error(r, f"cannot write the token cache ({not_a_folder / 'tokenizers'}): "
                             f"{os.strerror(errno.ENOTDIR)} — check the path and its permissions (or set "
                             "TIEDLM_CACHE to a folder you can write), then run the same command again", 1)


def test_a_manifest_that_cannot_be_written_leaves_the_old_one_and_no_temporary_file(tmp_path, monkeypatch):
    (tmp_path / "manifest.json").write_text('{"old": 1}')

    def refuse_to_rename(src, dst):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    with monkeypatch.context() as m:
        m.setattr(os, "replace", refuse_to_rename)
        with pytest.raises(OSError):
            cache.write_manifest(tmp_path, {"new": 2})
    assert os.listdir(tmp_path) == ["manifest.json"]
    assert json.loads((tmp_path / "manifest.json").read_text()) == {"old": 1}


def test_the_cache_says_where_it_is_on_its_first_use_only(tmp_path, monkeypatch, capsys):
    from tiedlm.config import load_config
    from tiedlm.data import prepare_data

    monkeypatch.setenv("TIEDLM_CACHE", str(tmp_path / "fresh-cache"))
    cfg = load_config(None, ["train.max_steps=1", "data.synthetic.train_tokens=2000",
                             "data.synthetic.validation_tokens=300", "data.synthetic.test_tokens=300"])
    prepare_data(cfg, progress=False)
    first = capsys.readouterr().err
    assert first.count(f"the token cache is {tmp_path / 'fresh-cache'} (set TIEDLM_CACHE") == 1
    prepare_data(load_config(None, ["train.max_steps=1", "tokenizer.kind=char", "data.synthetic.train_tokens=2000",
                                    "data.synthetic.validation_tokens=300", "data.synthetic.test_tokens=300"]),
                 progress=False)
    assert "the token cache is" not in capsys.readouterr().err  # it exists now: said once
