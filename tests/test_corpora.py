"""tiedlm.corpora: the synthetic language (structure, exact entropy rate, speed) and builtin:pydoc."""

import hashlib
import json
import math
import re
import subprocess
import sys

import numpy as np
import pytest

from tiedlm import corpora
from tiedlm.config import SyntheticConfig, load_config
from tiedlm.data import prepare_data

from .conftest import ROOT

SMALL = SyntheticConfig(vocab_size=300, n_classes=12, successors=3, zipf=1.2,
                        train_tokens=5000, validation_tokens=800, test_tokens=800, seed=7)


def digest(splits: dict) -> str:
    return hashlib.sha256(json.dumps(splits, sort_keys=True).encode()).hexdigest()


def digest_in_a_fresh_process(expression: str) -> str:
    """digest(expression) computed by another Python process: the language memo
    (corpora.synthetic_language is cached) and every other state of this process are not there."""
    code = (f"import hashlib, json\nfrom tiedlm import corpora\nfrom tiedlm.config import SyntheticConfig\n"
            f"SMALL = SyntheticConfig(**{SMALL.__dict__!r})\n"
            f"print(hashlib.sha256(json.dumps({expression}, sort_keys=True).encode()).hexdigest())")
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    return r.stdout.strip()


def test_language_structure():
    lang = corpora.synthetic_language(SMALL)
    v, c = SMALL.vocab_size, SMALL.n_classes
    assert len(lang.words) == len(set(lang.words)) == v
    assert all(re.fullmatch(r"[a-z]+", w) for w in lang.words)
    assert [len(w) for w in lang.words] == sorted(len(w) for w in lang.words)  # frequent words are short
    assert lang.word_class.shape == (v,) and set(lang.word_class.tolist()) == set(range(c))  # no empty class
    # p(w | c) sums to one within each class and follows a Zipf law there
    sums = np.bincount(lang.word_class, weights=lang.emission, minlength=c)
    assert np.allclose(sums, 1.0)
    first = [np.flatnonzero(lang.word_class == k) for k in range(c)]
    for ids in first:
        if len(ids) > 1:
            assert lang.emission[ids[0]] / lang.emission[ids[1]] == pytest.approx(2 ** SMALL.zipf)
    t = lang.transitions
    assert np.allclose(t.sum(1), 1.0) and ((t > 0).sum(1) == SMALL.successors).all()
    assert np.allclose(lang.stationary @ t, lang.stationary) and lang.stationary.min() > 0
    # word ids are ordered by unigram frequency
    unigram = lang.stationary[lang.word_class] * lang.emission
    assert (np.diff(unigram) <= 1e-15).all()


def test_deterministic_for_the_seed_and_splits_independent():
    a = corpora.synthetic_splits(SMALL)
    assert digest_in_a_fresh_process("corpora.synthetic_splits(SMALL)") == digest(a)
    other = corpora.synthetic_splits(SyntheticConfig(**{**SMALL.__dict__, "seed": 8}))
    assert other["train"] != a["train"]
    longer = corpora.synthetic_splits(SyntheticConfig(**{**SMALL.__dict__, "train_tokens": 9000}))
    assert longer["validation"] == a["validation"] and longer["test"] == a["test"]
    assert a["validation"] != a["test"]
    lines = a["train"].split("\n")
    assert len(a["train"].split()) == SMALL.train_tokens
    assert all(len(line.split()) == corpora.WORDS_PER_LINE for line in lines[:-1])


def test_entropy_rate_formula_matches_the_word_level_chain():
    """The word sequence is itself a Markov chain, P(w' | w) = T[c(w), c(w')] p(w' | c(w')); its
    entropy rate sum_w mu_w H(P(. | w)) (mu stationary over words) must equal the class formula."""
    cfg = SyntheticConfig(vocab_size=40, n_classes=5, successors=2, zipf=0.9, seed=3)
    lang = corpora.synthetic_language(cfg)
    c = lang.word_class
    p = lang.transitions[c][:, c] * lang.emission[None, :]  # [V, V]
    assert np.allclose(p.sum(1), 1.0)
    evals, evecs = np.linalg.eig(p.T)
    mu = np.real(evecs[:, np.argmin(np.abs(evals - 1))])
    mu /= mu.sum()
    with np.errstate(divide="ignore", invalid="ignore"):
        h_rows = -np.nansum(np.where(p > 0, p * np.log(p), 0.0), axis=1)
    assert corpora.synthetic_entropy_rate(cfg) == pytest.approx(float(mu @ h_rows), rel=1e-9)


@pytest.mark.parametrize("cfg", [SyntheticConfig(), SMALL])
def test_entropy_rate_matches_a_monte_carlo_estimate(cfg):
    """Mean of -log p(w_t | w_{t-1}) over a long sample estimates H. Successive terms are correlated
    (Markov), so the standard error comes from the means of 100 consecutive batches (batch means):
    with batches much longer than the chain's mixing time they are nearly independent. A correct
    formula is then within 4 standard errors with probability > 0.9999."""
    h = corpora.synthetic_entropy_rate(cfg)
    _, log_p = corpora.sample_synthetic(cfg, 400_000)
    loss = -log_p
    assert np.isfinite(loss).all()  # every sampled transition has positive probability
    batches = loss[: len(loss) // 100 * 100].reshape(100, -1).mean(axis=1)
    se = batches.std(ddof=1) / math.sqrt(len(batches))
    assert se < 0.01 * h  # the check is sharp enough to catch a wrong term
    assert abs(loss.mean() - h) < 4 * se, (loss.mean(), h, se)


def test_a_million_words_are_words_of_the_language():
    """How fast they are generated, scripts/bench.py measures (its cold builtin:synthetic prepare)."""
    cfg = SyntheticConfig(train_tokens=1_000_000, validation_tokens=1, test_tokens=1, seed=11)
    words = corpora.synthetic_splits(cfg)["train"].split()
    assert len(words) == 1_000_000 and set(words) <= set(corpora.synthetic_language(cfg).words)


def test_prepared_synthetic_reports_the_floor():
    cfg = load_config(None, ["train.max_steps=1", "model.block_size=16", "tokenizer.kind=word",
                             *(f"data.synthetic.{k}={v}" for k, v in SMALL.__dict__.items())])
    p = prepare_data(cfg, progress=False)
    h = corpora.synthetic_entropy_rate(SMALL)
    assert p.floor["nats_per_word"] == pytest.approx(h)
    assert p.floor["perplexity_per_word"] == pytest.approx(math.exp(h))
    assert "per word" in p.floor["note"]
    for name, s in p.splits.items():
        assert s.n_docs == 1
        assert s.oov_rate == 0.0 if name == "train" else s.oov_rate < 0.05  # rare words may be unseen in train
        words = s.n_words - 1  # minus the one separator
        assert words == {"train": SMALL.train_tokens, "validation": SMALL.validation_tokens,
                         "test": SMALL.test_tokens}[name]
        assert len(s.tokens) == s.n_words  # one token per word, one EOT
        assert p.floor["bits_per_byte"][name] == pytest.approx(h * words / math.log(2) / s.n_bytes)
    assert p.vocab_size <= SMALL.vocab_size + 2  # the words seen in train, <unk> and <eot>


def test_pydoc_splits_are_deterministic_and_disjoint():
    a = corpora.pydoc_splits()
    assert set(a) == {"train", "validation", "test"}
    assert digest_in_a_fresh_process("corpora.pydoc_splits()") == digest(a)
    n = {k: len(v) for k, v in a.items()}
    total = sum(n.values())
    assert abs(n["validation"] - total / 20) <= 1 and abs(n["test"] - total / 20) <= 1
    assert all(p.strip() for v in a.values() for p in v)
    assert len(corpora.pydoc_fingerprint()) == 16
    assert sum(len(p) for p in a["train"]) > 300_000  # about 0.4 MB of English in CPython 3.11
    # no paragraph in two splits (evaluation text is never in training), none twice in one split
    train, val, test = (set(a[s]) for s in ("train", "validation", "test"))
    assert a["validation"] and a["test"]
    assert not train & val and not train & test and not val & test
    assert len(train) + len(val) + len(test) == total
