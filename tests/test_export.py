"""tiedlm export and tiedlm sample: the exported GPT2LMHeadModel computes tiedlm's logits for tied,
untied, bias-free, untie_at, padded, sqrt_d, projection and lowrank runs and every tokenizer kind; a tied export is tied
in transformers (one tensor); the exported tokenizer encodes text to tiedlm's ids; what GPT-2
cannot express is refused; sampling is deterministic for a seed and stops at end-of-text."""

import json

import pytest
from typer.testing import CliRunner

from tiedlm import runs
from tiedlm.cli import app
from tiedlm.config import load_config
from tiedlm.train import train_run

transformers = pytest.importorskip("transformers")  # the hf extra; installed with dev

BASE = ["data.path=builtin:synthetic", "data.synthetic.vocab_size=300", "data.synthetic.n_classes=12",
        "data.synthetic.train_tokens=8000", "data.synthetic.validation_tokens=2000", "data.synthetic.test_tokens=1000",
        "tokenizer.vocab_size=320", "model.n_layer=2", "model.n_head=2", "model.n_embd=32", "model.block_size=32",
        "train.batch_size=8", "train.max_steps=12", "train.eval_every=0", "train.lr=1e-2", "train.warmup_steps=2",
        "train.device=cpu", "train.threads=1", "eval.splits=[validation]"]
CASES = {
    "tied": [],
    "untied": ["model.tie_embeddings=false"],
    "no-bias": ["model.bias=false"],
    "untie-at": ["model.untie_at=0.5"],
    "padded": ["tokenizer.pad_to_multiple=64"],
    "sqrt-d-untied": ["model.tie_embeddings=false", "model.embed_scale=sqrt_d"],
    "byte": ["tokenizer.kind=byte"],
    "char": ["tokenizer.kind=char", "tokenizer.vocab_size=20"],
    "bpe": ["tokenizer.kind=bpe", "tokenizer.vocab_size=300"],
    "projection": ["model.tie_mode=projection"],
    "lowrank": ["model.tie_mode=lowrank", "model.untie_rank=4"],
    "lowrank-sqrt-d": ["model.tie_mode=lowrank", "model.untie_rank=32", "model.embed_scale=sqrt_d"],
}
TEXT = "the quick brown fox, 1984 — and <|endoftext|> maybe: zoo ba\nnext line"


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    root = tmp_path_factory.mktemp("runs")
    return {name: train_run(load_config(None, BASE + extra), out=root, name=name, progress=False)
            for name, extra in CASES.items()}


def hf_load(folder):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    return (AutoModelForCausalLM.from_pretrained(str(folder), local_files_only=True).float().eval(),
            AutoTokenizer.from_pretrained(str(folder), local_files_only=True))


@pytest.mark.parametrize("name", list(CASES))
def test_export_computes_tiedlms_logits_and_tokens(trained, tmp_path, name):
    import torch

    from tiedlm.evaluate import load_run_model
    from tiedlm.export import export_run, summary

    result = export_run(trained[name], tmp_path / "hf")
    assert result.verified and result.max_abs_diff <= 1e-5
    assert result.hf_perplexity == pytest.approx(result.tiedlm_perplexity, rel=1e-6)
    model, tok = hf_load(tmp_path / "hf")
    rm = load_run_model(trained[name])
    tied = rm.model.is_tied and rm.model.built_tie.stored_mode is None  # a projection or lowrank run is written untied
    assert result.tied == tied == json.loads((tmp_path / "hf" / "config.json").read_text())["tie_word_embeddings"]
    same = model.lm_head.weight.data_ptr() == model.transformer.wte.weight.data_ptr()
    assert same == tied  # one tensor exactly when the run was tied
    assert model.config.vocab_size == rm.data.model_vocab_size and model.config.n_positions == 32
    x = torch.randint(0, rm.data.vocab_size, (3, 32), generator=torch.Generator().manual_seed(0))
    with torch.inference_mode():
        diff = (model(input_ids=x).logits - rm.model.eval()(x)).abs().max().item()
    assert diff <= 1e-5, diff
    if rm.model.built_tie.stored_mode is not None:  # lm_head is the materialised W_out: E·P, or E + A·Bᵀ
        assert result.mode == rm.model.built_tie.stored_mode and "written untied" in summary(result)
        assert torch.allclose(model.lm_head.weight, rm.model.output_weight(), atol=1e-6)
        assert not torch.allclose(model.lm_head.weight, rm.model.transformer.wte.weight, atol=1e-4)  # it trained
    ours = rm.data.tokenizer.encode(TEXT)
    assert tok(TEXT, add_special_tokens=False)["input_ids"] == ours
    assert tok.eos_token_id == rm.data.tokenizer.eot_id


def test_a_pretrained_tokenizer_exports_too(trained, tmp_path):
    from tiedlm.export import export_run

    path = trained["bpe"] / runs.TOKENIZER / "tokenizer.json"
    cfg = load_config(None, BASE + ["tokenizer.kind=pretrained", f"tokenizer.path={path}",
                                    "tokenizer.eot_token=<|endoftext|>"])
    run = train_run(cfg, out=tmp_path, name="pre", progress=False)
    result = export_run(run, tmp_path / "hf")
    assert result.verified and result.max_abs_diff <= 1e-5
    _, tok = hf_load(tmp_path / "hf")
    from tiedlm.evaluate import load_run_model

    assert tok(TEXT, add_special_tokens=False)["input_ids"] == load_run_model(run).data.tokenizer.encode(TEXT)


@pytest.mark.parametrize("extra,message", [
    (["model.lm_head_bias=true"], "model.lm_head_bias"),
    (["model.embed_scale=sqrt_d"], "embed_scale: sqrt_d with a tied matrix"),
])
def test_what_gpt2_cannot_express_is_refused_exit_2(tmp_path, extra, message):
    run = train_run(load_config(None, BASE + extra), out=tmp_path, name="r", progress=False)
    r = CliRunner().invoke(app, ["export", str(run), "--out", str(tmp_path / "hf")])
    assert r.exit_code == 2 and message in r.stderr and len(r.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "hf").exists() and not [p for p in tmp_path.iterdir() if p.name.startswith(".hf")]


def test_export_cli_refuses_a_used_folder_and_exports_a_named_checkpoint(trained, tmp_path):
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("keep")
    r = CliRunner().invoke(app, ["export", str(trained["tied"]), "--out", str(tmp_path / "full")])
    assert r.exit_code == 2 and "not an empty folder" in r.stderr and (tmp_path / "full" / "x").read_text() == "keep"
    r = CliRunner().invoke(app, ["export", str(trained["tied"]), "--out", str(tmp_path / "a"), "--checkpoint", "step-9"])
    assert r.exit_code == 2 and "has no checkpoint 'step-9' (it has step-0000012)" in r.stderr
    r = CliRunner().invoke(app, ["export", str(trained["tied"]), "--out", str(tmp_path / "a"),
                                 "--checkpoint", "step-0000012"])
    assert r.exit_code == 0 and "max |logit difference| 0" in r.stdout


def test_export_without_transformers_writes_the_folder_and_says_how_to_check(trained, tmp_path, monkeypatch):
    import builtins

    real = builtins.__import__

    def no_transformers(name, *args, **kwargs):
        if name.split(".")[0] == "transformers":
            raise ImportError("no transformers")
        return real(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_transformers)
    from tiedlm.export import export_run, summary

    result = export_run(trained["untied"], tmp_path / "hf")
    assert not result.verified and "pip install 'tiedlm[hf]'" in summary(result)
    assert {p.name for p in (tmp_path / "hf").iterdir()} >= {"config.json", "model.safetensors", "tokenizer.json"}


# ------------------------------------------------------------------ sample


def test_sample_is_the_same_for_a_seed_and_differs_for_another(trained):
    outs = [CliRunner().invoke(app, ["sample", str(trained["untied"]), "--max-new-tokens", "20", "--seed", s,
                                     "--prompt", "the"]) for s in ("1", "1", "2")]
    assert all(r.exit_code == 0 for r in outs), outs[0].output
    assert outs[0].stdout == outs[1].stdout != outs[2].stdout
    assert outs[0].stdout.startswith("the")


def test_sample_stops_at_end_of_text_and_greedy_picks_the_top_token():
    import torch

    from tiedlm.generate import SampleOptions, generate_ids

    V, EOT = 10, 9

    class Scripted(torch.nn.Module):  # prefers token len(context) % 5, then <eot> once the context is 4 long
        def forward(self, x):
            logits = torch.zeros(1, x.shape[1], V)
            logits[0, -1, EOT if x.shape[1] >= 4 else x.shape[1] % 5] = 10.0
            return logits

    got = list(generate_ids(Scripted(), [0], SampleOptions(max_new_tokens=50, temperature=0), torch.Generator(),
                            block_size=8, eot_id=EOT, device="cpu"))
    assert got == [1, 2, 3]  # <eot> ends the sample and is not part of it
    capped = list(generate_ids(Scripted(), [0], SampleOptions(max_new_tokens=2, temperature=0), torch.Generator(),
                               block_size=8, eot_id=EOT, device="cpu"))
    assert capped == [1, 2]


def test_top_k_and_top_p_keep_only_the_most_likely_tokens():
    import torch

    from tiedlm.generate import SampleOptions, next_token

    logits = torch.log(torch.tensor([0.5, 0.3, 0.15, 0.05]))
    gen = torch.Generator().manual_seed(0)
    assert {next_token(logits, SampleOptions(top_k=2), gen) for _ in range(300)} == {0, 1}
    assert {next_token(logits, SampleOptions(top_p=0.7), gen) for _ in range(300)} == {0, 1}  # 0.5 + 0.3 >= 0.7
    assert {next_token(logits, SampleOptions(top_p=0.5), gen) for _ in range(300)} == {0}


def test_streaming_waits_for_whole_utf8_characters():
    from tiedlm.data.tokenizers import ByteTokenizer
    from tiedlm.generate import stream_text

    pieces = []
    ids = list("é€x".encode("utf-8"))
    assert stream_text(ByteTokenizer(), iter(ids), pieces.append) == ids
    assert pieces == ["é", "€", "x"]  # never half a character


def test_a_long_prompt_is_cut_from_the_left_with_a_note(trained):
    r = CliRunner().invoke(app, ["sample", str(trained["tied"]), "--prompt", " ".join(["zoo"] * 100),
                                 "--max-new-tokens", "3"])
    assert r.exit_code == 0 and "more than the block size (32): only its last 32" in r.stderr


@pytest.mark.parametrize("args,message", [(["--temperature", "-1"], "--temperature"), (["--top-p", "0"], "--top-p"),
                                          (["--max-new-tokens", "0"], "--max-new-tokens")])
def test_sample_option_errors_are_one_line_exit_2(trained, args, message):
    r = CliRunner().invoke(app, ["sample", str(trained["tied"]), *args])
    assert r.exit_code == 2 and message in r.stderr and len(r.stderr.strip().splitlines()) == 1


def test_sampling_never_yields_a_padding_id():
    import torch

    from tiedlm.generate import SampleOptions, generate_ids

    class PrefersPadding(torch.nn.Module):  # the padding rows (8, 9) would win without the mask
        def forward(self, x):
            logits = torch.zeros(1, x.shape[1], 10)
            logits[0, -1, 8:] = 50.0
            return logits

    got = list(generate_ids(PrefersPadding(), [0], SampleOptions(max_new_tokens=30, seed=0), torch.Generator(),
                            block_size=8, eot_id=7, device="cpu", vocab_size=8))
    assert got and all(t < 7 for t in got)


def test_export_writes_the_judged_weights_by_default_and_says_which(tiny, tmp_path, monkeypatch):
    """A run that kept its best weights exports them (what a comparison judged), naming the step;
    --checkpoint latest gives the last weights; a run that kept none exports its latest and says why."""
    from tiedlm.evaluate import kept_best

    monkeypatch.setenv("TIEDLM_CACHE", str(tmp_path / "cache"))
    run = train_run(tiny("train.keep_best=true", "train.eval_every=4", "train.lr=0.3"), out=tmp_path / "runs",
                    progress=False)
    best = kept_best(run)
    report = json.loads((run / runs.REPORT).read_text())
    assert best is not None and best == report["best"]["weights"].rsplit("/", 1)[-1]
    r = CliRunner().invoke(app, ["export", str(run), "--out", str(tmp_path / "judged")])
    assert r.exit_code == 0, r.output
    step = int(best.removeprefix("best-step-").split("-")[0])
    assert f"exported {best} " in r.stdout and f"the run's best validation evaluation, step {step:,}" in r.stdout
    r = CliRunner().invoke(app, ["export", str(run), "--out", str(tmp_path / "last"), "--checkpoint", "latest"])
    assert r.exit_code == 0 and f"exported step-{report['steps']:07d} " in r.stdout, r.output
    plain = train_run(tiny("train.keep_best=false"), out=tmp_path / "plain", progress=False)
    r = CliRunner().invoke(app, ["export", str(plain), "--out", str(tmp_path / "plain-export")])
    assert r.exit_code == 0 and "it kept no best weights (train.keep_best)" in r.stdout, r.output
