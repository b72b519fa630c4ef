"""analyze, sample and tensorboard on model.arch: llama runs, trained through the CLI: the direct
path goes through the final RMSNorm (checked against an RMSNorm written out here in float64, and
against the LayerNorm it must not be), the GPT-2 path keeps its LayerNorm formula, sampling gives
the requested number of tokens and the same text for a seed, and the event files hold what
metrics.jsonl and report.json hold."""

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from typer.testing import CliRunner

from tiedlm.analyze import geometry as g
from tiedlm import runs
from tiedlm.cli import app
from tiedlm.trackers.tensorboard import TB

# d 32, 2 layers, 4 query heads over 2 key/value heads, 30 steps: about two seconds a run on a core.
# block_size 16 is below the sample length, so sampling slides its context window.
BASE = ["data.path=builtin:synthetic", "data.synthetic.vocab_size=200", "data.synthetic.n_classes=10",
        "data.synthetic.train_tokens=8000", "data.synthetic.validation_tokens=2000",
        "data.synthetic.test_tokens=2000", "tokenizer.kind=word", "tokenizer.vocab_size=512",
        "model.n_layer=2", "model.n_head=4", "model.n_embd=32", "model.block_size=16", "train.batch_size=8",
        "train.max_steps=30", "train.log_every=5", "train.eval_every=10", "train.eval_tokens=1000",
        "train.lr=2e-2", "train.warmup_steps=3", "train.checkpoint_every=10", "train.device=cpu",
        "train.threads=1", "eval.batch_size=16"]
LLAMA = ["model.arch=llama", "model.n_kv_head=2"]
RUNS = {  # name -> overrides: tied with TensorBoard; untied with a head bias and sqrt(d) input scale; GPT-2
    "llama-tied": LLAMA + ["model.tie_embeddings=true", "train.log_to=[tensorboard]"],
    "llama-untied": LLAMA + ["model.tie_embeddings=false", "model.lm_head_bias=true", "model.embed_scale=sqrt_d"],
    "gpt2-untied": ["model.tie_embeddings=false", "model.lm_head_bias=true"],
}


def invoke(*args):
    return CliRunner().invoke(app, [str(a) for a in args])


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """The runs of RUNS, each trained by `tiedlm train`."""
    root = tmp_path_factory.mktemp("runs")
    config = root / "tiny.yaml"
    config.write_text("name: tiny\n")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TIEDLM_CACHE", str(tmp_path_factory.mktemp("cache")))
        for name, extra in RUNS.items():
            sets = [a for s in BASE + extra for a in ("--set", s)]
            r = invoke("train", "-c", config, "--out", root, "--name", name, "-q", *sets)
            assert r.exit_code == 0, r.output
    return {name: root / name for name in RUNS}


def load(run_dir: Path):
    from tiedlm.evaluate import load_run_model

    return load_run_model(run_dir)


def analysed(run_dir: Path, out: Path) -> dict:
    """`tiedlm analyze --split test --out` on the one run (out is its analysis folder); its analysis.json."""
    r = invoke("analyze", run_dir, "--split", "test", "--out", out)
    assert r.exit_code == 0, r.output
    return json.loads((out / "analysis.json").read_text())


def pairs_of(rm, split="test"):
    ids = torch.from_numpy(np.asarray(rm.data.splits[split].tokens, dtype=np.int64))
    return ids[:-1], ids[1:]


def bigram_nll(h: torch.Tensor, W: torch.Tensor, bias, nxt: torch.Tensor) -> float:
    """Cross-entropy of next tokens under logits h Wᵀ (+ bias), in float64."""
    logits = h @ W.double().T + (0 if bias is None else bias.double())
    return float(F.cross_entropy(logits, nxt))


def rms_by_hand(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """x · 1/sqrt(mean(x²) + eps) · weight, written out in float64: no mean taken away, no bias."""
    x = x.double()
    return x / torch.sqrt((x * x).mean(dim=1, keepdim=True) + eps) * weight.double()


# ------------------------------------------------------------------ the direct path


@pytest.mark.parametrize("name", ["llama-tied", "llama-untied"])
def test_the_llama_direct_path_goes_through_the_final_rmsnorm(trained, tmp_path, name):
    a = analysed(trained[name], tmp_path)
    rm = load(trained[name])
    model, cfg = rm.model, rm.cfg.model
    t = model.transformer
    assert isinstance(t.ln_f, torch.nn.RMSNorm) and "wpe" not in t
    E, gamma, bias = t.wte.weight.detach(), t.ln_f.weight.detach(), model.lm_head.bias
    bias = None if bias is None else bias.detach()
    assert (gamma - 1).abs().max() > 0.02  # trained away from ones: a norm that drops the weight is caught
    prev, nxt = pairs_of(rm)
    scale = math.sqrt(cfg.n_embd) if name == "llama-untied" else 1.0
    assert model.embed_scale == pytest.approx(scale)
    h = rms_by_hand(E[prev] * scale, gamma, cfg.norm_eps)
    W = model.lm_head.weight.detach()
    expected = bigram_nll(h, W, bias, nxt)

    d = a["direct_path"]
    assert d["final_norm"] == "rmsnorm" and d["pairs"] == len(prev) and d["split"] == "test"
    assert d["distinct_prev"] == len(set(prev.tolist()))
    assert d["nll"] == pytest.approx(expected, abs=2e-5)
    assert d["perplexity"] == pytest.approx(math.exp(expected), rel=1e-4)
    # the model's own final norm and head, its layers skipped, say the same
    with torch.no_grad():
        own = bigram_nll(t.ln_f(t.wte(prev) * model.embed_scale).double(), W, bias, nxt)
    assert d["nll"] == pytest.approx(own, abs=2e-5)
    # a LayerNorm in its place (the old code's formula) scores something else
    ln = F.layer_norm(E[prev].double() * scale, (cfg.n_embd,), gamma.double(), None, cfg.norm_eps)
    assert abs(bigram_nll(ln, W, bias, nxt) - expected) > 1e-3
    if name == "llama-tied":
        assert a["tied"] is True and "with_e_as_w_out" not in d
        assert d["symmetric_share"] == pytest.approx(1.0, abs=1e-6)
    else:
        assert a["tied"] is False and bias is not None and bias.abs().max() > 0
        assert d["with_e_as_w_out"]["nll"] == pytest.approx(bigram_nll(h, E, bias, nxt), abs=2e-5)
        # bilinear form W · diag(γ) · Eᵀ, formed in full here (V is small)
        V = rm.data.vocab_size
        M = W[:V].double() @ torch.diag(gamma.double()) @ E[:V].double().T
        sym = float((((M + M.T) / 2) ** 2).sum() / (M * M).sum())
        assert 0 < sym < 0.9 and d["symmetric_share"] == pytest.approx(sym, abs=1e-6)
    md = (tmp_path / "analysis.md").read_text()
    assert "W_out · RMSNorm_f(E[t])" in md and "LN_f" not in md


def test_the_gpt2_direct_path_keeps_its_layernorm_formula(trained, tmp_path):
    a = analysed(trained["gpt2-untied"], tmp_path)
    rm = load(trained["gpt2-untied"])
    model, cfg = rm.model, rm.cfg.model
    t = model.transformer
    assert isinstance(t.ln_f, torch.nn.LayerNorm) and t.ln_f.bias is not None and t.ln_f.bias.abs().max() > 0
    E, W = t.wte.weight.detach(), model.lm_head.weight.detach()
    w, b, hb = t.ln_f.weight.detach(), t.ln_f.bias.detach(), model.lm_head.bias.detach()
    prev, nxt = pairs_of(rm)
    d = a["direct_path"]
    assert d["final_norm"] == "layernorm"
    # the LayerNorm by hand in float64: mean taken away, bias added
    x = E[prev].double()
    centred = x - x.mean(1, keepdim=True)
    h = centred / torch.sqrt(centred.square().mean(1, keepdim=True) + cfg.norm_eps) * w.double() + b.double()
    assert d["nll"] == pytest.approx(bigram_nll(h, W, hb, nxt), abs=2e-5)
    assert d["with_e_as_w_out"]["nll"] == pytest.approx(bigram_nll(h, E, hb, nxt), abs=2e-5)
    # and the very call the analysis made before the norm was named: the same float, to the bit
    old = g.direct_path_nll(E.float(), W.float(), prev, nxt, w.float(), b.float(), eps=t.ln_f.eps,
                            scale=model.embed_scale, head_bias=hb.float())
    assert d["nll"] == old["nll"]
    # an RMSNorm in its place scores something else
    assert abs(bigram_nll(rms_by_hand(x, w, cfg.norm_eps), W, hb, nxt) - d["nll"]) > 1e-3
    assert "W_out · LN_f(E[t])" in (tmp_path / "analysis.md").read_text()


def test_direct_path_nll_rmsnorm_against_the_formula():
    V, d, N = 120, 16, 700
    gen = torch.Generator().manual_seed(3)
    E, W = torch.randn(V, d, generator=gen), torch.randn(V, d, generator=gen)
    E = E + 0.7  # a common offset: a LayerNorm would take it away, an RMSNorm keeps it
    weight, head_bias = torch.rand(d, generator=gen) + 0.5, torch.randn(V, generator=gen)
    prev = torch.randint(0, 40, (N,), generator=gen)
    for eps, scale in ((1e-5, 1.0), (4.0, 1.0)):  # a large eps: an eps dropped or misplaced shows
        h = rms_by_hand(E[prev] * scale, weight, eps)
        # next tokens drawn from the true model: a wrong norm scores them clearly worse
        nxt = torch.multinomial(torch.softmax(h @ W.double().T + head_bias.double(), 1), 1, generator=gen)[:, 0]
        expected = bigram_nll(h, W, head_bias, nxt)
        for chunk in (2048, 7):
            r = g.direct_path_nll(E, W, prev, nxt, weight, None, eps=eps, scale=scale, head_bias=head_bias,
                                  chunk=chunk, norm="rmsnorm")
            assert r["nll"] == pytest.approx(expected, abs=1e-5)
        as_ln = g.direct_path_nll(E, W, prev, nxt, weight, None, eps=eps, scale=scale, head_bias=head_bias)
        assert as_ln["nll"] > expected + 0.05
        other_eps = g.direct_path_nll(E, W, prev, nxt, weight, None, eps=1e-5 if eps > 1 else 4.0, scale=scale,
                                      head_bias=head_bias, norm="rmsnorm")
        assert other_eps["nll"] > expected + 0.05
    scaled = g.direct_path_nll(E, W, prev, nxt, weight, None, eps=4.0, scale=math.sqrt(d), head_bias=head_bias,
                               norm="rmsnorm")  # scale · E against eps: no longer the same
    assert scaled["nll"] == pytest.approx(bigram_nll(rms_by_hand(E[prev] * math.sqrt(d), weight, 4.0), W,
                                                      head_bias, nxt), abs=1e-5)
    assert abs(scaled["nll"] - expected) > 0.05
    # the module's own eps default (None: finfo(float32).eps), as nn.RMSNorm(d) uses it
    module = torch.nn.RMSNorm(d)
    with torch.no_grad():
        module.weight.copy_(weight)
        own = bigram_nll(module(E[prev]).double(), W, None, nxt)
    assert g.direct_path_nll(E, W, prev, nxt, weight, None, eps=None, norm="rmsnorm")["nll"] == pytest.approx(
        own, abs=1e-5)
    with pytest.raises(ValueError, match="no bias"):
        g.direct_path_nll(E, W, prev, nxt, weight, torch.zeros(d), norm="rmsnorm")
    with pytest.raises(ValueError, match="norm must be"):
        g.direct_path_nll(E, W, prev, nxt, weight, None, norm="batchnorm")


# ------------------------------------------------------------------ sampling


def test_sample_gives_the_requested_tokens_and_is_the_same_for_a_seed(trained):
    from tiedlm.generate import SampleOptions, sample_run

    run = trained["llama-untied"]
    n = 40  # more than block_size 16: the context window slides

    def sample(seed, **kw):
        text = []
        ids = sample_run(run, SampleOptions(max_new_tokens=n, seed=seed, **kw), text.append, lambda _: None,
                         device="cpu")
        return ids[0], "".join(text)

    ids, text = sample(7)
    assert len(ids) == n and len(text.split()) == n
    tok = load(run).data.tokenizer
    assert text.strip() == tok.decode(ids) and tok.eot_id not in ids
    assert sample(7) == (ids, text)
    assert sample(8)[0] != ids
    r = invoke("sample", run, "--max-new-tokens", n, "--seed", 7, "--device", "cpu")
    assert r.exit_code == 0, r.output
    assert r.stdout == text
    # greedy: each token is the argmax of the whole model's last logits over the last 16 tokens
    greedy, _ = sample(0, temperature=0.0)
    model = load(run).model.eval()
    ctx = [tok.eot_id]
    with torch.no_grad():
        for t in greedy:
            logits = model(torch.tensor([ctx[-16:]]))[0, -1, :tok.vocab_size]
            assert t == int(logits.argmax())
            ctx.append(t)
    assert len(greedy) == n


# ------------------------------------------------------------------ tensorboard


def events(run_dir: Path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(run_dir / TB), size_guidance={"scalars": 0, "tensors": 0})
    acc.Reload()
    scalars = {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}
    texts = {tag: b"".join(acc.Tensors(tag)[-1].tensor_proto.string_val).decode() for tag in acc.Tags()["tensors"]}
    return scalars, texts


def expected_scalars(run_dir: Path) -> dict:
    metrics = runs.read_metrics(run_dir)
    out = {f"train/{k}": [(r["step"], r[k]) for r in metrics if r["kind"] == "train"]
           for k in ("loss", "lr", "grad_norm", "tokens_per_s")}
    out.update({f"val/{k}": [(r["step"], r[k]) for r in metrics if r["kind"] == "eval"] for k in ("loss", "perplexity")})
    report = runs.read_report(run_dir)
    for split, res in report.final.items():
        for k in ("loss", "perplexity", "bits_per_byte", "word_perplexity"):
            if res.get(k) is not None:
                out[f"final/{split}/{k}"] = [(report.steps, res[k])]
    return {tag: [(s, float(np.float32(v))) for s, v in pairs] for tag, pairs in out.items()}


def test_tensorboard_logs_a_llama_run(trained, tmp_path):
    run = trained["llama-tied"]
    scalars, texts = events(run)
    want = expected_scalars(run)
    assert [s for s, _ in want["train/loss"]] == [5, 10, 15, 20, 25, 30]
    assert [s for s, _ in want["val/loss"]] == [10, 20, 30]
    assert {"final/validation/loss", "final/test/loss"} <= set(want)
    assert scalars == want
    assert texts["run/text_summary"].startswith("**llama-tied** — llama blocks, tied input/output embeddings")
    params = runs.read_report(run).params
    assert f"| total | {params['total']:,} |" in texts["params/text_summary"]
    assert "| wpe | 0 |" in texts["params/text_summary"] and "| tied | true |" in texts["params/text_summary"]
    # `tiedlm tensorboard` back-fills a run trained without it: the same scalars from its own records
    other = trained["llama-untied"]
    assert not (other / TB).exists()
    r = invoke("tensorboard", other)
    assert r.exit_code == 0, r.output
    scalars, texts = events(other)
    assert scalars == expected_scalars(other) and "val/perplexity" in scalars
    assert "llama blocks, untied" in texts["run/text_summary"] and "| tied | false |" in texts["params/text_summary"]
