"""Which weights hold nan or inf: the one check behind a run's checkpoint (runs/checkpoints.py:
sample, eval, analyze and export refuse it) and a pretrained start (model/hf_model.py: training
refuses it before its first step, where it would read as a divergence)."""

from __future__ import annotations

from typing import Iterable


def not_finite(named: Iterable) -> list[tuple[str, str, int]]:
    """(name, "nan" or "inf", how many values are not finite) for each floating-point tensor of
    `named`, (name, tensor) pairs, that holds any, in their order."""
    import torch

    found = []
    for name, t in named:
        if t.is_floating_point() and not bool(torch.isfinite(t).all()):
            found.append((name, "nan" if bool(torch.isnan(t).any()) else "inf", int((~torch.isfinite(t)).sum())))
    return found
