"""tiedlm.data.builtin: the synthetic language (structure, exact entropy rate, speed) and builtin:pydoc."""

import hashlib
import json
import math
import re
import subprocess
import sys

import numpy as np
import pytest

from tiedlm.data import builtin
from tiedlm.config import SyntheticConfig, load_config
from tiedlm.data import prepare_data

from .conftest import ROOT

SMALL = SyntheticConfig(vocab_size=300, n_classes=12, successors=3, zipf=1.2,
                        train_tokens=5000, validation_tokens=800, test_tokens=800, seed=7)


def digest(splits: dict) -> str:
    return hashlib.sha256(json.dumps(splits, sort_keys=True).encode()).hexdigest()


def digest_in_a_fresh_process(expression: str) -> str:
    """digest(expression) computed by another Python process: the language memo
    (builtin.synthetic_language is cached) and every other state of this process are not there."""
    code = (f"import hashlib, json\nfrom tiedlm.data import builtin\nfrom tiedlm.config import SyntheticConfig\n"
            f"SMALL = SyntheticConfig(**{SMALL.__dict__!r})\n"
            f"print(hashlib.sha256(json.dumps({expression}, sort_keys=True).encode()).hexdigest())")
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    return r.stdout.strip()


def test_language_structure():
    lang = builtin.synthetic_language(SMALL)
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
    a = builtin.synthetic_splits(SMALL)
    assert digest_in_a_fresh_process("builtin.synthetic_splits(SMALL)") == digest(a)
    other = builtin.synthetic_splits(SyntheticConfig(**{**SMALL.__dict__, "seed": 8}))
    assert other["train"] != a["train"]
    longer = builtin.synthetic_splits(SyntheticConfig(**{**SMALL.__dict__, "train_tokens": 9000}))
    assert longer["validation"] == a["validation"] and longer["test"] == a["test"]
    assert a["validation"] != a["test"]
    lines = a["train"].split("\n")
    assert len(a["train"].split()) == SMALL.train_tokens
    assert all(len(line.split()) == builtin.WORDS_PER_LINE for line in lines[:-1])


def test_entropy_rate_formula_matches_the_word_level_chain():
    """The word sequence is itself a Markov chain, P(w' | w) = T[c(w), c(w')] p(w' | c(w')); its
    entropy rate sum_w mu_w H(P(. | w)) (mu stationary over words) must equal the class formula."""
    cfg = SyntheticConfig(vocab_size=40, n_classes=5, successors=2, zipf=0.9, seed=3)
    lang = builtin.synthetic_language(cfg)
    c = lang.word_class
    p = lang.transitions[c][:, c] * lang.emission[None, :]  # [V, V]
    assert np.allclose(p.sum(1), 1.0)
    evals, evecs = np.linalg.eig(p.T)
    mu = np.real(evecs[:, np.argmin(np.abs(evals - 1))])
    mu /= mu.sum()
    with np.errstate(divide="ignore", invalid="ignore"):
        h_rows = -np.nansum(np.where(p > 0, p * np.log(p), 0.0), axis=1)
    assert builtin.synthetic_entropy_rate(cfg) == pytest.approx(float(mu @ h_rows), rel=1e-9)


@pytest.mark.parametrize("cfg", [SyntheticConfig(), SMALL])
def test_entropy_rate_matches_a_monte_carlo_estimate(cfg):
    """Mean of -log p(w_t | w_{t-1}) over a long sample estimates H. Successive terms are correlated
    (Markov), so the standard error comes from the means of 100 consecutive batches (batch means):
    with batches much longer than the chain's mixing time they are nearly independent. A correct
    formula is then within 4 standard errors with probability > 0.9999."""
    h = builtin.synthetic_entropy_rate(cfg)
    _, log_p = builtin.sample_synthetic(cfg, 400_000)
    loss = -log_p
    assert np.isfinite(loss).all()  # every sampled transition has positive probability
    batches = loss[: len(loss) // 100 * 100].reshape(100, -1).mean(axis=1)
    se = batches.std(ddof=1) / math.sqrt(len(batches))
    assert se < 0.01 * h  # the check is sharp enough to catch a wrong term
    assert abs(loss.mean() - h) < 4 * se, (loss.mean(), h, se)


def test_a_million_words_are_words_of_the_language():
    """How fast they are generated, scripts/bench.py measures (its cold builtin:synthetic prepare)."""
    cfg = SyntheticConfig(train_tokens=1_000_000, validation_tokens=1, test_tokens=1, seed=11)
    words = builtin.synthetic_splits(cfg)["train"].split()
    assert len(words) == 1_000_000 and set(words) <= set(builtin.synthetic_language(cfg).words)


def test_prepared_synthetic_reports_the_floor():
    cfg = load_config(None, ["train.max_steps=1", "model.block_size=16", "tokenizer.kind=word",
                             *(f"data.synthetic.{k}={v}" for k, v in SMALL.__dict__.items())])
    p = prepare_data(cfg, progress=False)
    h = builtin.synthetic_entropy_rate(SMALL)
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
    a = builtin.pydoc_splits()
    assert set(a) == {"train", "validation", "test"}
    assert digest_in_a_fresh_process("builtin.pydoc_splits()") == digest(a)
    n = {k: len(v) for k, v in a.items()}
    total = sum(n.values())
    assert abs(n["validation"] - total / 20) <= 1 and abs(n["test"] - total / 20) <= 1
    assert all(p.strip() for v in a.values() for p in v)
    assert len(builtin.pydoc_fingerprint()) == 16
    assert sum(len(p) for p in a["train"]) > 300_000  # about 0.4 MB of English in CPython 3.11
    # no paragraph in two splits (evaluation text is never in training), none twice in one split
    train, val, test = (set(a[s]) for s in ("train", "validation", "test"))
    assert a["validation"] and a["test"]
    assert not train & val and not train & test and not val & test
    assert len(train) + len(val) + len(test) == total


# --------------------------------------------------------------------------------------------
# The floor: each split's own, on the tokens the model sees


def prepared(*extra, scfg=SMALL):
    cfg = load_config(None, ["train.max_steps=1", "model.block_size=16", "tokenizer.kind=word", *extra,
                             *(f"data.synthetic.{k}={v}" for k, v in scfg.__dict__.items())])
    return prepare_data(cfg, progress=False)


def explicit_floor(lang, tokens, tokenizer):
    """-log P(token_t | tokens_<t) summed over t = 1..n-1, the obvious way: token strings, a loop
    over tokens and explicit sums over classes. <eot> costs 0 and leaves the class chain alone;
    <unk> is emitted by class c with the total probability of its words the tokenizer lacks."""
    C = lang.n_classes
    index = {w: i for i, w in enumerate(lang.words)}
    vocab = {tokenizer.decode([i]) for i in range(tokenizer.vocab_size)}
    unk_mass = [0.0] * C
    for w, i in index.items():
        if w not in vocab:
            unk_mass[lang.word_class[i]] += lang.emission[i]
    belief = list(lang.stationary)  # the class of the next word, given everything before it
    total = 0.0
    for t, token in enumerate(tokenizer.decode([int(i)]) for i in tokens):
        if token == "<eot>":
            continue
        if token == "<unk>":
            joint = [belief[c] * unk_mass[c] for c in range(C)]
        else:
            w = index[token]
            joint = [belief[c] * lang.emission[w] if lang.word_class[w] == c else 0.0 for c in range(C)]
        p = sum(joint)
        if t >= 1:  # token 0 is context only, as in the model's evaluation
            total -= math.log(p)
        belief = [sum(joint[a] / p * lang.transitions[a][b] for a in range(C)) for b in range(C)]
    return total / (len(tokens) - 1)


@pytest.mark.parametrize("extra", [[], ["data.max_eval_tokens=500"], ["tokenizer.vocab_size=120"]])
def test_split_floor_equals_an_independent_computation(extra):
    """Whole splits, splits cut by a token limit, and a word tokenizer too small for the language."""
    p = prepared(*extra)
    lang = builtin.synthetic_language(SMALL)
    for name in ("validation", "test"):
        s, f = p.splits[name], p.floor["splits"][name]
        want = explicit_floor(lang, np.asarray(s.tokens), p.tokenizer)
        assert f["tokens"] == len(s.tokens) - 1
        assert f["nats_per_token"] == pytest.approx(want, rel=1e-9)
        assert f["perplexity"] == pytest.approx(math.exp(want), rel=1e-9)
        assert f["bits_per_byte"] == pytest.approx(want * f["tokens"] / math.log(2) / (s.n_bytes * f["tokens"] / len(s.tokens)))
        unk = int(np.count_nonzero(np.asarray(s.tokens)[1:] == p.tokenizer.unk_id))
        assert f["unk_tokens"] == unk and f["label"] == ("best achievable" if unk else "split floor")
    if extra == ["tokenizer.vocab_size=120"]:
        assert p.floor["with_unk"] and p.floor["unk_words"] == SMALL.vocab_size - 118


def test_unk_forward_pass_equals_brute_force_on_a_tiny_language():
    """-log P(x_t | x_<t) = -log P(x_<=t) + log P(x_<t), each a sum over every class path."""
    import itertools

    cfg = SyntheticConfig(vocab_size=12, n_classes=3, successors=2, zipf=1.0, seed=5)
    lang = builtin.synthetic_language(cfg)
    unk_words = np.zeros(12, dtype=bool)
    unk_words[[4, 6, 7, 9, 10, 11]] = True
    ids = lang.sample(9, np.random.default_rng(3))
    codes = np.where(unk_words[ids], builtin.UNK, ids)
    codes[0], codes[4], codes[5] = builtin.UNK, builtin.UNK, builtin.UNK  # runs of UNKs, one at the start

    def emit(code, c):
        if code == builtin.UNK:
            return sum(lang.emission[w] for w in range(12) if unk_words[w] and lang.word_class[w] == c)
        return lang.emission[code] if lang.word_class[code] == c else 0.0

    def prob(prefix):
        total = 0.0
        for path in itertools.product(range(3), repeat=len(prefix)):
            p = lang.stationary[path[0]]
            for t, (code, c) in enumerate(zip(prefix, path)):
                p *= (lang.transitions[path[t - 1], c] if t else 1.0) * emit(code, c)
            total += p
        return total

    with np.errstate(divide="ignore"):
        brute = [-math.log(prob(codes[:t + 1]) / (prob(codes[:t]) if t else 1.0)) for t in range(len(codes))]
    np.testing.assert_allclose(lang.stream_nll(codes, unk_words), brute, rtol=1e-10)


def test_the_unk_floor_is_below_the_true_model_and_never_printed_as_a_higher_floor():
    from tiedlm.runs import human_report

    p = prepared("tokenizer.vocab_size=120")
    lang = builtin.synthetic_language(SMALL)
    index = {w: i for i, w in enumerate(lang.words)}
    texts = builtin.synthetic_splits(SMALL)
    final = {}
    for name in ("validation", "test"):
        f = p.floor["splits"][name]
        true_model = -lang.log_probs(np.array([index[w] for w in texts[name].split()])).sum() / f["tokens"]
        assert f["label"] == "best achievable" and f["unk_tokens"] > 0
        assert f["nats_per_token"] < true_model  # <unk> merges words: a lower loss is achievable
        assert f["nats_per_token"] < p.floor["nats_per_word"]
        final[name] = {"tokens": f["tokens"], "loss": 5.0, "perplexity": math.exp(5.0)}
    md = "\n".join(human_report._final_md(final, p.floor))
    header, _, *rows = [line for line in md.splitlines() if line.startswith("|")]
    cols = [c.strip() for c in header.strip("|").split("|")]
    assert "best achievable perplexity" in cols and not any("floor" in c for c in cols)
    for row in rows:
        cells = [c.strip() for c in row.strip("|").split("|")]
        shown = float(cells[cols.index("best achievable perplexity")].replace(",", ""))
        assert shown == pytest.approx(p.floor["splits"][cells[0]]["perplexity"], abs=0.006)
    assert "Best achievable" in md and "not a bound on this split" in md


def test_the_split_floor_is_what_a_perfect_model_scores_and_differs_a_little_from_the_rate():
    from tiedlm.evaluate import summarize_nll

    scfg = SyntheticConfig(**{**SMALL.__dict__, "train_tokens": 300_000, "validation_tokens": 20_000})
    p = prepared(scfg=scfg)
    lang = builtin.synthetic_language(scfg)
    index = {w: i for i, w in enumerate(lang.words)}
    s, f = p.splits["validation"], p.floor["splits"]["validation"]
    assert s.oov_rate == 0 and f["label"] == "split floor"
    words = np.array([index[w] for w in builtin.synthetic_splits(scfg)["validation"].split()])
    nll = np.append(-lang.log_probs(words), 0.0)  # the true model on targets 1..n-1; the final EOT is certain
    perfect = summarize_nll(np.asarray(s.tokens)[1:], nll, len(s.tokens), s.n_bytes, s.n_words)
    assert perfect["loss"] == pytest.approx(f["nats_per_token"], rel=1e-9)
    assert perfect["perplexity"] == pytest.approx(f["perplexity"], rel=1e-9)
    assert perfect["bits_per_byte"] == pytest.approx(f["bits_per_byte"], rel=1e-9)
    assert perfect["word_perplexity"] == pytest.approx(f["word_perplexity"], rel=1e-9)
    h = p.floor["nats_per_word"]
    assert f["nats_per_token"] != h and abs(f["nats_per_token"] - h) < 0.03 * h


def test_end_of_text_costs_nothing_only_where_the_generator_puts_it():
    lang = builtin.synthetic_language(SMALL)
    words = lang.sample(40, np.random.default_rng(1))
    E = builtin.EOT
    lines = np.concatenate([np.append(words[i:i + 16], E) for i in range(0, 40, 16)])  # 16, 16, 8 words
    s = builtin.FloorStream(lines, True, len(lines), 1000, 43)
    f = builtin.split_floor(lang, s)
    assert f["nats_per_token"] == pytest.approx(-lang.log_probs(words).sum() / (len(lines) - 1))  # chain goes on
    cut = builtin.FloorStream(lines[:-4], True, len(lines) - 4, 1000, 39)  # a limit cut the last line short
    assert builtin.split_floor(lang, cut) is not None
    ragged = np.concatenate([np.append(words[:10], E), np.append(words[10:40], E)])  # 10 then 30 words
    assert builtin.split_floor(lang, builtin.FloorStream(ragged, True, len(ragged), 1000, 42)) is None


def test_a_byte_tokenizer_gets_the_text_floor_over_its_tokens():
    p = prepared("tokenizer.kind=byte")
    lang = builtin.synthetic_language(SMALL)
    index = {w: i for i, w in enumerate(lang.words)}
    words = np.array([index[w] for w in builtin.synthetic_splits(SMALL)["validation"].split()])
    f = p.floor["splits"]["validation"]
    assert f["tokens"] == len(p.splits["validation"].tokens) - 1 and not f["per_token"]
    total = -lang.log_probs(words).sum()  # words 1..N-1 given their predecessors: all but the first word
    assert f["nats_per_token"] * f["tokens"] == pytest.approx(total, rel=1e-9)
