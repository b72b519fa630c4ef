"""The leak measure (data/overlap.py): the share of each evaluation split's documents (lines, for
text files) of at least MIN_CHARS characters found verbatim in the training split, in
PreparedData.info["overlap"], in each run's report.json, in `tiedlm data`, and kept through the
token cache."""

import json

import pytest

from tiedlm import data
from tiedlm.data import cache, overlap, sources

from .test_data import SHAKESPEARE, WIKITEXT, cli_data, prepare, refuse, texts_of

BOILERPLATE = "Licensed under the Apache License, Version 2.0 (the License); you may not use this file"
SPEAKERS = ["KING RICHARD III:", "Exeunt.", "ARCHBISHOP OF YORK:", "= = Personal life = ="]


def write_lines(path, lines):
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def leaky_lines(n=400):
    """Unique long lines; every 8th line the same boilerplate, every 5th a short speaker name."""
    out = []
    for i in range(n):
        if i % 8 == 0:
            out.append(BOILERPLATE)
        elif i % 5 == 0:
            out.append(SPEAKERS[i % len(SPEAKERS)])
        else:
            out.append(f"line {i}: a sentence long enough to count, with its own number {i * 7919}")
    return out


def expected(p, split):
    """The overlap counted by hand from the decoded splits (byte tokenizer: exact text)."""
    train = {t.strip() for t in texts_of(p, "train")}
    long = [t.strip() for t in texts_of(p, split) if len(t.strip()) >= overlap.MIN_CHARS]
    return len(long), sum(t in train for t in long)


def test_the_share_of_evaluation_lines_found_in_train(tmp_path):
    f = write_lines(tmp_path / "leaky.txt", leaky_lines())
    p = prepare("data.path=text", f"data.data_files={f}", "tokenizer.kind=byte", "data.validation_fraction=0.2",
                "data.test_fraction=0.2")
    o = p.info["overlap"]
    assert set(o) == {"validation", "test"}
    for split in ("validation", "test"):
        checked, hits = expected(p, split)
        assert o[split] == {"unit": "lines", "min_chars": 32, "checked": checked, "in_train": hits,
                            "share": hits / checked, "train_checked": p.splits["train"].n_docs,
                            "train_documents": p.splits["train"].n_docs}
        assert hits > 0  # the boilerplate: 1 line in 8 on both sides of a random carving
        assert checked < p.splits[split].n_docs  # the speaker names are not counted


def test_short_repeated_lines_carry_no_leak(tmp_path):
    """Speaker names and section headings repeat on both sides of any carving by lines, yet are
    no copy of training text: below MIN_CHARS they are not counted at all."""
    lines = [SPEAKERS[i % len(SPEAKERS)] if i % 2 else f"line {i}: unique text of some length, number {i}"
             for i in range(300)]
    f = write_lines(tmp_path / "play.txt", lines)
    p = prepare("data.path=text", f"data.data_files={f}", "tokenizer.kind=byte")
    for o in p.info["overlap"].values():
        assert o["in_train"] == 0 and o["share"] == 0.0 and 0 < o["checked"]
    assert all(len(s) < overlap.MIN_CHARS for s in SPEAKERS)


def test_contiguous_carving_drops_the_share_of_neighbouring_repeats(tmp_path):
    """Text whose lines repeat next to each other (a refrain, a doubled paragraph): a random carving
    puts one copy in train and the other in test; a contiguous one keeps them together."""
    lines = [f"refrain {i // 2}: the same long line twice, one after the other" for i in range(600)]
    f = write_lines(tmp_path / "song.txt", lines)
    args = ("data.path=text", f"data.data_files={f}", "tokenizer.kind=byte")
    random, contiguous = prepare(*args), prepare(*args, "data.carve=contiguous")
    assert random.info["overlap"]["test"]["share"] > 0.8
    for split in ("validation", "test"):
        o = contiguous.info["overlap"][split]
        assert o["in_train"] <= 1 and (o["checked"], o["in_train"]) == expected(contiguous, split)


def test_the_measure_is_kept_through_the_cache(tmp_path, monkeypatch):
    f = write_lines(tmp_path / "leaky.txt", leaky_lines())
    args = ("data.path=text", f"data.data_files={f}", "tokenizer.kind=byte")
    cold = prepare(*args)
    folder = cold.info["cache"]["tokenizer_folder"]
    stored = json.loads((cache.Path(folder) / cache.OVERLAP).read_text())
    assert stored == {"version": overlap.VERSION, "min_chars": overlap.MIN_CHARS, "splits": cold.info["overlap"]}
    for name in ("split_documents", "encode_split", "train_tokenizer"):
        monkeypatch.setattr(data, name, refuse)
    monkeypatch.setattr(overlap, "measure", refuse)
    warm = prepare(*args)
    assert warm.info["cache"]["hit"] and warm.info["overlap"] == cold.info["overlap"]


def test_an_entry_without_the_measure_gets_it_when_its_documents_are_read_again(tmp_path):
    f = write_lines(tmp_path / "leaky.txt", leaky_lines())
    args = ("data.path=text", f"data.data_files={f}", "tokenizer.kind=byte")
    cold = prepare(*args)
    measured = cold.info["overlap"]
    (cache.Path(cold.info["cache"]["tokenizer_folder"]) / cache.OVERLAP).unlink()  # an entry made before it
    assert prepare(*args).info["overlap"] is None  # a hit reads no text: nothing to say
    again = prepare(*args, "data.max_eval_tokens=300")  # evaluation splits encoded again: measured again
    assert again.info["cache"]["tokenizer_hit"] and again.info["overlap"] == measured
    assert prepare(*args).info["overlap"] == measured


def test_a_stream_is_measured_as_it_is_encoded(tmp_path):
    f = write_lines(tmp_path / "leaky.txt", leaky_lines())
    p = prepare("data.path=text", f"data.data_files={f}", "data.streaming=true", "data.max_train_tokens=1000000",
                "data.validation_fraction=0.2", "data.test_fraction=0.2", "tokenizer.kind=byte")
    for split in ("validation", "test"):
        o = p.info["overlap"][split]
        assert (o["checked"], o["in_train"]) == expected(p, split) and o["in_train"] > 0
        assert o["train_checked"] == o["train_documents"] == p.splits["train"].n_docs
    assert prepare("data.path=text", f"data.data_files={f}", "data.streaming=true", "data.max_train_tokens=1000000",
                   "data.validation_fraction=0.2", "data.test_fraction=0.2",
                   "tokenizer.kind=byte").info["overlap"] == p.info["overlap"]  # and from the cache


def test_the_work_is_bounded_and_says_so(tmp_path, monkeypatch):
    f = write_lines(tmp_path / "leaky.txt", leaky_lines())
    monkeypatch.setattr(overlap, "TRAIN_LIMIT", 50)
    p = prepare("data.path=text", f"data.data_files={f}", "tokenizer.kind=byte")
    o = p.info["overlap"]["test"]
    assert o["train_checked"] == 50 and o["train_documents"] == p.splits["train"].n_docs > 50
    assert f"the first 50 of {o['train_documents']} training lines" in data.summarize(p)


def test_json_records_are_documents_and_builtin_corpora_are_measured(tmp_path):
    rows = [json.dumps({"text": t}) for t in leaky_lines(200)]
    f = write_lines(tmp_path / "d.jsonl", rows)
    p = prepare("data.path=json", f"data.data_files={f}", "tokenizer.kind=byte")
    assert p.info["overlap"]["test"]["unit"] == "documents" and p.info["overlap"]["test"]["in_train"] > 0
    pydoc = prepare("data.path=builtin:pydoc", "tokenizer.kind=byte")
    assert {o["unit"] for o in pydoc.info["overlap"].values()} == {"paragraphs"}
    assert all(o["in_train"] == 0 for o in pydoc.info["overlap"].values())  # its repeated paragraphs are dropped


def test_tiny_shakespeare_speeches_share_nothing_with_train():
    p = prepare("data.path=builtin:shakespeare", "tokenizer.kind=byte")
    o = p.info["overlap"]
    assert {s: (v["unit"], v["checked"], v["in_train"]) for s, v in o.items()} == {
        "validation": ("speeches", 346, 0), "test": ("speeches", 345, 0)}
    assert o["test"]["train_checked"] == o["test"]["train_documents"] == 6381


def test_tiedlm_data_prints_the_overlap(tmp_path):
    f = write_lines(tmp_path / "leaky.txt", leaky_lines())
    r = cli_data(tmp_path, "data.path=text", f"data.data_files={f}", "tokenizer.kind=byte")
    assert r.exit_code == 0, r.output
    line = next(x for x in r.stdout.splitlines() if x.startswith("overlap"))
    assert line.startswith("overlap    lines of 32+ characters also in train — validation: ")
    assert "; test: " in line and "%)" in line


def test_a_run_report_records_the_overlap(tmp_path, tiny):
    from tiedlm.runs import read_report
    from tiedlm.train import train_run

    f = write_lines(tmp_path / "leaky.txt", leaky_lines())
    cfg = tiny("data.path=text", f"data.data_files={f}", "tokenizer.kind=byte", "train.max_steps=2",
               "train.eval_every=2", "train.checkpoint_every=2")
    run = train_run(cfg, tmp_path / "runs", progress=False)
    report = json.loads((run / "report.json").read_text())
    assert report["data"]["overlap"]["test"]["in_train"] > 0
    assert read_report(run) is not None


@pytest.mark.skipif(not SHAKESPEARE.exists(), reason=f"{SHAKESPEARE} is absent (shared data not mounted)")
def test_tiny_shakespeare_lines_random_and_contiguous():
    """The measured shares the docs quote: random single lines leave a few long lines on both
    sides; contiguous blocks none."""
    args = ("data.path=text", f"data.data_files={SHAKESPEARE}", "tokenizer.kind=byte")
    random, contiguous = prepare(*args), prepare(*args, "data.carve=contiguous")
    shares = {name: {s: (v["in_train"], v["checked"]) for s, v in p.info["overlap"].items()}
              for name, p in (("random", random), ("contiguous", contiguous))}
    assert shares == {"random": {"validation": (2, 1085), "test": (0, 1060)},
                      "contiguous": {"validation": (0, 1055), "test": (0, 831)}}


@pytest.mark.skipif(not WIKITEXT.exists(), reason=f"{WIKITEXT} is absent (shared data not mounted)")
def test_wikitext_small_headings_are_not_counted():
    files = json.dumps({"train": str(WIKITEXT / "valid.txt"), "validation": str(WIKITEXT / "test.txt")})
    p = prepare("data.path=text", f"data.data_files={files}", "tokenizer.kind=byte", "data.test_from=validation",
                "data.test_fraction=0.5", "data.carve=contiguous")
    assert {s: (v["in_train"], v["checked"]) for s, v in p.info["overlap"].items()} == {
        "validation": (0, 1068), "test": (0, 1087)}


def test_unit_of_a_folder_of_text_files(tmp_path):
    (tmp_path / "train.txt").write_text("\n".join(leaky_lines(100)), encoding="utf-8")
    from .test_data import cfg_for

    source = sources.resolve_source(cfg_for(f"data.path={tmp_path}").data)
    assert overlap.unit_of(source) == "lines"
