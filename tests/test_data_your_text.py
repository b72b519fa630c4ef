"""Your own text in one line: a local-looking data.path that is not there fails at once, without
asking the hub; data.data_files beside a built-in corpus is refused (it trained on the corpus);
runs of a config trained on other data are named after that data."""

import hashlib
from pathlib import Path

import pytest

from tiedlm import data
from tiedlm.config.checks import check_run_name
from tiedlm.data import sources
from tiedlm.errors import ConfigError
from tiedlm.config.naming import data_name, override_tag

from .conftest import ROOT
from .test_data import DOCS, assert_one_line_error, cfg_for, cli_data, prepare, raises


@pytest.fixture
def no_hub(monkeypatch):
    """Fail the test if the hub (or datasets' loader) is asked anything."""
    def asked(*args, **kwargs):
        raise AssertionError(f"the hub was asked: {args}")

    monkeypatch.setattr(sources, "hub_revision", asked)
    monkeypatch.setattr(sources, "_load_dataset", asked)


@pytest.mark.parametrize("path", ["corpus2.txt", "texts/my.jsonl", "notes.md", "corpus.csv.gz", "a/b/c", "mydir/",
                                  "./corpus2", "../corpus2", "sub\\corpus2"])
def test_a_missing_local_looking_path_fails_at_once_without_the_hub(tmp_path, monkeypatch, no_hub, path):
    monkeypatch.chdir(tmp_path)
    r = cli_data(tmp_path, f"data.path={path}")
    assert_one_line_error(r, f"data.path {path} does not exist (relative to {tmp_path}) — check the path; a Hugging "
                             "Face dataset id looks like owner/name", 2)


def test_a_missing_absolute_or_home_path_says_where_it_looked(tmp_path, monkeypatch, no_hub):
    monkeypatch.setenv("HOME", str(tmp_path))
    with raises(ConfigError, match=rf"^data.path ~/corpus2.txt does not exist \({tmp_path}/corpus2.txt\) — "):
        prepare("data.path=~/corpus2.txt")
    with raises(ConfigError, match=rf"^data.path {tmp_path}/nope does not exist — check the path; a Hugging Face "):
        prepare(f"data.path={tmp_path}/nope")


def test_check_source_refuses_a_missing_file_and_leaves_a_hub_id_alone(tmp_path, monkeypatch, no_hub):
    monkeypatch.chdir(tmp_path)
    with raises(ConfigError, match=r"^data.path corpus2.txt does not exist"):
        data.check_source(cfg_for("data.path=corpus2.txt").data)
    data.check_source(cfg_for("data.path=roneneldan/TinyStories").data)  # the hub is not asked
    (tmp_path / "corpus2.txt").write_text("\n".join(DOCS), encoding="utf-8")
    data.check_source(cfg_for("data.path=corpus2.txt").data)


@pytest.mark.parametrize("path, local", [
    ("wikitext", False), ("roneneldan/TinyStories", False), ("HuggingFaceFW/fineweb-edu", False),
    ("mlfoundations/dclm-baseline-1.0", False), ("corpus2.txt", True), ("data/train.parquet", True),
    ("x.JSONL", True), ("a.txt.gz", True), ("a/b/c", True), ("mydir/", True), ("./x", True), ("../x", True),
    ("~/x", True), ("/x", True), ("C:/data/x", True), ("sub\\x", True), (".", True)])
def test_what_looks_local(path, local):
    assert sources.looks_local(path) is local


def test_a_hub_id_still_goes_to_the_hub(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    asked = []
    monkeypatch.setattr(sources, "hub_revision", lambda p, rev: asked.append(p) or "c" * 40)
    for path in ("wikitext", "roneneldan/TinyStories"):
        source = sources.resolve_source(cfg_for(f"data.path={path}").data)
        assert source.kind == "hub" and source.fingerprint["revision"] == "c" * 40
    assert asked == ["wikitext", "roneneldan/TinyStories"]


def test_an_existing_file_named_like_a_hub_id_is_read(tmp_path, monkeypatch, no_hub):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "owner").mkdir()
    (tmp_path / "owner" / "corpus").write_text("\n".join(DOCS), encoding="utf-8")
    with raises(ConfigError, match=r"cannot tell the format of owner/corpus from its extension"):
        prepare("data.path=owner/corpus")


@pytest.mark.parametrize("builtin", ["builtin:shakespeare", "builtin:synthetic", "builtin:pydoc"])
def test_data_files_beside_a_builtin_corpus_is_refused(tmp_path, monkeypatch, builtin):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "my.txt").write_text("\n".join(DOCS), encoding="utf-8")
    r = cli_data(tmp_path, f"data.path={builtin}", "data.data_files=my.txt")
    assert_one_line_error(r, f"data.data_files is set, and data.path {builtin} reads no files (it would train on "
                             f"{builtin}) — to train on the files set data.path to their builder (text, json, csv, "
                             "parquet) or to the file itself, or drop data.data_files (--set data.data_files=null)", 2)
    # the fixes it names work
    cfg = cfg_for(f"data.path={builtin}", "data.data_files=my.txt", "data.data_files=null")
    assert cfg.data.data_files is None
    cfg_for("data.path=text", "data.data_files=my.txt")


# ------------------------------------------------------------------ runs named after the data


@pytest.mark.parametrize("value, name", [
    ("corpus2.txt", "corpus2"), ("/data/my texts/notes.md", "notes"), ("../texts/", "texts"),
    ("roneneldan/TinyStories", "TinyStories"), ("wikitext", "wikitext"), ("builtin:pydoc", "pydoc"),
    ("corpus.jsonl.gz", "corpus"), ("corpus/**/*.jsonl", "corpus"), ("~", "data"), (".hidden.txt", "hidden"),
    (["a/first.txt", "b/second.txt"], "first"), ({"validation": "v.txt", "train": "t.txt"}, "t"), (None, "data"),
    ("x" * 80 + ".txt", "x" * 32)])
def test_data_name(value, name):
    assert data_name(value) == name


def test_override_tag_names_the_data_and_keeps_other_names():
    tag = override_tag(["data.path=corpus2.txt"])
    digest = hashlib.sha256(b"data.path=corpus2.txt").hexdigest()[:8]
    assert tag == f"-corpus2-{digest}"
    # two files of one name, or two spellings of one path, never share a run folder
    assert override_tag(["data.path=a/corpus2.txt"]) != tag != override_tag(["data.path=./corpus2.txt"])
    assert override_tag(["data.path=corpus2.txt", "model.n_embd=64"]) == f"-corpus2-{digest}-n_embd=64"
    assert override_tag(["data.path=text", "data.data_files=../my.jsonl"]).startswith("-my-")
    assert override_tag(["data.data_files=mine.txt"]).startswith("-mine-")
    assert override_tag(["seed=3", "data.path=corpus2.txt"]) == tag
    others = ["model.n_layer=3", "model.n_head=2", "model.n_embd=64", "train.lr=0.001", "train.min_lr=0.0001"]
    long = override_tag(["data.path=/a/very/long/path/to/the/corpus2.txt", *others])
    assert long == (f"-corpus2-{hashlib.sha256(b'data.path=/a/very/long/path/to/the/corpus2.txt').hexdigest()[:8]}"
                    f"-n_layer=3_n_head=2_n_embd=64+2-{hashlib.sha256(' '.join(others).encode()).hexdigest()[:8]}")
    for t in (tag, long):
        check_run_name(f"shakespeare{t}-untied-s0")
    # without a data override, the names are those of before (finished runs are found by them)
    assert override_tag([]) == "" and override_tag(["seed=1"]) == ""
    assert override_tag(["model.n_embd=256", "train.lr=2e-3"]) == "-n_embd=256_lr=2e-3"
    many = [f"model.n_embd={i}" for i in range(20)]  # a long list: what fits, how many more, a hash of all
    assert override_tag(many) == "-n_embd=0_n_embd=1_n_embd=2_n_embd=3+16-" \
        + hashlib.sha256(" ".join(many).encode()).hexdigest()[:8]


def test_compare_runs_are_named_after_the_data(tmp_path, monkeypatch):
    from tiedlm.experiment.plan import plan_comparison
    from tiedlm.experiment.request import CompareRequest

    def names(*overrides):
        req = CompareRequest(config=ROOT / "configs" / "shakespeare.yaml", overrides=list(overrides)).check()
        return [d.name for d in plan_comparison(req).dirs(Path("runs"), 0, 1)]

    monkeypatch.chdir(tmp_path)
    (tmp_path / "my.txt").write_text("a line of my own text\n")  # a missing file is refused when planned
    digest = hashlib.sha256(b"data.path=my.txt").hexdigest()[:8]
    assert names("data.path=my.txt") == [f"shakespeare-my-{digest}-tied-s0", f"shakespeare-my-{digest}-untied-s0"]
    assert names() == ["shakespeare-tied-s0", "shakespeare-untied-s0"]
    (tmp_path / "my.txt").unlink()
    with pytest.raises(ConfigError, match=r"data\.path my\.txt does not exist"):
        names("data.path=my.txt")
    assert names("model.n_embd=64") == ["shakespeare-n_embd=64-tied-s0", "shakespeare-n_embd=64-untied-s0"]
