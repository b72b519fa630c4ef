"""The geometry of a model's embedding matrix E and output projection W_out (both V x d): pure
functions of matrices, for comparing a tied model (W_out = E) with an untied one.

- row_norms, pair_cosines, relative_drift: per-token norms, the cosine of E[t] with W[t], and
  ‖E − W‖_F / ‖E‖_F;
- anisotropy, singular_values, effective_rank: how much the rows share one direction (Gao et al.
  2019, Ethayarajh 2019) and how many directions the matrix uses (Roy & Vetterli 2007);
- procrustes, aligned_cosines, linear_cka, knn_overlap: whether E and W are the same geometry up
  to a rotation (Schönemann 1966), up to a linear map (Kornblith et al. 2019), or by neighbours;
- bilinear_symmetry: how symmetric the direct-path bigram form W · diag(gain) · Eᵀ is (it is
  exactly symmetric for a tied model);
- final_norm, direct_path_nll: the model's final norm (LayerNorm, GPT-2; RMSNorm, Llama), and the
  loss of the direct-path bigram model through it on (prev → next) token pairs;
- spearman: rank correlation, e.g. of the row norms with token frequency.

V x d products are computed in float32 (float64 inputs stay float64), small d x d matrices and
scalar reductions in float64; results are Python floats, lists, dicts or torch tensors. Nothing
forms a V x V matrix. Sampling functions take a seed and use their own torch.Generator. torch is
imported inside the functions, so importing this module costs nothing.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Sequence

from ..perplexity import perplexity

if TYPE_CHECKING:
    import torch

QUERY_CHUNK = 512  # knn_overlap: queries per similarity block (512 x V at a time)
PAIR_CHUNK = 65536  # direct_path_nll: pairs per target-logit block


# ============================================================================ helpers


def _matrix(M: torch.Tensor, name: str = "M") -> torch.Tensor:
    """M as a detached 2-D float tensor: float32, or float64 when it is float64."""
    import torch

    M = torch.as_tensor(M).detach()
    if M.dim() != 2:
        raise ValueError(f"{name} must be a 2-D matrix, got shape {tuple(M.shape)}")
    if not M.is_floating_point() or M.dtype != torch.float64:
        M = M.float()
    return M


def _pair(E: torch.Tensor, W: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """E and W as matrices of the same shape and working dtype (float64 when either is)."""
    E, W = _matrix(E, "E"), _matrix(W, "W")
    if E.shape != W.shape:
        raise ValueError(f"E and W must have the same shape, got {tuple(E.shape)} and {tuple(W.shape)}")
    if E.dtype != W.dtype:
        E, W = E.double(), W.double()
    if W.device != E.device:
        W = W.to(E.device)
    return E, W


def _generator(seed: int) -> torch.Generator:
    import torch

    return torch.Generator().manual_seed(int(seed))


def _sq_norm(M: torch.Tensor) -> float:
    """‖M‖_F², summed in float64."""
    import torch

    return float(M.square().sum(dtype=torch.float64))


def _unit_rows(M: torch.Tensor) -> torch.Tensor:
    """Each row divided by its norm; rows of zero norm stay zero."""
    n = row_norms(M)
    return M / n.masked_fill(n == 0, 1.0).unsqueeze(1)


# ============================================================================ norms and ranks


def row_norms(M: torch.Tensor) -> torch.Tensor:
    """The Euclidean norm ‖M[t]‖₂ of each row, shape (V,)."""
    import torch

    return torch.linalg.vector_norm(_matrix(M), dim=1)


def spearman(x: Sequence[float] | torch.Tensor, y: Sequence[float] | torch.Tensor) -> float:
    """Spearman's rank correlation, scipy.stats.spearmanr's (ties at average ranks), of two 1-D
    sequences or tensors; nan when either side is constant, has fewer than 2 values or a nan."""
    import numpy as np
    from scipy import stats

    x = np.asarray(x.detach().cpu().double() if hasattr(x, "detach") else x, dtype=float).reshape(-1)
    y = np.asarray(y.detach().cpu().double() if hasattr(y, "detach") else y, dtype=float).reshape(-1)
    if x.size != y.size:
        raise ValueError(f"x and y must have the same length, got {x.size} and {y.size}")
    if x.size < 2 or np.isnan(x).any() or np.isnan(y).any() or np.ptp(x) == 0 or np.ptp(y) == 0:
        return math.nan
    return float(stats.spearmanr(x, y).statistic)


# ============================================================================ one matrix


def anisotropy(M: torch.Tensor, n_pairs: int = 20000, seed: int = 0) -> dict:
    """How much the rows of M point one way (Ethayarajh 2019; Gao et al. 2019, representation
    degeneration). Returns
    - mean_cosine: the mean cos(M[i], M[j]) over n_pairs random pairs of distinct rows i ≠ j
      (pairs drawn independently, with replacement; rows of zero norm excluded; nan with < 2 rows);
    - top_pc_share: λ₁ / Σλ, the share of variance along the top principal direction of the centred
      rows, λ = s² the squared singular values of M − mean (eigenvalues of (M − mean)ᵀ(M − mean));
    - mean_direction_share: ‖mean row‖² / mean ‖row‖² (1 when every row is the same vector);
    - pairs: n_pairs.
    """
    import torch

    if n_pairs < 1:
        raise ValueError(f"n_pairs must be at least 1, got {n_pairs}")
    M = _matrix(M)
    V = M.shape[0]
    if V == 0:
        raise ValueError("M has no rows")
    norms = row_norms(M)
    rows = torch.nonzero(norms > 0).flatten()
    n = rows.numel()
    mean_cosine = math.nan
    if n >= 2:
        g = _generator(seed)
        i = torch.randint(n, (n_pairs,), generator=g)
        j = torch.randint(n - 1, (n_pairs,), generator=g)
        j = j + (j >= i).long()  # uniform over the rows other than i
        i, j = rows[i.to(M.device)], rows[j.to(M.device)]
        cos = (M[i] * M[j]).sum(1) / norms[i] / norms[j]
        mean_cosine = float(cos.clamp(-1.0, 1.0).mean(dtype=torch.float64))

    mean = M.sum(0, dtype=torch.float64) / V
    centred = M - mean.to(M.dtype)
    eig = torch.linalg.eigvalsh((centred.T @ centred).double()).clamp_min(0)
    total = float(eig.sum())
    top_pc_share = float(eig[-1]) / total if total > 0 else math.nan
    mean_sq = float(norms.double().square().mean())
    mean_direction_share = float(mean.square().sum()) / mean_sq if mean_sq > 0 else math.nan
    return {"mean_cosine": mean_cosine, "top_pc_share": top_pc_share,
            "mean_direction_share": mean_direction_share, "pairs": int(n_pairs)}


def singular_values(M: torch.Tensor) -> list[float]:
    """The singular values of M, descending (torch.linalg.svdvals in float32). A tall M (V > d) is
    first reduced to the d x d R of M = QR, which has the same singular values (5x faster at V = 50k)."""
    import torch

    M = _matrix(M).float()
    if M.shape[0] > M.shape[1]:
        M = torch.linalg.qr(M, mode="r").R
    return [float(s) for s in torch.linalg.svdvals(M).tolist()]


def effective_rank(s: Sequence[float]) -> float:
    """Roy & Vetterli (2007): exp(H(p)), p_i = s_i / Σ_j s_j, H = −Σ p_i log p_i in nats (0·log 0 = 0).
    r equal nonzero values give r; nan when every value is 0."""
    values = [float(v) for v in s]
    if any(v < 0 or math.isnan(v) for v in values):
        raise ValueError("singular values must be non-negative numbers")
    total = math.fsum(values)
    if total == 0:
        return math.nan
    return math.exp(-math.fsum(v / total * math.log(v / total) for v in values if v > 0))


# ============================================================================ E against W


def pair_cosines(E: torch.Tensor, W: torch.Tensor) -> torch.Tensor:
    """cos(E[t], W[t]) = ⟨E[t], W[t]⟩ / (‖E[t]‖ ‖W[t]‖) for each row t, shape (V,); 0 where either
    row is 0."""
    import torch

    E, W = _pair(E, W)
    ne, nw = row_norms(E), row_norms(W)
    ok = (ne > 0) & (nw > 0)
    cos = (E * W).sum(1) / ne.masked_fill(~ok, 1.0) / nw.masked_fill(~ok, 1.0)
    return torch.where(ok, cos.clamp(-1.0, 1.0), torch.zeros_like(cos))


def relative_drift(E: torch.Tensor, W: torch.Tensor) -> float:
    """‖E − W‖_F / ‖E‖_F (0 for a tied model); nan when E is 0."""
    E, W = _pair(E, W)
    base = _sq_norm(E)
    return math.sqrt(_sq_norm(E - W) / base) if base > 0 else math.nan


def procrustes(E: torch.Tensor, W: torch.Tensor) -> torch.Tensor:
    """The orthogonal d x d R minimising ‖E R − W‖_F (Schönemann 1966): R = U Vᵀ where
    Eᵀ W = U Σ Vᵀ (the SVD taken in float64)."""
    import torch

    E, W = _pair(E, W)
    U, _, Vh = torch.linalg.svd((E.T @ W).double())
    return (U @ Vh).to(E.dtype)


def aligned_cosines(E: torch.Tensor, W: torch.Tensor) -> torch.Tensor:
    """pair_cosines(E R, W) after the rotation R that maximises their mean: procrustes of the unit
    rows (a rotation keeps norms, so Σ⟨ê_t R, ŵ_t⟩ is the sum of the cosines). Fitted on the raw
    rows instead, the largest rows would decide the rotation."""
    E, W = _pair(E, W)
    return pair_cosines(E @ procrustes(_unit_rows(E), _unit_rows(W)), W)


def linear_cka(X: torch.Tensor, Y: torch.Tensor) -> float:
    """Linear CKA (Kornblith et al. 2019) of the rows of X (n x p) and Y (n x q), columns centred:
    ‖YᵀX‖_F² / (‖XᵀX‖_F ‖YᵀY‖_F), from p x q, p x p and q x q products only. nan when X or Y is
    constant."""
    import torch

    X, Y = _matrix(X, "X"), _matrix(Y, "Y")
    if X.shape[0] != Y.shape[0]:
        raise ValueError(f"X and Y must have the same number of rows, got {X.shape[0]} and {Y.shape[0]}")
    if X.dtype != Y.dtype:
        X, Y = X.double(), Y.double()
    Y = Y.to(X.device)
    X = X - (X.sum(0, dtype=torch.float64) / X.shape[0]).to(X.dtype)
    Y = Y - (Y.sum(0, dtype=torch.float64) / Y.shape[0]).to(Y.dtype)
    cross = _sq_norm((Y.T @ X).double())
    den = math.sqrt(_sq_norm((X.T @ X).double()) * _sq_norm((Y.T @ Y).double()))
    return cross / den if den > 0 else math.nan


def _neighbours(unit: torch.Tensor, queries: torch.Tensor, k: int) -> torch.Tensor:
    """The k rows of `unit` most cosine-similar to each query row, the query itself excluded."""
    import torch

    sims = unit[queries] @ unit.T
    sims[torch.arange(queries.numel(), device=sims.device), queries] = -math.inf
    return sims.topk(k, dim=1).indices


def knn_overlap(E: torch.Tensor, W: torch.Tensor, k: int = 10, sample: int = 2000, seed: int = 0) -> dict:
    """For `sample` tokens drawn without replacement (all of them when V ≤ sample), the k nearest
    neighbours by cosine among all V rows (the token itself excluded) in E and in W. Returns mean
    (the mean of |N_E(t) ∩ N_W(t)| / k), sampled (the number of tokens), k. Queries are scored
    QUERY_CHUNK at a time (a chunk x V block)."""
    import torch

    E, W = _pair(E, W)
    V = E.shape[0]
    if not 1 <= k < V:
        raise ValueError(f"k must be between 1 and V - 1 = {V - 1}, got {k}")
    if sample < 1:
        raise ValueError(f"sample must be at least 1, got {sample}")
    if V <= sample:
        queries = torch.arange(V)
    else:
        queries = torch.randperm(V, generator=_generator(seed))[:sample]
    queries = queries.to(E.device)
    ue, uw = _unit_rows(E), _unit_rows(W)
    shared = 0
    for start in range(0, queries.numel(), QUERY_CHUNK):
        q = queries[start:start + QUERY_CHUNK]
        ne, nw = _neighbours(ue, q, k), _neighbours(uw, q, k)
        shared += int((ne.unsqueeze(2) == nw.unsqueeze(1)).any(2).sum())
    n = queries.numel()
    return {"mean": shared / (n * k), "sampled": n, "k": int(k)}


def bilinear_symmetry(E: torch.Tensor, W: torch.Tensor, gain: torch.Tensor | None = None) -> dict:
    """How symmetric the direct-path bilinear form M = W · diag(gain) · Eᵀ (V x V; gain: the final
    norm's weight, LayerNorm's or RMSNorm's, default ones; the norm's per-token scale, and
    LayerNorm's centring and bias, are left out) is, without forming M. With G = diag(gain), in float64:
    ‖M‖_F² = tr(WᵀW G EᵀE G) and ⟨M, Mᵀ⟩ = tr(M M) = tr(C C), C = Eᵀ W G. Returns
    symmetric_share = ‖(M + Mᵀ)/2‖_F² / ‖M‖_F² = (1 + ⟨M, Mᵀ⟩/‖M‖_F²) / 2 and
    antisymmetric_share = ‖(M − Mᵀ)/2‖_F² / ‖M‖_F² (they sum to 1; nan when M = 0).
    A tied model (W = E) has symmetric_share 1."""
    import torch

    E, W = _pair(E, W)
    d = E.shape[1]
    g = torch.ones(d, dtype=torch.float64)
    if gain is not None:
        g = torch.as_tensor(gain).detach().to("cpu", torch.float64).reshape(-1)
        if g.numel() != d:
            raise ValueError(f"gain must have {d} values, got {g.numel()}")
    ee = (E.T @ E).double().cpu()
    ww = (W.T @ W).double().cpu()
    c = (E.T @ W).double().cpu() * g  # C = Eᵀ W G: column j scaled by g_j
    gg = torch.outer(g, g)
    norm_sq = float((ww * gg * ee.T).sum())  # tr(A G B G) = Σ_ij A_ij g_j B_ji g_i
    inner = float((c * c.T).sum())  # tr(C C) = Σ_ij C_ij C_ji
    if norm_sq <= 0:
        return {"symmetric_share": math.nan, "antisymmetric_share": math.nan}
    ratio = inner / norm_sq
    return {"symmetric_share": (1 + ratio) / 2, "antisymmetric_share": (1 - ratio) / 2}


# ============================================================================ the direct path


def _vector(v: torch.Tensor | None, n: int, name: str, like: torch.Tensor) -> torch.Tensor | None:
    """v as a length-n vector in like's dtype and device, or None."""
    import torch

    if v is None:
        return None
    v = torch.as_tensor(v).detach().to(like.device, like.dtype).reshape(-1)
    if v.numel() != n:
        raise ValueError(f"{name} must have {n} values, got {v.numel()}")
    return v


def _tokens(t: torch.Tensor, name: str, V: int, device: torch.device) -> torch.Tensor:
    """t as a 1-D int64 tensor of token ids in [0, V) on device."""
    import torch

    t = torch.as_tensor(t).detach().to(device, torch.int64)
    if t.dim() != 1:
        raise ValueError(f"{name} must be a 1-D tensor of token ids, got shape {tuple(t.shape)}")
    if t.numel() and (int(t.min()) < 0 or int(t.max()) >= V):
        raise ValueError(f"{name} has token ids outside [0, {V})")
    return t


NORMS = ("layernorm", "rmsnorm")  # the final norms direct_path_nll knows: GPT-2's, Llama's


def final_norm(x: torch.Tensor, norm: str, weight: torch.Tensor | None, bias: torch.Tensor | None,
               eps: float | None) -> torch.Tensor:
    """The final norm over the last dimension d of x, of the kind `norm`:
    - layernorm (GPT-2): torch.nn.functional.layer_norm, (x − mean) / sqrt(var + eps) · weight + bias;
    - rmsnorm (Llama): torch.nn.functional.rms_norm, x · rsqrt(mean(x²) + eps) · weight: no mean
      subtracted and no bias (a bias is refused).
    eps None is each module's default: 1e-5 (nn.LayerNorm), finfo(x.dtype).eps (nn.RMSNorm).
    weight None is ones, bias None zeros. Both are what nn.LayerNorm and nn.RMSNorm compute."""
    import torch.nn.functional as F

    d = x.shape[-1]
    if norm == "layernorm":
        return F.layer_norm(x, (d,), weight, bias, 1e-5 if eps is None else eps)
    if norm == "rmsnorm":
        if bias is not None:
            raise ValueError("an RMSNorm has no bias: give ln_bias None")
        return F.rms_norm(x, (d,), weight, eps)
    raise ValueError(f"norm must be one of {', '.join(NORMS)}, got {norm!r}")


def direct_path_nll(E: torch.Tensor, W: torch.Tensor, prev: torch.Tensor, nxt: torch.Tensor,
                    ln_weight: torch.Tensor | None, ln_bias: torch.Tensor | None, eps: float | None = 1e-5,
                    scale: float = 1.0, head_bias: torch.Tensor | None = None, chunk: int = 2048,
                    norm: str = "layernorm") -> dict:
    """The loss of the direct-path bigram model logits(t) = W · N(scale · E[t]) (+ head_bias), N the
    model's final norm over d (final_norm of the kind `norm`, with ln_weight, ln_bias, eps):
    layernorm (GPT-2, the default) or rmsnorm (Llama; ln_bias must be None), on the pairs
    prev[i] → nxt[i]: NLL = mean_i [logsumexp_v logits(prev[i])_v − logits(prev[i])_nxt[i]].
    Exact: the log-sum-exp is computed once per distinct prev token, `chunk` of them at a time
    (chunk x V logits), the target logit by a row-wise dot product. Returns nll (mean nats per
    pair), perplexity (exp nll), pairs (N), distinct_prev."""
    import torch

    if norm not in NORMS:
        raise ValueError(f"norm must be one of {', '.join(NORMS)}, got {norm!r}")
    if norm == "rmsnorm" and ln_bias is not None:
        raise ValueError("an RMSNorm has no bias: give ln_bias None")
    if chunk < 1:
        raise ValueError(f"chunk must be at least 1, got {chunk}")
    with torch.inference_mode():
        E, W = _pair(E, W)
        V, d = E.shape
        prev = _tokens(prev, "prev", V, E.device)
        nxt = _tokens(nxt, "nxt", V, E.device)
        if prev.numel() != nxt.numel():
            raise ValueError(f"prev and nxt must have the same length, got {prev.numel()} and {nxt.numel()}")
        if prev.numel() == 0:
            raise ValueError("no pairs to score")
        weight = _vector(ln_weight, d, "ln_weight", E)
        bias = _vector(ln_bias, d, "ln_bias", E)
        hb = _vector(head_bias, V, "head_bias", E)

        distinct, inverse = prev.unique(return_inverse=True)
        h = final_norm(E[distinct] * scale, norm, weight, bias, eps)
        lse = torch.empty(distinct.numel(), dtype=torch.float64, device=E.device)
        for start in range(0, distinct.numel(), chunk):
            logits = h[start:start + chunk] @ W.T
            if hb is not None:
                logits += hb
            lse[start:start + chunk] = torch.logsumexp(logits, dim=1)

        total = torch.zeros((), dtype=torch.float64, device=E.device)
        for start in range(0, prev.numel(), PAIR_CHUNK):
            inv, tgt = inverse[start:start + PAIR_CHUNK], nxt[start:start + PAIR_CHUNK]
            target = (h[inv] * W[tgt]).sum(1)
            if hb is not None:
                target = target + hb[tgt]
            total += (lse[inv] - target.double()).sum()
        nll = float(total) / prev.numel()
    return {"nll": nll, "perplexity": perplexity(nll), "pairs": int(prev.numel()), "distinct_prev": int(distinct.numel())}
