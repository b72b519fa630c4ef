"""Inputs that used to end in a traceback or a wrong answer: a temperature or top-p so small that the
distribution degenerates (greedy, never nan), a --seed beyond torch's range (one line, every
command that takes one), weights that are not finite (one line from sample, eval, analyze and
export), strict JSON from eval --json, a word-tokenizer continuation glued to its prompt, prompt
words the vocabulary lacks (a note), the run's train.threads in sample, eval and analyze, and one
damaged run among several given to analyze (the others are analysed)."""

import json
import shutil

import pytest
from typer.testing import CliRunner

from tiedlm.cli import app
from tiedlm.config import load_config
from tiedlm.files import sha256_file
from tiedlm.train import train_run

from .conftest import TINY

HUGE_SEED = str(2**64)


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """One tiny word-tokenizer run (conftest's TINY), trained once for the module, with its own cache."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TIEDLM_CACHE", str(tmp_path_factory.mktemp("cache")))
        mp.setenv("HF_DATASETS_OFFLINE", "1")
        return train_run(load_config(None, TINY + ["train.device=cpu"]), out=tmp_path_factory.mktemp("runs"),
                         name="word-s0", progress=False)


def invoke(*args):
    return CliRunner().invoke(app, [str(a) for a in args])


def copy_run(run, dest):
    shutil.copytree(run, dest)
    return dest


def rewrite_weights(run_dir, change):
    """Apply change(tensors) to the latest checkpoint's weights and recompute its manifest, so that
    the checkpoint verifies: what a run that diverged before writing it would hold."""
    from safetensors import safe_open
    from safetensors.torch import save_file

    from tiedlm.runs.checkpoints import MANIFEST, MODEL_FILE, latest_checkpoint

    ckpt = latest_checkpoint(run_dir)
    path = ckpt / MODEL_FILE
    with safe_open(str(path), "pt") as f:
        metadata = f.metadata()
        tensors = {k: f.get_tensor(k) for k in f.keys()}
    change(tensors)
    save_file(tensors, str(path), metadata=metadata)
    manifest = json.loads((ckpt / MANIFEST).read_text())
    manifest["files"][MODEL_FILE] = {"sha256": sha256_file(path), "bytes": path.stat().st_size}
    (ckpt / MANIFEST).write_text(json.dumps(manifest))
    return ckpt


def tokenizer_of(run_dir):
    from tiedlm.evaluate import load_run_model

    return load_run_model(run_dir).data.tokenizer


def strict_loads(text):
    def refuse(name):
        raise ValueError(f"not JSON: {name}")

    return json.loads(text, parse_constant=refuse)


# ------------------------------------------------------------------ 7: degenerate sampling


@pytest.mark.parametrize("args", [["--temperature", "1e-40"], ["--temperature", "1e-300"], ["--top-p", "1e-50"],
                                  ["--temperature", "5e-324", "--top-k", "3"]])
def test_a_degenerate_distribution_samples_greedily(run, args):
    greedy = invoke("sample", run, "--max-new-tokens", "12", "--temperature", "0", "--prompt", "w1")
    assert greedy.exit_code == 0, greedy.output
    r = invoke("sample", run, "--max-new-tokens", "12", "--prompt", "w1", *args)
    assert r.exit_code == 0, r.output
    assert r.stdout == greedy.stdout


def test_next_token_never_sees_nan():
    import torch

    from tiedlm.generate import SampleOptions, next_token

    logits = torch.tensor([1.0, 3.0, 2.999, -5.0, float("-inf")])
    gen = torch.Generator().manual_seed(0)
    for opts in (SampleOptions(temperature=1e-300), SampleOptions(temperature=1e-40, top_k=2),
                 SampleOptions(top_p=1e-50), SampleOptions(temperature=1e-45, top_p=1e-300)):
        assert {next_token(logits, opts, gen) for _ in range(20)} == {1}


# ------------------------------------------------------------------ 8: --seed


@pytest.mark.parametrize("command", ["sample", "analyze"])
@pytest.mark.parametrize("seed", [HUGE_SEED, "-1"])
def test_a_seed_out_of_range_is_one_line_exit_2(run, command, seed, tmp_path):
    r = invoke(command, run, "--seed", seed, *(["--out", tmp_path / "a"] if command == "analyze" else []))
    assert r.exit_code == 2, r.output
    assert len(r.stderr.strip().splitlines()) == 1 and "--seed" in r.stderr and "Traceback" not in r.output
    assert not (tmp_path / "a").exists()


def test_train_refuses_the_same_seed(tiny_yaml, tmp_path):
    r = invoke("train", "--config", tiny_yaml, "--seed", HUGE_SEED, "--out", tmp_path)
    assert r.exit_code == 2 and len(r.stderr.strip().splitlines()) == 1 and "--seed" in r.stderr


# ------------------------------------------------------------------ 9: weights that are not finite


@pytest.fixture(scope="module")
def nan_run(run, tmp_path_factory):
    dest = copy_run(run, tmp_path_factory.mktemp("nan") / "word-s0")
    rewrite_weights(dest, fill_first_block(float("nan")))
    return dest


def fill_first_block(value: float):
    """A rewrite_weights edit: the first tensor of block 0 filled with `value` (nan, inf)."""
    import torch

    def poison(tensors):
        name = sorted(k for k in tensors if k.startswith("transformer.h.0."))[0]
        tensors[name] = torch.full_like(tensors[name], value)

    return poison


@pytest.mark.parametrize("command", ["sample", "eval", "analyze", "export"])
def test_weights_that_are_not_finite_are_one_line_exit_1(nan_run, command, tmp_path):
    from tiedlm.runs.checkpoints import latest_checkpoint

    before = sorted(p.name for p in nan_run.rglob("*"))
    extra = {"export": ["--out", tmp_path / "hf"], "analyze": ["--out", tmp_path / "an"], "eval": ["--json"]}
    r = invoke(command, nan_run, *extra.get(command, []))
    assert r.exit_code == 1, r.output
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in r.output, r.output
    assert "not finite" in lines[0] and latest_checkpoint(nan_run).name in lines[0] and "nan in transformer.h.0" \
        in lines[0] and "train.lr" in lines[0], lines[0]
    assert "bug" not in lines[0]
    assert r.stdout == ""
    assert sorted(p.name for p in nan_run.rglob("*")) == before  # nothing on disk changed
    assert not (tmp_path / "hf").exists() and not (tmp_path / "an").exists()


@pytest.fixture(scope="module")
def nan_kept_best(tmp_path_factory):
    """A run that kept its best weights (train.keep_best), its latest checkpoint then poisoned."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TIEDLM_CACHE", str(tmp_path_factory.mktemp("cache")))
        mp.setenv("HF_DATASETS_OFFLINE", "1")
        run_dir = train_run(load_config(None, TINY + ["train.device=cpu", "train.keep_best=true"]),
                            out=tmp_path_factory.mktemp("kept"), name="kept-s0", progress=False)

    rewrite_weights(run_dir, fill_first_block(float("inf")))
    return run_dir


@pytest.mark.parametrize("command", ["sample", "eval", "analyze", "export"])
def test_the_fix_for_weights_that_are_not_finite_names_an_option_of_the_command(nan_kept_best, command, tmp_path):
    """eval reads the kept best weights with --best, export any checkpoint with --checkpoint (it
    writes the kept best ones by default: asked for the latest, it names them); sample and analyze
    read the latest checkpoint only, so their fix is to retrain."""
    from tiedlm.runs.checkpoints import best_weight_folders

    best = best_weight_folders(nan_kept_best)[0].name
    extra = {"export": ["--out", tmp_path / "hf", "--checkpoint", "latest"], "analyze": ["--out", tmp_path / "an"]}
    r = invoke(command, nan_kept_best, *extra.get(command, []))
    assert r.exit_code == 1, r.output
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "not finite (inf in transformer.h.0" in lines[0], r.output
    fix = lines[0].split("written; ", 1)[1]
    if command == "eval":
        assert fix == f"score the weights it kept at its best evaluation ({best}) with --best, or retrain with a " \
                      "lower train.lr"
        followed = invoke("eval", nan_kept_best, "--best", "--json")
        assert followed.exit_code == 0, followed.output
    elif command == "export":
        assert fix == f"choose other weights of the run with --checkpoint (it has {best}), or retrain with a lower " \
                      "train.lr"
        followed = invoke("export", nan_kept_best, "--out", tmp_path / "hf2", "--checkpoint", best)
        assert followed.exit_code == 0, followed.output
        judged = invoke("export", nan_kept_best, "--out", tmp_path / "hf3")  # the default: the kept best weights
        assert judged.exit_code == 0 and f"exported {best} " in judged.stdout, judged.output
    else:
        assert fix == "retrain it with a lower train.lr"
    assert "best-step-N" not in lines[0]


def test_eval_json_is_strict_even_when_the_perplexity_overflows(run, tmp_path):
    dest = copy_run(run, tmp_path / "word-s0")

    def scale(tensors):  # finite weights whose logits are huge: a loss beyond 700 nats, perplexity inf
        for k in tensors:
            if k.endswith("wte.weight") or k.endswith("lm_head.weight"):
                tensors[k] = tensors[k] * 1e5

    rewrite_weights(dest, scale)
    r = invoke("eval", dest, "--json")
    assert r.exit_code == 0, r.output
    results = strict_loads(r.stdout)
    assert results["validation"]["loss"] > 700 and results["validation"]["perplexity"] is None
    plain = invoke("eval", run, "--json")
    assert plain.exit_code == 0 and strict_loads(plain.stdout)["validation"]["perplexity"] > 1


def test_strict_json_maps_non_finite_numbers_to_null():
    import numpy as np

    from tiedlm.files import strict_json

    got = strict_json({"a": float("inf"), "b": [float("nan"), np.float32(2.0), np.int64(3)], "c": "x", "d": None})
    assert json.dumps(got, allow_nan=False) == '{"a": null, "b": [null, 2.0, 3], "c": "x", "d": null}'


# ------------------------------------------------------------------ 11: the continuation and the prompt


def test_a_word_continuation_is_separated_from_the_prompt(run):
    tok = tokenizer_of(run)
    words = [tok.decode([i]) for i in range(tok.vocab_size) if i not in (tok.eot_id, tok.unk_id)][:2]
    prompt = " ".join(words)
    r = invoke("sample", run, "--prompt", prompt, "--max-new-tokens", "6", "--temperature", "0")
    assert r.exit_code == 0, r.output
    text = r.stdout.rstrip("\n")
    assert text.startswith(prompt + " ") and len(text) > len(prompt) + 1, text  # not glued: "w1 w2w7"
    vocab = {tok.decode([i]) for i in range(tok.vocab_size)}
    assert all(w in vocab for w in text.split()), text
    assert r.stderr == ""  # every prompt word is known: no note
    spaced = invoke("sample", run, "--prompt", prompt + "\n", "--max-new-tokens", "6", "--temperature", "0")
    assert spaced.stdout == prompt + "\n" + text[len(prompt) + 1:] + "\n"  # the user's whitespace, not two


def test_unknown_prompt_words_are_named_once(run):
    tok = tokenizer_of(run)
    known = tok.decode([[i for i in range(tok.vocab_size) if i not in (tok.eot_id, tok.unk_id)][0]])
    r = invoke("sample", run, "--prompt", f"zzqx {known} zzqx qqv", "--max-new-tokens", "3", "--num-samples", "2")
    assert r.exit_code == 0, r.output
    notes = [line for line in r.stderr.splitlines() if line.startswith("note:")]
    assert len(notes) == 1 and "'zzqx', 'qqv'" in notes[0] and "<unk>" in notes[0], r.stderr
    assert known not in notes[0]


def test_the_unknown_words_note_agrees_in_number():
    from tiedlm.generate import _unknown_note

    tok = _word()
    assert _unknown_note(tok, "the zebra said") == ("the prompt's word 'zebra' is not in the run's vocabulary: "
                                                    "the model sees <unk> for it")
    assert _unknown_note(tok, "the zebra okapi") == ("the prompt's words 'zebra', 'okapi' are not in the run's "
                                                     "vocabulary: the model sees <unk> for them")
    assert _unknown_note(tok, "the king") is None


def _bpe():
    from tiedlm.data.tokenizers import _train_bpe

    return _train_bpe(iter([["the king said hello, héllo — the queen said hi\n"] * 20]), 280)


def _word():
    from tiedlm.data.tokenizers import _train_word

    return _train_word(iter([["the king said hello the queen said hi"]]), 20)


@pytest.mark.parametrize("make", ["byte", "char", "word", "bpe"])
def test_the_continuation_is_decoded_with_the_prompt_for_every_tokenizer_kind(make):
    from tiedlm.data.tokenizers import ByteTokenizer, CharTokenizer
    from tiedlm.generate import stream_text, unknown_pieces

    tok = {"byte": ByteTokenizer, "char": lambda: CharTokenizer(list("the kingsadloqu ,")), "word": _word,
           "bpe": _bpe}[make]()
    prompt, more = "the king", " said hello the queen"
    prompt_ids, new = tok.encode(prompt), tok.encode(more)  # a continuation the model might generate
    pieces = []
    assert stream_text(tok, iter(new), pieces.append, prefix=prompt_ids, written=prompt) == new
    assert prompt + "".join(pieces) == tok.decode(prompt_ids + new) == prompt + more
    assert unknown_pieces(tok, "the kingx zebra") == {"byte": [], "char": ["x", "z", "b", "r"],
                                                       "word": ["kingx", "zebra"], "bpe": []}[make]


# ------------------------------------------------------------------ 15: threads, and several runs to analyse


@pytest.mark.parametrize("command", ["sample", "eval", "analyze"])
def test_the_run_s_threads_are_used(run, command, monkeypatch, tmp_path):
    import torch

    calls = []
    monkeypatch.setattr(torch, "set_num_threads", calls.append)
    extra = {"sample": ["--max-new-tokens", "3"], "analyze": ["--out", tmp_path / "a"]}.get(command, [])
    r = invoke(command, run, *extra)
    assert r.exit_code == 0, r.output
    assert calls and calls[0] == 1, calls  # TINY's train.threads


def test_one_damaged_run_does_not_stop_the_others_from_being_analysed(run, tmp_path):
    runs = [copy_run(run, tmp_path / "runs" / name) for name in ("a-s0", "b-s0", "c-s0")]
    (runs[1] / "report.json").write_text("{not json")
    dest = tmp_path / "out"
    r = invoke("analyze", *runs, "--out", dest)
    assert r.exit_code == 1, r.output
    assert (dest / "a-s0" / "analysis.json").exists() and (dest / "c-s0" / "analysis.json").exists()
    assert not (dest / "b-s0").exists()
    assert [line.split()[0] for line in r.stdout.splitlines()] == ["a-s0", "c-s0"]
    errors = r.stderr.strip().splitlines()
    assert len(errors) == 1 and "b-s0" in errors[0] and "report.json" in errors[0] and "a-s0" not in errors[0]
    as_json = invoke("analyze", *runs, "--out", tmp_path / "out2", "--json")
    assert as_json.exit_code == 1 and [a["run"] for a in strict_loads(as_json.stdout)] == ["a-s0", "c-s0"]
