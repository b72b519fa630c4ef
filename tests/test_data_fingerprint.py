"""A local data file is identified by its content, not its modification time: a copy, a checkout
or a touch of the same bytes keeps the source's fingerprint (so a run resumes and its runs compare
with the others), while one changed byte changes it. Each file is hashed once per stat it shows."""

import hashlib
import os
import shutil

import pytest

from tiedlm import data, runs
from tiedlm.config import DataConfig
from tiedlm.data import sources
from tiedlm.data.cache import DIGEST_MEMO, cache_root
from tiedlm.errors import Interrupted, RunError
from tiedlm.train import train_run

from .test_compare import edit_report

TEXT = "".join(f"line {i % 50} of a small text file with words\n" for i in range(600))


def _fingerprint(path):
    return sources.resolve_source(DataConfig(path="text", data_files=str(path))).fingerprint


def _later(path, seconds=1000):
    st = path.stat()
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + seconds * 10**9))


def test_the_fingerprint_follows_the_content_not_the_mtime(tmp_path):
    text = tmp_path / "t.txt"
    text.write_text(TEXT)
    before = _fingerprint(text)
    [[name, size, digest]] = before["files"]["train"]
    assert (name, size) == (str(text), len(TEXT.encode()))
    assert digest == "sha256:" + hashlib.sha256(TEXT.encode()).hexdigest()  # the bytes, hashed independently
    _later(text)
    assert _fingerprint(text) == before  # touched: the same bytes
    text.unlink()
    text.write_text(TEXT)  # written anew (another inode, another mtime): the same bytes
    assert _fingerprint(text) == before
    text.write_text(TEXT.replace("line 7 ", "line 8 ", 1))  # the same size, one byte other
    assert text.stat().st_size == size
    assert _fingerprint(text) != before


def test_a_folder_copied_elsewhere_and_back_keeps_its_fingerprint(tmp_path):
    folder = tmp_path / "corpus"
    folder.mkdir()
    (folder / "a.txt").write_text(TEXT)
    (folder / "b.txt").write_text(TEXT[::-1])
    fp = sources.resolve_source(DataConfig(path=str(folder))).fingerprint
    shutil.copytree(folder, tmp_path / "elsewhere")
    shutil.rmtree(folder)
    shutil.copytree(tmp_path / "elsewhere", folder)  # copytree keeps no inode; copy2 keeps mtimes, set them anew
    for f in folder.iterdir():
        _later(f, 7)
    assert sources.resolve_source(DataConfig(path=str(folder))).fingerprint == fp


def test_each_file_is_hashed_once_per_stat(tmp_path, monkeypatch):
    text = tmp_path / "t.txt"
    text.write_text(TEXT)
    hashed = []
    real = sources._content_digest
    monkeypatch.setattr(sources, "_content_digest", lambda p: hashed.append(p) or real(p))
    first = _fingerprint(text)
    assert hashed == [text] and (cache_root() / DIGEST_MEMO).is_file()
    assert _fingerprint(text) == first and hashed == [text]  # remembered: not read again
    _later(text)
    assert _fingerprint(text) == first and hashed == [text, text]  # another mtime: read again, same digest


def test_an_in_place_edit_of_the_same_size_with_its_mtime_set_back_is_hashed_again(tmp_path):
    """The memo keys on ctime too: `touch -d` can restore a file's mtime, not its ctime."""
    import os
    import time

    text = tmp_path / "t.txt"
    text.write_text(TEXT)
    first = _fingerprint(text)
    st = text.stat()
    time.sleep(0.01)
    text.write_text(TEXT.replace("a", "b", 1))  # same size, other bytes
    os.utime(text, ns=(st.st_atime_ns, st.st_mtime_ns))  # the mtime set back
    assert text.stat().st_size == st.st_size and text.stat().st_mtime_ns == st.st_mtime_ns
    assert text.stat().st_ctime_ns != st.st_ctime_ns
    assert _fingerprint(text) != first  # not served from the memo: the new bytes' digest


def test_a_memo_that_is_not_an_object_is_read_as_empty(tmp_path):
    text = tmp_path / "t.txt"
    text.write_text(TEXT)
    (cache_root()).mkdir(parents=True, exist_ok=True)
    (cache_root() / DIGEST_MEMO).write_text("[1, 2]")  # valid JSON, but not tiedlm's
    assert _fingerprint(text)["files"]["train"][0][2] == "sha256:" + hashlib.sha256(TEXT.encode()).hexdigest()


def test_an_unwritable_cache_only_costs_a_rehash(tmp_path, monkeypatch):
    text = tmp_path / "t.txt"
    text.write_text(TEXT)
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("")
    monkeypatch.setenv("TIEDLM_CACHE", str(blocker / "cache"))
    assert _fingerprint(text)["files"]["train"][0][2].startswith("sha256:")


def test_a_run_resumes_after_its_data_was_touched(tiny, tmp_path):
    text = tmp_path / "t.txt"
    text.write_text(TEXT)
    cfg = tiny("data.path=text", f"data.data_files={text}")
    with pytest.raises(Interrupted):
        train_run(cfg, out=tmp_path / "runs", progress=False, stop_after_step=5)
    _later(text)  # e.g. the data copied anew to this machine
    run = train_run(cfg, out=tmp_path / "runs", progress=False)
    report = runs.read_report(run)
    assert report.status == "finished" and report.resumed_at_steps == [5]


def _as_before(monkeypatch):
    """Fingerprint as tiedlm did before it hashed the content: each file's mtime in the digest's place."""
    def stamps(paths):
        by_mtime = [[str(p), p.stat().st_size, p.stat().st_mtime_ns] for p in paths]
        return by_mtime, by_mtime

    monkeypatch.setattr(sources, "file_stamps", stamps)


def _stopped_run_recorded_before(tiny, tmp_path, monkeypatch):
    """A run stopped at step 5 by a tiedlm that fingerprinted files by mtime, its report as that
    tiedlm wrote it: (its config, its folder, the identity it recorded, the data file)."""
    text = tmp_path / "t.txt"
    text.write_text(TEXT)
    cfg = tiny("data.path=text", f"data.data_files={text}")
    with monkeypatch.context() as m:
        _as_before(m)
        with pytest.raises(Interrupted):
            train_run(cfg, out=tmp_path / "runs", progress=False, stop_after_step=5)
    run = tmp_path / "runs" / "tiny-s0"
    ident = runs.read_report(run).data_identity
    old = {k: ident[k] for k in ("fingerprint", "tokenizer")}
    edit_report(run, data_identity=old)  # no by_mtime: it was not written then
    return cfg, run, old, text


def test_a_run_recorded_before_content_digests_resumes_while_its_files_are_untouched(tiny, tmp_path, monkeypatch):
    cfg, run, old, _ = _stopped_run_recorded_before(tiny, tmp_path, monkeypatch)
    train_run(cfg, out=tmp_path / "runs", progress=False)
    report = runs.read_report(run)
    assert report.status == "finished" and report.resumed_at_steps == [5]
    ident = report.data_identity  # recorded anew: by content, and by mtime as before
    assert ident["by_mtime"] == old != {k: ident[k] for k in ("fingerprint", "tokenizer")}


def test_a_run_recorded_before_content_digests_is_refused_once_its_files_were_touched(tiny, tmp_path, monkeypatch):
    """The older identity holds the mtime: touched since, the run cannot show it is on the same bytes."""
    cfg, run, _, text = _stopped_run_recorded_before(tiny, tmp_path, monkeypatch)
    _later(text)
    with pytest.raises(RunError, match="changed since the run started"):
        train_run(cfg, out=tmp_path / "runs", progress=False)


def test_a_pretrained_tokenizer_file_is_known_by_its_content_too(tmp_path):
    """tokenizer.path: touched, the tokenizer key stays (and the older key by mtime is the alias);
    one byte other, the key changes."""
    from .test_data import prepare, write_corpus
    from .test_data_tokenizers import _pretrained_file

    corpus = write_corpus(tmp_path)
    path = _pretrained_file(tmp_path)
    args = ("data.path=text", f"data.data_files={corpus}", "tokenizer.kind=pretrained", f"tokenizer.path={path}")
    before = data.data_identity(prepare(*args))
    _later(path)
    after = data.data_identity(prepare(*args))
    assert data.core_identity(after) == data.core_identity(before) and after["by_mtime"] != before["by_mtime"]
    path.write_text(path.read_text().replace('"<|endoftext|>"', '"<|endoftext|>" '))  # the same JSON, other bytes
    assert data.core_identity(data.data_identity(prepare(*args)))["tokenizer"] != before["tokenizer"]


def test_a_damaged_recorded_identity_does_not_fit(tmp_path):
    from .test_data import prepare, write_corpus

    p = prepare("data.path=text", f"data.data_files={write_corpus(tmp_path)}", "tokenizer.kind=byte")
    assert data.identity_fits(None, p) and not data.identity_fits("f220db1192cb0f0bb18a", p)
