"""Perplexity arithmetic, window coverage, buckets — against independent computations."""

import math

import numpy as np
import pytest
import torch

from tiedlm.evaluate import frequency_buckets, mass_buckets, mean_perplexity, score_tokens, summarize_nll, windows


class UniformLM(torch.nn.Module):
    """Logits all zero: every token has probability 1/V."""

    def __init__(self, V):
        super().__init__()
        self.V = V

    def forward(self, idx):
        return torch.zeros(*idx.shape, self.V)


class BigramLM(torch.nn.Module):
    """Logits depend only on the previous token, so the score is independent of context length."""

    def __init__(self, V):
        super().__init__()
        g = torch.Generator().manual_seed(0)
        self.table = torch.randn(V, V, generator=g)

    def forward(self, idx):
        return self.table[idx]


def test_perplexity_is_exp_mean_nll():
    assert mean_perplexity(0.0, 10) == 1.0
    assert mean_perplexity(10 * math.log(7), 10) == pytest.approx(7.0)


@pytest.mark.parametrize("n, T, s", [(2, 4, 4), (10, 4, 4), (101, 8, 8), (101, 8, 3), (57, 16, 1), (9, 4, 2)])
def test_windows_score_every_target_once(n, T, s):
    seen = np.zeros(n, dtype=int)
    for start, length, first in windows(n, T, s):
        assert 1 <= length <= T and 0 <= first < length
        seen[start + 1 + first:start + 1 + length] += 1
    assert seen[0] == 0 and (seen[1:] == 1).all()


def test_uniform_logits_give_perplexity_V():
    V = 50
    tokens = np.random.default_rng(0).integers(0, V, 1000)
    targets, nll = score_tokens(UniformLM(V), tokens, block_size=16, stride=16, batch_size=7, device="cpu")
    assert len(nll) == 999
    res = summarize_nll(targets, nll, len(tokens))
    assert res["perplexity"] == pytest.approx(V, rel=1e-6)  # fp32 log-softmax


def test_scores_match_direct_computation_for_any_stride():
    V = 11
    model = BigramLM(V)
    tokens = np.random.default_rng(1).integers(0, V, 300)
    logp = torch.log_softmax(model.table, dim=-1).double().numpy()
    direct = -logp[tokens[:-1], tokens[1:]]
    for stride in (16, 5, 1):
        targets, nll = score_tokens(model, tokens, block_size=16, stride=stride, batch_size=4, device="cpu")
        np.testing.assert_allclose(nll, direct, rtol=1e-5)
        assert (targets == tokens[1:]).all()


def test_bits_per_byte_and_word_perplexity():
    nll = np.full(99, math.log(4.0))  # 2 bits per token
    res = summarize_nll(np.zeros(99, dtype=int), nll, n_tokens=100, n_bytes=400, n_words=50)
    # 99 predicted of 100 tokens -> 396 bytes and 49.5 words apportioned
    assert res["bits_per_byte"] == pytest.approx(99 * 2 / 396)
    assert res["word_perplexity"] == pytest.approx(math.exp(99 * math.log(4) / 49.5))


def test_frequency_buckets():
    counts = np.array([0, 50, 40, 30, 20, 10, 9, 8, 7, 6, 5, 0])  # 10 seen types, 2 unseen
    bucket, names = frequency_buckets(counts, [0.1, 0.5])
    assert names == ["top 10%", "next 40%", "rest 50%", "unseen"]
    assert bucket[1] == 0
    assert list(bucket[2:6]) == [1, 1, 1, 1]
    assert list(bucket[6:11]) == [2] * 5
    assert bucket[0] == 3 and bucket[11] == 3


def test_bucket_losses_are_means_within_bucket():
    counts = np.array([100, 1, 0, 0])
    targets = np.array([0, 0, 1, 2, 3])
    nll = np.array([1.0, 3.0, 5.0, 7.0, 9.0])
    res = summarize_nll(targets, nll, 6, train_counts=counts, fractions=[0.5])
    by = {b["name"]: b for b in res["buckets"]}
    assert by["top 50%"]["loss"] == 2.0 and by["top 50%"]["tokens"] == 2
    assert by["rest 50%"]["loss"] == 5.0
    assert by["unseen"]["loss"] == 8.0 and by["unseen"]["tokens"] == 2
    total = sum(b["loss"] * b["tokens"] for b in res["buckets"])
    assert total == pytest.approx(nll.sum())


def test_unk_gets_a_bucket_of_its_own_and_is_not_ranked():
    counts = np.array([500, 0, 50, 40, 30, 20, 10, 9, 8, 7, 6, 5, 0])  # id 0: <unk>, the most frequent
    bucket, names = frequency_buckets(counts, [0.1, 0.5], unk_id=0)
    assert names == ["top 10%", "next 40%", "rest 50%", "unseen", "<unk>"]
    assert bucket[0] == 4 and bucket[2] == 0  # 10 ranked types: id 2 alone is the top 10%
    assert list(bucket[3:7]) == [1] * 4 and list(bucket[7:12]) == [2] * 5 and bucket[1] == bucket[12] == 3
    without, names = frequency_buckets(counts, [0.1, 0.5])  # no unk_id: <unk> is ranked like any token
    assert "<unk>" not in names and without[0] == 0


def test_mass_buckets_hold_shares_of_the_training_tokens():
    counts = np.array([0, 40, 30, 10, 8, 6, 3, 2, 1, 0, 100])  # id 10: <unk>; the others 100 tokens
    bucket, names = mass_buckets(counts, [0.3, 0.7], unk_id=10)
    assert names == ["top 30% of tokens", "next 40% of tokens", "rest 30% of tokens", "unseen", "<unk>"]
    # by hand: the middle of each type's mass, 20, 55, 75, 84, 91, 95.5, 98, 99.5 (% of 100), against 30 and 70
    want = {1: 0, 2: 1, 3: 2, 4: 2, 5: 2, 6: 2, 7: 2, 8: 2, 0: 3, 9: 3, 10: 4}
    assert {i: int(b) for i, b in enumerate(bucket)} == want


def test_summarize_nll_gives_both_kinds_of_buckets():
    counts = np.array([7, 60, 25, 5, 3, 0])  # id 0: <unk>
    targets = np.array([0, 1, 1, 2, 3, 4, 5, 0])
    nll = np.arange(1.0, 9.0)
    res = summarize_nll(targets, nll, 9, train_counts=counts, fractions=[0.5], unk_id=0)
    assert set(res["buckets"][0]) == {"name", "tokens", "loss", "perplexity"}  # the keys compare reads
    for key in ("buckets", "mass_buckets"):
        by = {b["name"].split(" of")[0]: b for b in res[key]}
        assert by["<unk>"]["tokens"] == 2 and by["<unk>"]["loss"] == pytest.approx(4.5)
        assert sum(b["loss"] * b["tokens"] for b in res[key] if b["tokens"]) == pytest.approx(nll.sum())
    mass = {b["name"]: b for b in res["mass_buckets"]}
    assert mass["top 50% of tokens"]["tokens"] == 2 and mass["rest 50% of tokens"]["tokens"] == 3  # ids 1 | 2, 3, 4
    assert mass["top 50% of tokens"]["train_share"] == pytest.approx(0.6)
    assert mass["<unk>"]["train_share"] == pytest.approx(0.07)
    assert sum(b["train_share"] for b in res["mass_buckets"]) == pytest.approx(1.0)
