"""A pretrained start (model.init_from), offline: tiny models trained here and exported (a transformers
family through arch: hf, and tiedlm's own GPT-2 block) are started from, tied and untied. The
checkpoint's weights arrive exactly (the same logits as transformers' own load); its tie is kept,
untied by copy, or tied from E, W_out or their mean; the size and the tokenizer come from the
checkpoint; train.trainable freezes the rest; a resume is bit for bit; the adapted run exports and
reloads with its own tie; and what cannot be done is refused in one line."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from tests.conftest import ROOT
from tiedlm.runs import checkpoints
from tiedlm.config import load_config
from tiedlm.errors import ConfigError
from tiedlm.model.blocks import build_model

pytest.importorskip("transformers")

DATA = ["data.synthetic.train_tokens=4000", "data.synthetic.validation_tokens=600", "data.synthetic.test_tokens=600",
        "data.synthetic.seed=3", "train.max_steps=2", "train.warmup_steps=1", "train.batch_size=4",
        "train.eval_every=0", "train.device=cpu", "train.threads=1"]


def _pretrain(tmp: Path, name: str, *extra: str) -> Path:
    """A tiny model trained on base.yaml's synthetic language and exported: its folder."""
    from tiedlm.export import export_run
    from tiedlm.train import train_run

    cfg = load_config(ROOT / "configs" / "base.yaml",
                      ["model.n_layer=1", "model.n_embd=32", "model.n_head=2", "model.block_size=16",
                       "tokenizer.vocab_size=128", "train.max_steps=3", "train.warmup_steps=1", "train.batch_size=4",
                       "train.eval_every=0", "data.synthetic.train_tokens=4000",
                       "data.synthetic.validation_tokens=600", "data.synthetic.test_tokens=600", "train.device=cpu",
                       *extra])
    run = train_run(cfg, out=tmp / f"runs-{name}", progress=False)
    assert export_run(run, tmp / name).verified
    return tmp / name


@pytest.fixture(scope="module")
def exports(tmp_path_factory):
    import os

    tmp = tmp_path_factory.mktemp("pretrained")
    old = os.environ.get("TIEDLM_CACHE")
    os.environ["TIEDLM_CACHE"] = str(tmp / "cache")
    try:
        yield {"qwen2-tied": _pretrain(tmp, "qwen2-tied", "model.arch=hf", "model.hf_config=qwen2"),
               "qwen2-untied": _pretrain(tmp, "qwen2-untied", "model.arch=hf", "model.hf_config=qwen2",
                                         "model.tie_embeddings=false"),
               "gpt2-tied": _pretrain(tmp, "gpt2-tied")}
    finally:
        if old is None:
            os.environ.pop("TIEDLM_CACHE", None)
        else:
            os.environ["TIEDLM_CACHE"] = old


def start(folder: Path, *extra: str):
    return load_config(None, [f"model.init_from={folder}", *DATA, *extra])


def _transformers_model(folder: Path):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32).eval()


@pytest.mark.parametrize("name", ["qwen2-tied", "qwen2-untied", "gpt2-tied"])
def test_the_checkpoint_arrives_exactly_with_its_size_and_tokenizer(exports, name):
    folder = exports[name]
    cfg = start(folder)  # tie_embeddings unset: tiedlm's default, tied
    saved = json.loads((folder / "config.json").read_text())
    assert cfg.model.arch == "hf" and cfg.model.n_embd == 32 and cfg.model.n_layer == 1
    assert cfg.model.vocab_size == saved["vocab_size"]
    assert cfg.tokenizer.kind == "pretrained" and Path(cfg.tokenizer.path) == folder.resolve() / "tokenizer.json"
    for tie in (True, False):
        model = build_model(start(folder, f"model.tie_embeddings={str(tie).lower()}").model, 128).eval()
        model.check_tie(tie)
        theirs = _transformers_model(folder)
        x = torch.randint(0, cfg.model.vocab_size, (2, 16))
        with torch.no_grad():
            ours, ref = model(x), theirs(input_ids=x).logits
        was_tied = name.endswith("-tied")
        if was_tied or not tie:  # kept, or untied by copy: the checkpoint's function exactly
            assert torch.equal(ours, ref)
            assert torch.equal(model.get_output_embeddings().weight, theirs.get_output_embeddings().weight)
        assert model.start["checkpoint_tied"] is was_tied


def test_untie_by_copy_starts_w_out_as_e_and_trains_it_apart(exports, tmp_path, monkeypatch):
    from tiedlm.train import train_run

    monkeypatch.setenv("TIEDLM_CACHE", str(tmp_path / "cache"))
    cfg = start(exports["qwen2-tied"], "model.tie_embeddings=false")
    model = build_model(cfg.model, 128)
    assert not model.is_tied and torch.equal(model.get_output_embeddings().weight, model.get_input_embeddings().weight)
    run = train_run(cfg, out=tmp_path / "runs", progress=False)
    report = json.loads((run / "report.json").read_text())
    assert report["params"]["start"] == {"init_from": str(exports["qwen2-tied"]), "checkpoint_tied": True,
                                         "start": "untied by copy: W_out starts as a copy of E"}
    weights = load_file(str(checkpoints.latest_checkpoint(run) / checkpoints.MODEL_FILE))
    E, W = weights["hf.model.embed_tokens.weight"], weights["hf.lm_head.weight"]
    assert not torch.equal(E, W)  # two matrices, each trained on its own


@pytest.mark.parametrize("tie_from", ["e", "w_out", "mean"])
def test_an_untied_checkpoint_is_tied_from_e_w_out_or_their_mean(exports, tie_from):
    folder = exports["qwen2-untied"]
    theirs = _transformers_model(folder)
    E, W = theirs.get_input_embeddings().weight, theirs.get_output_embeddings().weight
    assert not torch.equal(E, W)
    expected = {"e": E, "w_out": W, "mean": (E + W) / 2}[tie_from]
    model = build_model(start(folder, f"model.tie_from={tie_from}").model, 128)
    model.check_tie(True)
    assert torch.equal(model.get_input_embeddings().weight, expected)
    assert model.start["start"].startswith({"e": "tied from E", "w_out": "tied from W_out",
                                            "mean": "tied from the mean"}[tie_from])


@pytest.mark.parametrize("trainable, moved", [("head", {"hf.lm_head.weight"}),
                                              ("embeddings", {"hf.lm_head.weight", "hf.model.embed_tokens.weight"})])
def test_trainable_freezes_the_rest(exports, tmp_path, monkeypatch, trainable, moved):
    from tiedlm.train import train_run

    monkeypatch.setenv("TIEDLM_CACHE", str(tmp_path / "cache"))
    cfg = start(exports["qwen2-untied"], "model.tie_embeddings=false", f"train.trainable={trainable}")
    before = {f"hf.{k}": v for k, v in _transformers_model(exports["qwen2-untied"]).state_dict().items()}
    run = train_run(cfg, out=tmp_path / "runs", progress=False)
    after = load_file(str(checkpoints.latest_checkpoint(run) / checkpoints.MODEL_FILE))
    changed = {k for k in after if not torch.equal(after[k], before[k])}
    assert changed == moved
    report = json.loads((run / "report.json").read_text())
    assert report["params"]["trainable"] == sum(after[k].numel() for k in moved)


def test_a_pretrained_start_resumes_bit_for_bit_and_exports_with_its_tie(exports, tmp_path, monkeypatch):
    from tests.test_hf_arch import _exports_and_reloads, resumes_bit_for_bit

    monkeypatch.setenv("TIEDLM_CACHE", str(tmp_path / "cache"))
    cfg = start(exports["gpt2-tied"], "model.tie_embeddings=false", "train.max_steps=6", "train.checkpoint_every=2")
    run, _ = resumes_bit_for_bit(cfg, tmp_path)
    _exports_and_reloads(run, tmp_path / "export", tied=False)


@pytest.mark.parametrize("extra, message", [
    (["model.n_embd=64"], "model.n_embd is 64, but the checkpoint in .* has 32 — remove model.n_embd"),
    (["model.block_size=64"], "model.block_size is 64, but the checkpoint in .* holds positions up to 16"),
    (["model.hf_config=llama"], "model.hf_config is 'llama', but model.init_from gives the family"),
    (["model.arch=gpt2"], (r"model.arch is 'gpt2', but model.init_from builds the checkpoint's own family \(model.arch: "
                           r"hf\) — remove model.arch, or set it to hf \(--set model.arch=hf\)")),  # was overridden
    (["model.tie_mode=projection"], "model.tie_mode projection and model.untie_at are not built for it"),
    (["model.untie_at=0.5"], "model.untie_at are not built for it"),
    (["model.tie_from=both"], "model.tie_from must be one of e, w_out, mean"),
])
def test_what_a_pretrained_start_cannot_take_is_refused_in_one_line(exports, extra, message):
    with pytest.raises(ConfigError, match=message) as info:
        start(exports["qwen2-tied"], *extra)
    assert "\n" not in str(info.value) and info.value.exit_code == 2
    assert start(exports["qwen2-tied"], "model.arch=hf").model.arch == "hf"  # the fix, as the message types it


def test_a_missing_folder_tokenizer_or_hub_id_offline_is_one_line(exports, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    for name, message in ((str(tmp_path / "nowhere"), "no such model folder"),
                          ("someone/some-model", "not a local folder, and the hub could not give it .*"
                                                 "huggingface-cli download someone/some-model")):
        with pytest.raises(ConfigError, match=message):
            start(Path(name))
    bare = tmp_path / "bare"
    bare.mkdir()
    (bare / "config.json").write_text((exports["qwen2-tied"] / "config.json").read_text())
    with pytest.raises(ConfigError, match="the folder has a config.json but no weights"):
        start(bare)
    (bare / "model.safetensors").write_bytes((exports["qwen2-tied"] / "model.safetensors").read_bytes())
    with pytest.raises(ConfigError, match="the folder has no tokenizer.json"):
        start(bare)
    with pytest.raises(ConfigError, match="model.tie_from applies to a pretrained start"):
        load_config(None, ["model.tie_from=mean", "train.max_steps=2"])
    with pytest.raises(ConfigError, match="train.trainable head with model.untie_at"):
        load_config(None, ["train.trainable=head", "model.untie_at=0.5", "train.max_steps=2"])


def test_eval_also_scores_the_old_domain_before_and_after(exports, tmp_path, monkeypatch):
    """The start's score on eval.also's test split is the pretrained run's own final test score
    (the same tokens, the same weights), and the adapted run's last and kept best weights are scored
    on it too."""
    from tiedlm.train import train_run

    monkeypatch.setenv("TIEDLM_CACHE", str(tmp_path / "cache"))
    old = {"path": "builtin:synthetic", "synthetic": {"vocab_size": 4096, "n_classes": 64, "successors": 4, "zipf": 1.1,
                                                      "train_tokens": 4000, "validation_tokens": 600,
                                                      "test_tokens": 600, "seed": 0}}
    cfg = start(exports["qwen2-tied"], "train.max_steps=4", "train.eval_every=2", "train.keep_best=true",
                "eval.also=" + json.dumps(old))
    run = train_run(cfg, out=tmp_path / "runs", progress=False)
    also = json.loads((run / "report.json").read_text())["also"]
    pretrained = json.loads(next((exports["qwen2-tied"].parent / "runs-qwen2-tied").glob("*/report.json")).read_text())
    assert also["split"] == "test" and also["data"] == "builtin:synthetic"
    assert also["before"]["tokens"] == pretrained["final"]["test"]["tokens"]
    assert also["before"]["loss"] == pytest.approx(pretrained["final"]["test"]["loss"], rel=1e-6)
    assert also["after"]["loss"] != also["before"]["loss"] and "after_best" in also
    md = (run / "report.md").read_text()
    assert f"Started from **{exports['qwen2-tied']}** (a tied checkpoint): kept tied." in md
    assert f"Also scored (eval.also), builtin:synthetic, test perplexity: before {also['before']['perplexity']:.2f}" in md


@pytest.mark.parametrize("also, message", [
    ("[1, 2]", "eval.also must be"),
    ('{"carve": "sideways"}', "eval.also: data.carve must be random or contiguous"),
])
def test_eval_also_that_cannot_be_read_is_refused_in_one_line(exports, also, message):
    with pytest.raises(ConfigError, match=message) as info:
        start(exports["qwen2-tied"], f"eval.also={also}")
    assert "\n" not in str(info.value)
    with pytest.raises(ConfigError, match="tokenizer.kind is word"):
        load_config(ROOT / "configs" / "base.yaml", ['eval.also={"path": "builtin:shakespeare"}'])


@pytest.mark.parametrize("tie", ["true", "false"])
def test_new_tokens_get_rows_at_the_old_rows_mean_and_a_bucket_of_their_own(exports, tmp_path, monkeypatch, tie):
    """tokenizer.add_tokens: N adds the N most frequent words the tokenizer splits (as " word"); the
    model grows rows for them, E's (and W_out's, untied) new rows start at the old rows' mean, the
    old rows are the checkpoint's, and the final evaluation gives the new tokens' loss."""
    from tiedlm.data import prepare_data
    from tiedlm.train import train_run

    monkeypatch.setenv("TIEDLM_CACHE", str(tmp_path / "cache"))
    folder = exports["qwen2-untied"]
    cfg = start(folder, f"model.tie_embeddings={tie}", "tokenizer.add_tokens=3", "data.synthetic.vocab_size=300")
    data = prepare_data(cfg, progress=False)
    tok = data.tokenizer
    old = json.loads((folder / "config.json").read_text())["vocab_size"]
    assert len(tok.added) == 3  # the words the word-level tokenizer read as <unk>, as its pre-tokenizer cuts them
    assert tok.added_ids == list(range(old, old + 3)) and data.model_vocab_size == old + 3
    assert all(len(tok.encode_batch([t])[0]) == 1 for t in tok.added)  # each one token now
    run = train_run(cfg, out=tmp_path / "runs", progress=False)
    report = json.loads((run / "report.json").read_text())
    assert report["params"]["wte"] == (old + 3) * 32
    new = report["final"]["test"]["new_tokens"]
    assert new["types"] == 3 and new["tokens"] > 0 and new["loss"] > 0

    from tiedlm.model.blocks import init_new_rows

    model = build_model(cfg.model, data.model_vocab_size)
    init_new_rows(model, tok.added_ids)
    theirs = _transformers_model(folder)
    for mine, saved in ((model.get_input_embeddings().weight, theirs.get_input_embeddings().weight),
                        (model.get_output_embeddings().weight, theirs.get_output_embeddings().weight)):
        if tie == "true" and saved is theirs.get_output_embeddings().weight:
            saved = theirs.get_input_embeddings().weight  # tied from E, the default
        assert torch.equal(mine[:old], saved)  # the checkpoint's rows untouched
        assert torch.allclose(mine[old:], saved.mean(0).expand(3, -1), atol=1e-5)


def test_new_tokens_that_the_tokenizer_has_are_refused(exports, tmp_path, monkeypatch):
    from tiedlm.data import prepare_data

    monkeypatch.setenv("TIEDLM_CACHE", str(tmp_path / "cache"))
    from tokenizers import Tokenizer

    known = Tokenizer.from_file(str(exports["qwen2-tied"] / "tokenizer.json")).id_to_token(5)
    with pytest.raises(ConfigError, match=f"{known!r} is already a token of the tokenizer"):
        prepare_data(start(exports["qwen2-tied"], f"tokenizer.add_tokens=[{known}]"), progress=False)
    with pytest.raises(ConfigError, match="tokenizer.add_tokens adds to a pretrained tokenizer"):
        load_config(ROOT / "configs" / "base.yaml", ["tokenizer.add_tokens=4"])


def test_eval_also_is_encoded_with_the_run_s_own_new_tokens(exports, tmp_path, monkeypatch):
    """tokenizer.add_tokens: N picks the words from the run's training text; eval.also's data is
    encoded by that same tokenizer (the same new tokens at the same ids), not one picked from it."""
    from tiedlm.config import also_config
    from tiedlm.data import prepare_data
    from tiedlm.train.old_domain import prepare_also
    from tiedlm.distributed import Dist

    monkeypatch.setenv("TIEDLM_CACHE", str(tmp_path / "cache"))
    cfg = start(exports["qwen2-tied"], "tokenizer.add_tokens=3", "data.synthetic.vocab_size=300",
                'eval.also={"path": "builtin:synthetic", "synthetic": {"vocab_size": 500, "seed": 7, '
                '"train_tokens": 4000, "validation_tokens": 600, "test_tokens": 600}}')
    data = prepare_data(cfg, progress=False)
    also = prepare_also(cfg, data, Dist(), progress=False)
    assert also.tokenizer.added == data.tokenizer.added and also.tokenizer.added_ids == data.tokenizer.added_ids
    picked_there = prepare_data(also_config(cfg), progress=False).tokenizer.added
    assert picked_there != data.tokenizer.added  # what the other text alone would have picked


def test_a_comparison_of_an_adaptation_tabulates_the_start_the_old_domain_and_the_new_tokens(exports, tmp_path,
                                                                                              monkeypatch):
    from tiedlm.compare import compare_runs
    from tiedlm.train import train_run

    monkeypatch.setenv("TIEDLM_CACHE", str(tmp_path / "cache"))
    old = {"path": "builtin:synthetic", "synthetic": {"vocab_size": 4096, "n_classes": 64, "train_tokens": 4000,
                                                      "validation_tokens": 600, "test_tokens": 600}}
    runs = []
    for tie in ("true", "false"):
        for seed in (0, 1):
            cfg = load_config(None, [f"model.init_from={exports['qwen2-tied']}", *DATA, f"model.tie_embeddings={tie}",
                                     "tokenizer.add_tokens=2", "data.synthetic.vocab_size=300",
                                     "eval.also=" + json.dumps(old)], seed=seed)
            runs.append(train_run(cfg, out=tmp_path / f"runs-{tie}", progress=False))
    c = compare_runs([str(r) for r in runs], out=tmp_path / "cmp")
    rows = {a.variant: a for a in c.adaptation}
    assert set(rows) == {v.label for v in c.variants} and len(rows) == 2
    untied = next(a for a in c.adaptation if a.start.startswith("untied by copy"))
    tied = next(a for a in c.adaptation if a.start == "kept tied")
    reports = [json.loads((r / "report.json").read_text()) for r in runs]
    befores = [r["also"]["before"]["loss"] for r in reports if r["params"]["start"]["start"] == "kept tied"]
    assert tied.old_before == pytest.approx(math.exp(sum(befores) / 2))
    assert tied.seeds == untied.seeds == 2 and tied.new_tokens_loss > 0 and 0 < tied.new_tokens_share < 1
    md = (tmp_path / "cmp" / "comparison.md").read_text()
    assert "## The pretrained start, the old domain and the new tokens" in md and "untied by copy" in md
    from tiedlm.compare.report import format_terminal_table

    said = [line for line in format_terminal_table(c).splitlines() if line.startswith("Adaptation: ")]
    assert len(said) == 2  # the terminal says what each variant forgot and gained, as comparison.md does
    line = next(x for x in said if x.startswith(f"Adaptation: {tied.variant} (kept tied)"))
    assert f"the old domain's test perplexity {tied.old_before:,.2f} → {tied.old_after:,.2f}" in line
    assert f"the new tokens' loss {tied.new_tokens_loss:.3f} nats on {c.primary}" in line and "(mean over 2 seeds)" in line


def test_a_pretrained_start_may_use_a_shorter_context_and_its_own_tokenizer_keys(exports):
    cfg = start(exports["qwen2-tied"], "model.block_size=8", "tokenizer.eot_token=<eot>")
    assert cfg.model.block_size == 8 and cfg.tokenizer.kind == "pretrained" and cfg.tokenizer.eot_token == "<eot>"
    assert start(exports["qwen2-tied"]).model.block_size == 16  # the checkpoint's longest by default


def test_a_checkpoint_missing_weights_is_refused_rather_than_filled_at_random(exports, tmp_path):
    from safetensors.torch import load_file, save_file

    folder = tmp_path / "partial"
    folder.mkdir()
    for f in exports["qwen2-untied"].iterdir():
        (folder / f.name).write_bytes(f.read_bytes())
    tensors = load_file(str(folder / "model.safetensors"))
    del tensors["lm_head.weight"]
    save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(ConfigError, match="the checkpoint's weights lack 1 of the model's \\(lm_head.weight\\)"):
        build_model(start(folder, "model.tie_embeddings=false").model, 128)


def test_a_checkpoint_with_a_nan_or_a_truncated_file_is_refused_before_training(exports, tmp_path):
    """Not "training diverged at step 1 … lower train.lr": the start is what is wrong, said before training."""
    from safetensors.torch import load_file, save_file

    nan, cut = tmp_path / "nan", tmp_path / "cut"
    for folder in (nan, cut):
        folder.mkdir()
        for f in exports["qwen2-untied"].iterdir():
            (folder / f.name).write_bytes(f.read_bytes())
    tensors = load_file(str(nan / "model.safetensors"))
    tensors["lm_head.weight"][3, 5] = float("nan")
    save_file(tensors, str(nan / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(ConfigError, match=r"weights are not finite \(1 NaN or infinite value\(s\) in lm_head.weight\)"):
        build_model(start(nan, "model.tie_embeddings=false").model, 128)
    data = (cut / "model.safetensors").read_bytes()
    (cut / "model.safetensors").write_bytes(data[: len(data) // 2])
    with pytest.raises(ConfigError, match="its weights do not load .* the folder is damaged"):
        build_model(start(cut, "model.tie_embeddings=false").model, 128)


def test_new_words_are_counted_as_the_pre_tokenizer_cuts_them():
    """A byte-level BPE cuts " GLOUCESTER" only after a space: a name that always opens a line is
    counted without one, and the piece added is the one the text holds; a word it already holds
    whole (" the") is not added; an added " king" is one token, and the text decodes as it was
    (inside " kingdom" it is matched too, as a BPE piece would be)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    from tiedlm.data.tokenizers import HFTokenizer, frequent_split_words

    text = ["GLOUCESTER: the king\nGLOUCESTER: the queen and the prince there\n" * 50]
    rust = Tokenizer(models.BPE())
    rust.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    rust.decoder = decoders.ByteLevel()
    rust.train_from_iterator(text, trainers.BpeTrainer(vocab_size=260, special_tokens=["<|endoftext|>"],
                                                       initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                                       show_progress=False))
    tok = HFTokenizer("pretrained", rust, "<|endoftext|>")
    assert tok.pieces_of(" the") == 1
    words = frequent_split_words(tok, iter([text]), 3)
    assert "GLOUCESTER" in words and " GLOUCESTER" not in words and " the" not in words and " king" in words
    grown = tok.with_added(words)
    king = grown.added_ids[words.index(" king")]
    for text in ("the king sleeps", "the kingdom", "king"):
        ids = grown.encode_batch([text])[0].tolist()
        assert grown.decode(ids) == text and (king in ids) is (" king" in text)


def test_a_tokenizer_with_more_ids_than_the_checkpoint_s_vocabulary_is_refused_in_one_line(exports):
    from tiedlm.data import model_vocab_size

    cfg = start(exports["qwen2-tied"])
    V = cfg.model.vocab_size
    assert model_vocab_size(cfg, V) == V and model_vocab_size(cfg, V - 3) == V  # fewer ids fit the checkpoint's rows
    with pytest.raises(ConfigError, match=f"the tokenizer has {V + 5:,} ids but the model's vocabulary is {V:,}") as info:
        model_vocab_size(cfg, V + 5)
    assert "\n" not in str(info.value)
