"""analyze/geometry.py against independent computations: scipy's Spearman, naive n x n CKA, an explicit
V x V bilinear form and full-vocabulary log-softmax; rotations that every alignment measure must
see through, isotropic and offset matrices for anisotropy."""

from __future__ import annotations

import math
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F

from tiedlm.analyze.geometry import (
    aligned_cosines,
    anisotropy,
    bilinear_symmetry,
    direct_path_nll,
    effective_rank,
    knn_overlap,
    linear_cka,
    pair_cosines,
    procrustes,
    relative_drift,
    row_norms,
    singular_values,
    spearman,
)

scipy_stats = pytest.importorskip("scipy.stats")  # the cross-check only; tiedlm itself needs no scipy


def gaussian(*shape: int, seed: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=dtype)


def orthogonal(d: int, seed: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    q, r = torch.linalg.qr(gaussian(d, d, seed=seed, dtype=torch.float64))
    return (q * torch.sign(torch.diagonal(r))).to(dtype)


def naive_cka(X: torch.Tensor, Y: torch.Tensor) -> float:
    """HSIC(K, L) / sqrt(HSIC(K, K) HSIC(L, L)), K = X Xᵀ and L = Y Yᵀ the n x n Gram matrices, centred."""
    def centred_gram(A: torch.Tensor) -> torch.Tensor:
        K = A.double() @ A.double().T
        return K - K.mean(0, keepdim=True) - K.mean(1, keepdim=True) + K.mean()

    K, L = centred_gram(X), centred_gram(Y)
    return float((K * L).sum() / torch.sqrt((K * K).sum() * (L * L).sum()))


# ------------------------------------------------------------------ spearman, norms, drift


def test_spearman_matches_scipy_with_ties():
    for seed in range(5):
        g = torch.Generator().manual_seed(seed)
        x = torch.randint(0, 8, (150,), generator=g).double()
        y = x + torch.randint(0, 6, (150,), generator=g).double()  # correlated, both with many ties
        expected = scipy_stats.spearmanr(x.numpy(), y.numpy()).statistic
        assert spearman(x, y) == pytest.approx(expected, abs=1e-12)
        assert spearman(x.tolist(), (-y).tolist()) == pytest.approx(-expected, abs=1e-12)
    assert spearman([1, 2, 3, 4], [10, 20, 30, 1000]) == pytest.approx(1.0)
    assert math.isnan(spearman([1, 2, 3], [5, 5, 5]))


def test_row_norms_and_pair_cosines_with_zero_rows():
    E = gaussian(6, 4, seed=0)
    W = 3 * E
    W[1] = -W[1]
    E[4] = 0
    assert torch.allclose(row_norms(E), E.norm(dim=1))
    cos = pair_cosines(E, W)
    expected = torch.tensor([1.0, -1.0, 1.0, 1.0, 0.0, 1.0])
    assert torch.allclose(cos, expected, atol=1e-6)


def test_relative_drift():
    E = gaussian(100, 16, seed=1)
    assert relative_drift(E, E) == 0.0
    assert relative_drift(E, 2 * E) == pytest.approx(1.0, abs=1e-12)
    assert relative_drift(E, torch.zeros_like(E)) == pytest.approx(1.0, abs=1e-12)


# ------------------------------------------------------------------ rotations and CKA


def test_rotation_is_seen_through_by_alignment():
    E = gaussian(800, 64, seed=2)
    R = orthogonal(64, seed=3)
    W = E @ R
    assert abs(float(pair_cosines(E, W).mean())) < 0.5
    assert torch.allclose(aligned_cosines(E, W), torch.ones(800), atol=1e-4)
    assert torch.allclose(procrustes(E, W), R, atol=1e-4)
    assert linear_cka(E, W) == pytest.approx(1.0, abs=1e-5)


def test_fast_cka_equals_naive_gram_formula():
    X = gaussian(300, 12, seed=4, dtype=torch.float64) + 5.0  # offsets: the columns must be centred
    Y = X[:, :7] @ gaussian(7, 20, seed=5, dtype=torch.float64)
    Y = Y + gaussian(300, 20, seed=6, dtype=torch.float64)
    value = linear_cka(X, Y)
    assert 0.2 < value < 0.99
    assert value == pytest.approx(naive_cka(X, Y), abs=1e-9)


def test_cka_of_independent_gaussians():
    """For independent isotropic Gaussians (n rows, d columns, centred: Wishart with m = n − 1
    degrees of freedom), E‖YᵀX‖_F² = d² m and E‖XᵀX‖_F² = d m (m + d + 1), so linear CKA ≈ d / (n + d)."""
    n, d = 2000, 64
    X, Y = gaussian(n, d, seed=7, dtype=torch.float64), gaussian(n, d, seed=8, dtype=torch.float64)
    fast = linear_cka(X, Y)
    assert fast == pytest.approx(naive_cka(X, Y), abs=1e-6)
    expected = d / (n + d)
    draws = [naive_cka(gaussian(n, d, seed=10 + 2 * i), gaussian(n, d, seed=11 + 2 * i)) for i in range(3)]
    assert sum(draws) / 3 == pytest.approx(expected, rel=0.1)
    assert fast == pytest.approx(expected, rel=0.1)


# ------------------------------------------------------------------ anisotropy and rank


def test_isotropic_gaussian_is_isotropic():
    V, d = 4000, 64
    M = gaussian(V, d, seed=9)
    a = anisotropy(M, n_pairs=20000, seed=0)
    assert a["pairs"] == 20000
    assert abs(a["mean_cosine"]) < 0.02
    assert 1 / d < a["top_pc_share"] < 1.5 / d
    assert a["mean_direction_share"] < 0.01
    assert effective_rank(singular_values(M)) > 0.95 * d
    assert anisotropy(M, seed=0) == a  # the seed decides


def test_common_offset_is_anisotropic():
    V, d, c = 4000, 64, 50.0
    M = gaussian(V, d, seed=9) + c * F.normalize(gaussian(d, seed=10), dim=0)
    a = anisotropy(M, n_pairs=5000, seed=1)
    assert a["mean_cosine"] > 0.95
    assert a["mean_direction_share"] == pytest.approx(c**2 / (c**2 + d), abs=0.01)
    assert a["top_pc_share"] < 1.5 / d  # the offset is removed by centring

    M[::2] = 0  # rows of zero norm take no part in the pairs, but count in the means
    a = anisotropy(M, n_pairs=5000, seed=1)
    assert a["mean_cosine"] > 0.95
    assert a["mean_direction_share"] == pytest.approx(0.5 * c**2 / (c**2 + d), abs=0.01)
    assert a["top_pc_share"] > 0.9  # centred, the zero rows and the offset rows are one direction apart


def test_anisotropy_pairs_are_distinct_rows():
    M = torch.zeros(10, 3)
    M[2, 0], M[7, 0] = 1.0, -1.0  # two nonzero rows, opposite: every pair of distinct rows has cos −1
    assert anisotropy(M, n_pairs=100, seed=0)["mean_cosine"] == pytest.approx(-1.0)


def test_sampling_leaves_the_global_rng_alone():
    torch.manual_seed(123)
    state = torch.get_rng_state()
    M = gaussian(200, 8, seed=0)
    anisotropy(M, n_pairs=500, seed=5)
    knn_overlap(M, M, k=3, sample=50, seed=5)
    assert torch.equal(torch.get_rng_state(), state)


def test_effective_rank():
    for r in (1, 3, 17):
        assert effective_rank([2.5] * r + [0.0] * 5) == pytest.approx(r, abs=1e-9)
    assert effective_rank([1.0, 0.0, 0.0]) == 1.0
    assert 1.0 < effective_rank([3.0, 1.0]) < 2.0
    Q = orthogonal(32, seed=11)
    low_rank = 4.0 * Q[:, :5] @ orthogonal(32, seed=12)[:5]  # rank 5, every singular value 4
    s = singular_values(low_rank)
    assert s == sorted(s, reverse=True) and s[0] == pytest.approx(4.0, abs=1e-4)
    assert effective_rank(s) == pytest.approx(5.0, abs=1e-4)


def test_singular_values_of_tall_and_wide_matrices():
    M = gaussian(300, 20, seed=13, dtype=torch.float64)
    expected = torch.linalg.svdvals(M).tolist()
    assert singular_values(M) == pytest.approx(expected, rel=1e-5)
    assert singular_values(M.T) == pytest.approx(expected, rel=1e-5)


# ------------------------------------------------------------------ neighbours


def test_knn_overlap():
    V, d = 1000, 32
    E = gaussian(V, d, seed=14)
    same = knn_overlap(E, E, k=10, sample=5000)
    assert same == {"mean": 1.0, "sampled": V, "k": 10}
    assert knn_overlap(E, E @ orthogonal(d, seed=15), k=10, sample=300)["mean"] == 1.0
    other = knn_overlap(E, gaussian(V, d, seed=16), k=10, sample=300, seed=1)
    assert other["sampled"] == 300
    assert other["mean"] < 0.1


def test_knn_overlap_matches_brute_force():
    V, d, k = 150, 8, 5
    E = gaussian(V, d, seed=17, dtype=torch.float64)
    W = E + 0.4 * gaussian(V, d, seed=18, dtype=torch.float64)

    def neighbours(M: torch.Tensor) -> list[set]:
        U = M / M.norm(dim=1, keepdim=True)
        S = U @ U.T
        S.fill_diagonal_(-math.inf)
        return [set(row.tolist()) for row in S.topk(k, dim=1).indices]

    expected = sum(len(a & b) for a, b in zip(neighbours(E), neighbours(W))) / (V * k)
    got = knn_overlap(E, W, k=k, sample=V)["mean"]
    assert 0.1 < got < 0.95
    assert got == pytest.approx(expected, abs=1e-12)


# ------------------------------------------------------------------ the direct path


def test_bilinear_symmetry_of_a_tied_model_is_one():
    E = gaussian(200, 16, seed=19)
    gain = gaussian(16, seed=20).abs() + 0.1
    for g in (None, gain):
        shares = bilinear_symmetry(E, E, g)
        assert shares["symmetric_share"] == pytest.approx(1.0, abs=1e-6)
        assert shares["antisymmetric_share"] == pytest.approx(0.0, abs=1e-6)


def test_bilinear_symmetry_matches_explicit_matrix():
    V, d = 50, 8
    E, W = gaussian(V, d, seed=21, dtype=torch.float64), gaussian(V, d, seed=22, dtype=torch.float64)
    W = W + 0.5 * E  # partly symmetric, so the shares are not near 1/2
    gain = gaussian(d, seed=23, dtype=torch.float64).abs() + 0.1
    for g in (None, gain):
        M = W @ torch.diag(torch.ones(d, dtype=torch.float64) if g is None else g) @ E.T
        total = float((M * M).sum())
        sym = float((((M + M.T) / 2) ** 2).sum()) / total
        anti = float((((M - M.T) / 2) ** 2).sum()) / total
        shares = bilinear_symmetry(E, W, g)
        assert 0.55 < sym < 0.99
        assert shares["symmetric_share"] == pytest.approx(sym, abs=1e-9)
        assert shares["antisymmetric_share"] == pytest.approx(anti, abs=1e-9)


def test_direct_path_nll_matches_full_log_softmax():
    V, d, N = 300, 16, 1000
    g = torch.Generator().manual_seed(24)
    E, W = gaussian(V, d, seed=25), gaussian(V, d, seed=26)
    ln_w, ln_b = gaussian(d, seed=27) * 0.5 + 1, gaussian(d, seed=28) * 0.1
    head_bias = gaussian(V, seed=29)
    prev = torch.randint(0, 60, (N,), generator=g)  # 60 distinct at most: many repeats
    nxt = torch.randint(0, V, (N,), generator=g)
    scale = math.sqrt(d)

    h = F.layer_norm(scale * E.double(), (d,), ln_w.double(), ln_b.double(), 1e-5)
    logp = F.log_softmax(h @ W.double().T + head_bias.double(), dim=1)
    expected = float(-logp[prev, nxt].mean())

    for chunk in (2048, 7):
        r = direct_path_nll(E, W, prev, nxt, ln_w, ln_b, scale=scale, head_bias=head_bias, chunk=chunk)
        assert r["nll"] == pytest.approx(expected, abs=1e-5)
        assert r["perplexity"] == pytest.approx(math.exp(r["nll"]))
        assert r["pairs"] == N
        assert r["distinct_prev"] == len(set(prev.tolist()))
    plain = direct_path_nll(E, W, prev, nxt, None, None)
    logp = F.log_softmax(F.layer_norm(E.double(), (d,)) @ W.double().T, dim=1)
    assert plain["nll"] == pytest.approx(float(-logp[prev, nxt].mean()), abs=1e-5)


def test_direct_path_nll_refuses_bad_pairs():
    E = gaussian(20, 4, seed=30)
    with pytest.raises(ValueError):
        direct_path_nll(E, E, torch.tensor([1, 2]), torch.tensor([3]), None, None)
    with pytest.raises(ValueError):
        direct_path_nll(E, E, torch.tensor([1, 20]), torch.tensor([3, 4]), None, None)


def test_importing_geometry_does_not_import_torch():
    code = "import sys, tiedlm.analyze.geometry; sys.exit('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0
