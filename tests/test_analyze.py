"""tiedlm analyze (analyze/): every file written for a tied and an untied run, the direct path
against the model's own layers, the tied case by construction, the synthetic language's asymmetry
against a brute-force count, a run still training, the optimizer state never read, bad input as
one line, and compare --analyze. The geometry itself is tested in test_geometry.py."""

import json
import math
import shutil
import struct

import numpy as np
import pytest
from typer.testing import CliRunner

from tiedlm import runs
from tiedlm.analyze import ANALYSIS_JSON, ANALYSIS_MD, analyze_run
from tiedlm.analyze.measures import language_asymmetry
from tiedlm.analyze.render import PLOTS
from tiedlm.cli import app
from tiedlm.config import load_config
from tiedlm.errors import Interrupted
from tiedlm.train import train_run
from .conftest import comparison_dir

TINY = ["data.path=builtin:synthetic", "data.synthetic.vocab_size=300", "data.synthetic.n_classes=12",
        "data.synthetic.train_tokens=20000", "data.synthetic.validation_tokens=3000", "data.synthetic.test_tokens=3000",
        "tokenizer.vocab_size=512", "model.n_layer=1", "model.n_head=2", "model.n_embd=32", "model.block_size=32",
        "train.batch_size=8", "train.max_steps=40", "train.eval_every=20", "train.lr=1e-2", "train.warmup_steps=5",
        "train.device=cpu", "train.threads=1"]
PNG = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    root = tmp_path_factory.mktemp("runs")
    out = {}
    for tag, tie in (("tied", "true"), ("untied", "false")):
        cfg = load_config(None, TINY + [f"model.tie_embeddings={tie}"])
        out[tag] = train_run(cfg, out=root, name=f"a-{tag}-s0", progress=False)
    return out


def invoke(*args):
    return CliRunner().invoke(app, [str(a) for a in args])


@pytest.mark.figures
def test_cli_writes_every_file_for_a_tied_and_an_untied_run(pair, tmp_path):
    dest = tmp_path / "out"
    r = invoke("analyze", pair["tied"], pair["untied"], "--out", dest)
    assert r.exit_code == 0, r.output
    lines = r.stdout.strip().splitlines()
    assert len(lines) == 2 and lines[0].startswith("a-tied-s0 (tied, step-") and "pair cosine" in lines[1]
    for name, plots in (("a-tied-s0", ("norms", "spectrum")), ("a-untied-s0", ("norms", "spectrum", "cosine"))):
        folder = dest / name
        assert (folder / ANALYSIS_MD).read_text().startswith(f"# What the two matrices learned: {name}")
        json.loads((folder / ANALYSIS_JSON).read_text())  # strict JSON
        for p in PLOTS:
            assert (folder / PLOTS[p]).exists() == (p in plots), (name, p)
            if p in plots:
                png = (folder / PLOTS[p]).read_bytes()
                assert png.startswith(PNG) and min(struct.unpack(">II", png[16:24])) > 100  # drawn: width, height
    assert not (pair["tied"] / ANALYSIS_JSON).exists()  # --out: nothing written into the run


def test_a_tied_run_has_one_matrix_and_a_symmetric_direct_path(pair, tmp_path):
    a = analyze_run(pair["tied"], out=tmp_path)
    assert a["tied"] is True and list(a["matrices"]) == ["E"]
    assert a["pair"]["cosine"] == 1.0 and a["pair"]["cka"] == 1.0 and "by_bucket" not in a["pair"]
    assert a["direct_path"]["symmetric_share"] == pytest.approx(1.0, abs=1e-6)
    assert "with_e_as_w_out" not in a["direct_path"]
    md = (tmp_path / ANALYSIS_MD).read_text()
    assert "no W_out-only figures" in md and "W_out mean norm" not in md


def test_untied_figures_hang_together(pair, tmp_path):
    scipy_stats = pytest.importorskip("scipy.stats")
    from tiedlm.analyze import geometry as g
    from tiedlm.evaluate import load_run_model

    a = analyze_run(pair["untied"], out=tmp_path)
    assert list(a["matrices"]) == ["E", "W_out"] and a["pair"]["tied"] is False
    p = a["pair"]
    assert -1 <= p["cosine"] <= p["aligned_cosine"] + 1e-6 <= 1 + 1e-6  # a rotation can only help the mean
    assert 0 <= p["cka"] <= 1 and 0 <= p["neighbours"]["mean"] <= 1 and p["neighbours"]["sampled"] <= 300
    assert 0 < a["direct_path"]["symmetric_share"] < 1
    assert a["direct_path"]["symmetric_share"] + a["direct_path"]["antisymmetric_share"] == pytest.approx(1)
    rm = load_run_model(pair["untied"])
    V = rm.data.vocab_size
    counts = rm.data.train_counts[:V]
    norms = g.row_norms(rm.model.transformer.wte.weight.detach()[:V]).numpy()
    seen = counts > 0
    rho = scipy_stats.spearmanr(norms[seen], counts[seen]).statistic
    assert a["matrices"]["E"]["norm_frequency_spearman"] == pytest.approx(rho, abs=1e-9)
    assert sum(b["types"] for b in a["pair"]["by_bucket"]) == V


def direct_path_by_hand(model, tokens: np.ndarray, E=None) -> float:
    """The model's own modules, layers skipped: mean NLL of next given previous."""
    import torch
    from torch.nn import functional as F

    ids = torch.from_numpy(np.asarray(tokens, dtype=np.int64))
    with torch.no_grad():
        h = model.transformer.ln_f(model.transformer.wte(ids[:-1]) * model.embed_scale)
        W = model.lm_head.weight if E is None else E
        logits = h @ W.T + (model.lm_head.bias if model.lm_head.bias is not None else 0)
        return float(F.cross_entropy(logits, ids[1:]))


@pytest.mark.parametrize("tag", ["tied", "untied"])
def test_direct_path_equals_the_model_without_its_layers(pair, tmp_path, tag):
    from tiedlm.evaluate import load_run_model

    a = analyze_run(pair[tag], out=tmp_path, split="test")
    rm = load_run_model(pair[tag])
    tokens = rm.data.splits["test"].tokens
    d = a["direct_path"]
    assert d["pairs"] == len(tokens) - 1 and d["split"] == "test"
    assert d["nll"] == pytest.approx(direct_path_by_hand(rm.model, tokens), abs=2e-5)
    if tag == "untied":
        forced = direct_path_by_hand(rm.model, tokens, E=rm.model.transformer.wte.weight)
        assert d["with_e_as_w_out"]["nll"] == pytest.approx(forced, abs=2e-5)
    assert a["model_loss"] == json.loads((pair[tag] / runs.REPORT).read_text())["final"]["test"]["loss"]
    assert a["floor"]["nats_per_token"] > 0
    # per byte: the nats over ln 2, over the split's mean UTF-8 bytes per token (counted here from its text)
    split = rm.data.splits["test"]
    assert split.n_bytes > 0
    per_token_bytes = split.n_bytes / len(tokens)
    assert d["bits_per_byte"] == pytest.approx(d["nll"] / math.log(2) / per_token_bytes, rel=1e-12)
    if tag == "untied":
        assert d["with_e_as_w_out"]["bits_per_byte"] == pytest.approx(
            d["with_e_as_w_out"]["nll"] / math.log(2) / per_token_bytes, rel=1e-12)
    md = (tmp_path / "analysis.md").read_text()
    assert "bits/byte" in md and f"{d['bits_per_byte']:.4f}" in md


def test_language_asymmetry_against_the_explicit_bigram_matrix():
    from tiedlm.data.builtin import synthetic_language

    scfg = load_config(None, TINY).data.synthetic
    lang = synthetic_language(scfg)
    V = len(lang.words)
    c = lang.word_class
    J = lang.stationary[c][:, None] * lang.emission[:, None] * lang.transitions[c][:, c] * lang.emission[None, :]
    assert J.shape == (V, V) and J.sum() == pytest.approx(1.0)
    share = np.sum(((J - J.T) / 2) ** 2) / np.sum(J ** 2)
    got = language_asymmetry(scfg)
    assert got["joint_antisymmetric_share"] == pytest.approx(share, rel=1e-9)
    T = lang.transitions > 0
    assert got["without_reverse"] == pytest.approx((T & ~T.T).sum() / T.sum())


def test_a_run_still_training_is_analysed_and_marked(tmp_path):
    cfg = load_config(None, TINY + ["model.tie_embeddings=false", "train.checkpoint_every=10"])
    with pytest.raises(Interrupted):
        train_run(cfg, out=tmp_path, name="live", progress=False, stop_after_step=10)
    a = analyze_run(tmp_path / "live")
    assert a["still_training"] is True and a["checkpoint"] == "step-0000010" and a["status"] == "interrupted"
    assert "still training: its latest checkpoint" in (tmp_path / "live" / ANALYSIS_MD).read_text()


def test_the_optimizer_state_is_never_read(pair, tmp_path, monkeypatch):
    import torch

    def refuse(*args, **kwargs):
        raise AssertionError("torch.load was called: the optimizer state was read")

    monkeypatch.setattr(torch, "load", refuse)
    assert analyze_run(pair["untied"], out=tmp_path)["tied"] is False


def test_bad_input_is_one_line(pair, tmp_path):
    cases = [(tmp_path / "nothing", 2, "does not exist"), (tmp_path, 2, "has no config.yaml")]
    fresh = tmp_path / "fresh"
    fresh.mkdir()
    shutil.copy(pair["untied"] / runs.CONFIG, fresh / runs.CONFIG)
    cases.append((fresh, 2, "has no checkpoint yet"))
    for path, code, message in cases:
        r = invoke("analyze", path)
        assert r.exit_code == code and message in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.output
    r = invoke("analyze", pair["untied"], "--split", "dev")
    assert r.exit_code == 2 and len(r.stderr.strip().splitlines()) == 1
    r = invoke("analyze", str(tmp_path / "nope-*"))
    assert r.exit_code == 2 and "no run folder matches" in r.stderr


def test_compare_analyze_adds_the_section_and_ignores_stale_analyses(pair, tmp_path):
    root = tmp_path / "runs"
    for tag in ("tied", "untied"):
        shutil.copytree(pair[tag], root / pair[tag].name)
    r = invoke("compare", "--out", root, "--analyze")
    assert r.exit_code == 0, r.output
    md = (comparison_dir(root) / "comparison.md").read_text()
    assert "## What the matrices show" in md
    data = json.loads((comparison_dir(root) / "comparison.json").read_text())
    untied = next(v for v in data["variants"] if not v["tied"])
    own = json.loads((root / "a-untied-s0" / ANALYSIS_JSON).read_text())
    assert untied["matrices"]["cka"]["mean"] == own["pair"]["cka"]
    assert untied["matrices"]["direct_path_nll"]["mean"] == own["direct_path"]["nll"]
    # an analysis of another checkpoint is not shown as this run's
    own["checkpoint"] = "step-0000001"
    (root / "a-untied-s0" / ANALYSIS_JSON).write_text(json.dumps(own))
    r = invoke("compare", "--out", root)
    data = json.loads((comparison_dir(root) / "comparison.json").read_text())
    assert next(v for v in data["variants"] if not v["tied"])["matrices"] == {}
    assert any("analysis.json is of step-0000001" in n for n in data["notes"])
    # analysed afresh: used, and no stale note left (the analysis.json edited above is no longer the one
    # tiedlm wrote, so replacing it takes --overwrite-output: test_hardening_writes.py)
    r = invoke("compare", "--out", root, "--analyze", "--overwrite-output")
    assert r.exit_code == 0, r.output
    data = json.loads((comparison_dir(root) / "comparison.json").read_text())
    assert next(v for v in data["variants"] if not v["tied"])["matrices"]["cka"]["n"] == 1
    assert not any("analysis.json" in n for n in data["notes"])
    analyze_run(root / "a-untied-s0", split="test")  # another split than the comparison shows
    data = json.loads((comparison_dir(root) / "comparison.json").read_text()) if invoke(
        "compare", "--out", root).exit_code == 0 else {}
    assert any("scored the direct path on test" in n for n in data["notes"])
    assert math.isclose(next(v for v in data["variants"] if v["tied"])["matrices"]["symmetric_share"]["mean"], 1.0,
                        abs_tol=1e-6)


def test_json_output_and_an_untie_at_run(tmp_path):
    cfg = load_config(None, TINY + ["model.tie_embeddings=true", "model.untie_at=0.5"])
    run = train_run(cfg, out=tmp_path, name="split", progress=False)
    r = invoke("analyze", run, "--json", "--sample", "50", "--seed", "3")
    assert r.exit_code == 0, r.output
    [a] = json.loads(r.stdout)
    assert a["untied_at_step"] == 20 and a["tied"] is False and a["seed"] == 3 and a["sample"] == 50
    assert a["pair"]["neighbours"]["sampled"] == 50
    assert 0 < a["pair"]["relative_drift"] < 1.5  # two copies of one matrix that drifted for 20 steps
    assert "relative drift ‖E − W_out‖ / ‖E‖ since the split" in (run / ANALYSIS_MD).read_text()
    assert json.loads((run / ANALYSIS_JSON).read_text()) == a


def test_a_tiny_vocabulary_still_gets_its_pair_figures():
    import torch

    from tiedlm.analyze.measures import pair_stats

    g = torch.Generator().manual_seed(0)
    E, W = torch.randn(5, 8, generator=g), torch.randn(5, 8, generator=g)
    p = pair_stats(E, W, np.zeros(5, dtype=np.int64), ["all"], seed=0, sample=100)
    assert p["neighbours"]["k"] == 4 and p["neighbours"]["sampled"] == 5
    assert p["aligned_cosine"] >= p["cosine"] - 1e-6  # the rotation maximises the mean cosine
