"""A run's start is known by its content, not by its path: model.init_from's config.json and weight
files, or model.hf_config's file, are fingerprinted into report.json (start_identity) as data files
are. A start replaced or edited between seeds is never pooled into one variant by compare, a resume
from a start that changed is refused in one line, and a run keeps a copy of its start (start/) so
that eval, sample and export rebuild it after the start was moved or deleted.

Offline and tiny: a start is a one-layer Qwen2 saved with save_pretrained beside the word tokenizer
of the synthetic language, made in well under a second."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tests.test_compare import TIED, UNTIED, edit_report, make_run, raises_exactly

TIED_KEYS = (TIED[0], UNTIED[0])
from tiedlm import runs
from tiedlm.config import load_config
from tiedlm.data import core_identity
from tiedlm.errors import RunError

pytest.importorskip("transformers")

LANGUAGE = ["data.synthetic.vocab_size=60", "data.synthetic.n_classes=6", "data.synthetic.successors=2",
            "data.synthetic.train_tokens=3000", "data.synthetic.validation_tokens=400",
            "data.synthetic.test_tokens=400"]
TRAIN = [*LANGUAGE, "train.batch_size=4", "train.max_steps=2", "train.warmup_steps=1", "train.eval_every=0",
         "train.checkpoint_every=1", "train.threads=1", "train.device=cpu", "eval.batch_size=16"]
SMALL = ["model.n_layer=1", "model.n_embd=16", "model.n_head=2", "model.block_size=16"]


def save_start(folder: Path, seed: int, width: int = 16) -> Path:
    """A tiny Qwen2 (weights drawn from `seed`) saved with save_pretrained, with the word tokenizer of
    the synthetic language: a start for model.init_from. Every seed gets the same tokenizer files."""
    import torch
    from transformers import AutoModelForCausalLM, Qwen2Config

    from tiedlm.data import prepare_data
    from tiedlm.data.hub import write_hf_tokenizer

    tok = prepare_data(load_config(None, [*TRAIN, "tokenizer.kind=word"]), progress=False).tokenizer
    config = Qwen2Config(vocab_size=tok.vocab_size, hidden_size=width, intermediate_size=32, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=16,
                         tie_word_embeddings=True)
    torch.manual_seed(seed)
    AutoModelForCausalLM.from_config(config).save_pretrained(str(folder))
    write_hf_tokenizer(tok, folder, 16)
    return folder


def train_from(start: Path, out: Path, name: str, seed: int, *extra: str, **kwargs) -> Path:
    from tiedlm.train import train_run

    cfg = load_config(None, [f"model.init_from={start}", *TRAIN, *extra], seed=seed)
    return train_run(cfg, out=out, name=name, progress=False, **kwargs)


def _scores(run: Path) -> dict:
    from tiedlm.evaluate import evaluate_run

    return {s: (r["loss"], r["tokens"]) for s, r in evaluate_run(run, device="cpu")["results"].items()}


def _sample(run: Path) -> tuple[list, str]:
    from tiedlm.generate import SampleOptions, sample_run

    written: list[str] = []
    ids = sample_run(run, SampleOptions(max_new_tokens=8, seed=3), written.append, lambda _: None, device="cpu")
    return ids, "".join(written)


def test_a_replaced_start_then_an_added_seed_is_not_pooled_into_one_variant(tmp_path):
    """The init_from folder replaced by another model with the same tokenizer, then a seed added. The data identity cannot tell (same data, same tokenizer bytes at the same path,
    same config hash); the start identity can, and compare refuses to pool the seeds."""
    import tiedlm.compare as C

    start, out = save_start(tmp_path / "start", seed=0), tmp_path / "runs"
    for seed in (0, 1):
        for tie in ("true", "false"):
            train_from(start, out, f"{tie}-s{seed}", seed, f"model.tie_embeddings={tie}")
    shutil.rmtree(start)
    save_start(start, seed=1)  # another model, the same tokenizer, at the same path
    for tie in ("true", "false"):
        train_from(start, out, f"{tie}-s2", 2, f"model.tie_embeddings={tie}")

    reports = {p.name: runs.read_report(p) for p in sorted(out.iterdir())}
    assert len({json.dumps(core_identity(r.data_identity)) for r in reports.values()}) == 1  # by content
    assert len({r.config_hash for r in reports.values() if r.config.model.tie_embeddings}) == 1

    with raises_exactly(RunError) as err:
        C.compare_runs(runs_dir=out)
    msg = str(err.value)
    assert "\n" not in msg and "6 runs were trained from 2 different starts" in msg
    assert f"model.init_from {start}: its model.safetensors differs" in msg and "never compared" in msg
    assert not [p for p in out.iterdir() if p.name.startswith("compare")]
    # its fix is typed as written: the first start's runs, quoted, all of them (no "…")
    import shlex

    typed = shlex.split(msg.split("at a time (tiedlm compare ", 1)[1].split("), or pass", 1)[0])
    assert len(typed) == 4 and C.compare_runs(typed, runs_dir=out).variant("tied").seeds == [0, 1]
    first, second = reports["true-s0"].start_identity, reports["true-s2"].start_identity
    assert set(first) == {"config", "weights"} and set(first["weights"]) == {"model.safetensors"}
    assert first["config"] == second["config"] and first["weights"] != second["weights"]
    assert reports["false-s1"].start_identity == first
    # the seeds of one start compare as before; --baseline compares the baseline's start and lists the other
    one = C.compare_runs([str(out / "*-s0"), str(out / "*-s1")], runs_dir=out)
    assert one.variant("tied").seeds == [0, 1] and one.data_sets == 1
    chosen = C.compare_runs(runs_dir=out, baseline="false-s2")
    assert chosen.variant("tied").seeds == [2]
    assert {n.variant for n in chosen.not_compared} == {"tied [start 1]", "untied [start 1]"}
    assert all(n.reason.startswith("trained from another start (their start, which changed between runs")
               for n in chosen.not_compared)


def test_runs_that_recorded_no_start_compare_as_before(tmp_path):
    """Runs trained before runs recorded their start (no start_identity) are taken to share their
    data's start: they compare with each other, and with the runs of the one start recorded since;
    where their data had two starts since, they are not put with either."""
    import tiedlm.compare as C

    out = tmp_path / "runs"
    (tmp_path / "fam.json").write_text(json.dumps({"model_type": "qwen2"}))
    family = ["model.arch=hf", f"model.hf_config={tmp_path / 'fam.json'}", "model.bias=false"]
    for s in (0, 1):
        make_run(out, f"tied-s{s}", s, TIED + family, val=57.0 + s, identity={"fingerprint": "fp", "tokenizer": "tok"})
        make_run(out, f"untied-s{s}", s, UNTIED + family, val=59.0 + s,
                 identity={"fingerprint": "fp", "tokenizer": "tok"})
    assert C.compare_runs(runs_dir=out).variant("tied").seeds == [0, 1]
    a = {"config": "sha256:a", "weights": {"model.safetensors": "sha256:1"}}
    for name in ("tied-s1", "untied-s1"):
        edit_report(out / name, start_identity=a)
    result = C.compare_runs(runs_dir=out)
    assert result.variant("tied").seeds == [0, 1] and result.data_sets == 1 and not result.not_compared
    edit_report(out / "untied-s1", start_identity={**a, "weights": {"model.safetensors": "sha256:2"}})
    with raises_exactly(RunError) as err:
        C.compare_runs(runs_dir=out)
    assert "trained from 3 different starts" in str(err.value)
    assert "start 2 (" + str(out / "tied-s1") + ": 1 run) in their start: the runs of one recorded none" in str(err.value)


def family(config: Path) -> list[str]:
    """The settings of a run whose family is the config.json at `config` (model.hf_config)."""
    return ["model.arch=hf", f"model.hf_config={config}", *SMALL, *TRAIN, "tokenizer.kind=word"]


def _hf_config_run(config: Path, out: Path, seed: int, **kwargs) -> Path:
    from tiedlm.train import train_run

    cfg = load_config(None, family(config), seed=seed)
    return train_run(cfg, out=out, name=f"family-s{seed}", progress=False, **kwargs)


def _edit(config: Path, **fields) -> None:
    config.write_text(json.dumps({**json.loads(config.read_text()), **fields}))


def test_an_edited_hf_config_file_refuses_a_resume_and_is_not_pooled(tmp_path):
    """model.hf_config names a config.json: an edit that keeps every shape (rms_norm_eps) would go
    unseen by the config hash and by a checkpoint's load. A resume across it is refused in one line
    (exit 1, the run folder untouched); seeds trained before and after it are not pooled; and the
    finished run still scores as it did, from its own copy of the file, edited or deleted since."""
    from typer.testing import CliRunner

    import tiedlm.compare as C
    from tiedlm.cli import app
    from tiedlm.errors import Interrupted

    config, out = tmp_path / "family.json", tmp_path / "runs"
    config.write_text(json.dumps({"model_type": "qwen2", "rms_norm_eps": 1e-6}))
    finished = _hf_config_run(config, out, 0)
    scores = _scores(finished)
    with pytest.raises(Interrupted):
        _hf_config_run(config, out, 1, stop_after_step=1)
    stopped = out / "family-s1"
    _edit(config, rms_norm_eps=1e-5)
    before = {p: p.read_bytes() for p in stopped.rglob("*") if p.is_file()}
    with pytest.raises(RunError) as err:
        _hf_config_run(config, out, 1)
    msg = str(err.value)
    assert "\n" not in msg and "changed since the run started" in msg
    assert f"model.hf_config {config}: its content differs" in msg and "--overwrite" in msg
    assert {p: p.read_bytes() for p in stopped.rglob("*") if p.is_file()} == before
    cli = CliRunner().invoke(app, ["train", "--config", str(stopped / runs.CONFIG), "--out", str(out), "--name",
                                   "family-s1", "-q"])
    assert cli.exit_code == 1 and "changed since the run started" in cli.output
    _hf_config_run(config, out, 1, overwrite=True)  # the fix the line gives: afresh from the edited file
    with raises_exactly(RunError, match=r"trained from 2 different starts, .*model.hf_config .*: its content differs"):
        C.compare_runs(runs_dir=out)
    # the finished run is rebuilt from the copy it kept, not from the edited file, nor from none
    assert _scores(finished) == scores
    config.unlink()
    assert _scores(finished) == scores
    assert json.loads((finished / runs.START / "config.json").read_text())["rms_norm_eps"] == 1e-6


@pytest.mark.parametrize("gone", ["moved", "deleted", "replaced"])
def test_eval_sample_and_export_rebuild_a_run_whose_start_is_gone(tmp_path, gone):
    """The run keeps its start's config.json and tokenizer.json (start/): its model is built from
    them and its own checkpoint, never from the start's weights, so eval, sample and export give
    the same numbers and text after the start folder is moved away, deleted, or replaced by
    another model (here a wider one, with the same tokenizer)."""
    from tiedlm.export import export_run

    start = save_start(tmp_path / "start", seed=0)
    run = train_from(start, tmp_path / "runs", "adapt", 0)
    scores, text = _scores(run), _sample(run)
    export_run(run, tmp_path / "export-before")
    tokenizer = (start / "tokenizer.json").read_bytes()
    if gone == "moved":
        start.rename(tmp_path / "elsewhere")
    else:
        shutil.rmtree(start)
    if gone == "replaced":
        save_start(start, seed=1, width=32)
    assert _scores(run) == scores and _sample(run) == text
    result = export_run(run, tmp_path / "export-after")
    assert result.verified
    for name in ("model.safetensors", "config.json", "tokenizer.json"):
        assert (tmp_path / "export-after" / name).read_bytes() == (tmp_path / "export-before" / name).read_bytes()
    assert sorted(p.name for p in (run / runs.START).iterdir()) == ["config.json", "tokenizer.json"]
    assert (run / runs.START / "tokenizer.json").read_bytes() == tokenizer


def test_a_start_whose_files_are_links_to_the_same_bytes_is_the_same_start(tmp_path):
    """A hub cache's snapshot links each file name to a blob named by its hash: the identity keys a
    weight file by the name the start's folder gives it, its content read through the link, so the
    same bytes behind a link are the same start (it was refused as changed, naming the blob)."""
    from tiedlm.model.hf_config import start_identity

    start = save_start(tmp_path / "start", seed=0)
    cfg = load_config(None, [f"model.init_from={start}", *TRAIN])
    before = start_identity(cfg.model)
    (tmp_path / "blobs").mkdir()
    shutil.move(start / "model.safetensors", tmp_path / "blobs" / "3f2a9c")
    (start / "model.safetensors").symlink_to(tmp_path / "blobs" / "3f2a9c")
    assert start_identity(cfg.model) == before and set(before["weights"]) == {"model.safetensors"}


def test_runs_of_different_start_files_or_none_are_variants_of_one_data_set(tmp_path):
    """Two config files (famA.json, famB.json), and tiedlm's own GPT-2 naming no file: different
    configs, so different variants, compared as such. A start splits runs only where one path held
    files of other content (it refused these as 'changed between runs', and the GPT-2 run as one
    that 'recorded none')."""
    import tiedlm.compare as C

    out, ident = tmp_path / "runs", {"fingerprint": "fp", "tokenizer": "tok"}
    for fam, content in (("famA", 1e-6), ("famB", 1e-5)):
        (tmp_path / f"{fam}.json").write_text(json.dumps({"model_type": "qwen2", "rms_norm_eps": content}))
        family = ["model.arch=hf", f"model.hf_config={tmp_path / f'{fam}.json'}", "model.bias=false"]
        for s in (0, 1):
            for tie, extra in (("tied", TIED_KEYS[0]), ("untied", TIED_KEYS[1])):
                run = make_run(out, f"{fam}-{tie}-s{s}", s, [extra, *family], val=57.0 + s, identity=ident)
                edit_report(run, start_identity={"config": f"sha256:{fam}"})
    for s in (0, 1):
        make_run(out, f"gpt2-untied-s{s}", s, [TIED_KEYS[1]], val=60.0 + s, identity=ident)
    result = C.compare_runs(runs_dir=out, baseline="gpt2-untied-s0")
    assert result.data_sets == 1 and not result.not_compared and len(result.variants) == 5


def test_the_copy_of_a_start_is_never_written_through_a_link(tmp_path):
    """start/ replaced by a link to another folder: keeping the start's files replaces the link
    with a folder of the run's own, and the other folder keeps its files."""
    from tiedlm.runs import keep_start

    other, run = tmp_path / "other", tmp_path / "run"
    other.mkdir()
    run.mkdir()
    (other / "config.json").write_text("mine")
    (run / "start").symlink_to(other)
    (tmp_path / "c.json").write_text('{"model_type": "qwen2"}')
    keep_start(run, {"config.json": tmp_path / "c.json"})
    assert (other / "config.json").read_text() == "mine" and not (run / "start").is_symlink()
    assert (run / "start" / "config.json").read_text() == '{"model_type": "qwen2"}'
