"""A loss in nats as people read it: the one place each of these is computed.

- `perplexity(loss)`: exp(loss), the perplexity of a mean NLL per token. A finite loss whose
  exponential is past the largest float (loss ≥ ln(max float) ≈ 709.78 nats; the uniform
  distribution over V tokens is ln V, about 10) is an explicit overflow, math.inf: JSON writes it
  as null (files.strict_json) and text as "∞" (formatting.fmt); it never raises.
- `relative(delta)`: exp(Δloss) − 1, the ratio of two perplexities less one, the project's
  relative effect (None where it has none).
- `bits_per_byte(nats, n_bytes)`: a total loss in nats over text of n_bytes UTF-8 bytes, in bits
  per byte (the measure that reads across tokenizers); None without bytes.
- `representable(loss)`: whether a loss still has a perplexity; a training or validation loss that
  does not stops the run as diverged.

Pure functions of plain floats; no tiedlm module is imported here."""

from __future__ import annotations

import math
import sys

LN2 = math.log(2.0)
MAX_LOSS = math.log(sys.float_info.max)  # ≈ 709.78 nats: exp() of anything larger overflows


def representable(loss: float | None) -> bool:
    """A real number whose perplexity is a finite float (False for None, nan and ±inf)."""
    return loss is not None and not isinstance(loss, bool) and -math.inf < loss < MAX_LOSS


def perplexity(loss: float | None) -> float | None:
    """exp(loss); math.inf when that overflows, nan for nan, None for None."""
    if loss is None:
        return None
    if math.isnan(loss):
        return math.nan
    return math.exp(loss) if loss < MAX_LOSS else math.inf


def relative(delta: float | None) -> float | None:
    """exp(delta) − 1 (the relative effect of a loss difference); None for None, nan, and a
    difference too large to have one (an interval's unbounded end, shown as a dash)."""
    if not representable(delta):
        return None
    return math.exp(delta) - 1.0


def bits_per_byte(nats: float, n_bytes: float | None) -> float | None:
    """A total loss of `nats` over text of n_bytes UTF-8 bytes, in bits per byte; None without bytes."""
    return nats / LN2 / n_bytes if n_bytes else None
