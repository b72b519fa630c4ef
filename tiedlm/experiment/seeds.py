"""How many seeds each variant trains: `--seeds N`, all at once, or `--seeds auto`, the sequential
design (its boundaries, decisions and record are the judging side's pure maths, compare/sequential.py):
SeedDesign is told whether each stage trained and the primary contrast so far, and says which
seeds to train next. It trains and reads nothing."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..compare.sequential import (
    FIRST_SEEDS,
    MAX_SEEDS,
    MAX_SEEDS_RANGE,
    MIN_EFFECT,
    Sequential,
    design,
    look_at,
    look_words,
    next_decision,
)
from ..compare.stats import ALPHA
from ..errors import ConfigError
from ..process import log

if TYPE_CHECKING:
    from ..compare.variants import SplitContrast


def check_auto(seeds: int | str, max_seeds: int | None, min_effect: float | None) -> tuple[int, float]:
    """Refuse what --seeds auto cannot take (ConfigError) and return (max_seeds, min_effect) with
    their defaults. --max-seeds and --min-effect need --seeds auto. With --match the design decides
    on the primary contrast, tied vs untied at equal architecture (Comparison.primary_contrast)."""
    if seeds != "auto" and (isinstance(seeds, bool) or not isinstance(seeds, int)):
        raise ConfigError(f"--seeds must be a whole number or auto, got {seeds!r}")
    if seeds != "auto":
        given = [o for o, x in (("--max-seeds", max_seeds), ("--min-effect", min_effect)) if x is not None]
        if given:
            verb = "apply" if len(given) > 1 else "applies"
            raise ConfigError(f"{' and '.join(given)} only {verb} with --seeds auto — add --seeds auto or drop it")
        return MAX_SEEDS, MIN_EFFECT
    max_seeds = MAX_SEEDS if max_seeds is None else max_seeds
    min_effect = MIN_EFFECT if min_effect is None else min_effect
    lo, hi = MAX_SEEDS_RANGE
    if isinstance(max_seeds, bool) or not isinstance(max_seeds, int) or not lo <= max_seeds <= hi:
        raise ConfigError(f"--max-seeds must be a whole number from {lo} to {hi}, got {max_seeds} (the design looks "
                          f"first at {FIRST_SEEDS} seeds per variant)")
    if isinstance(min_effect, bool) or not isinstance(min_effect, (int, float)) or not 0 < min_effect < 1:
        raise ConfigError(f"--min-effect must be a fraction between 0 and 1 (0.02 is 2%), got {min_effect}")
    return max_seeds, float(min_effect)


class SeedDesign:
    """How many seeds each variant trains: a fixed number, all at once, or the sequential design
    (--seeds auto), which looks at the primary contrast after FIRST_SEEDS seeds per variant and
    after each further one until next_decision stops it (or a run fails to train). A stage at a
    time: `first` and then `after` give the seed indices to train next, (first, stop), or None;
    `after` is told whether the stage trained and, for the design, the primary contrast over the
    seeds trained so far (a SplitContrast, or None). `seeds` is then the number per variant and
    `record` the design's record (None for a fixed number)."""

    def __init__(self, seeds: int | str, max_seeds: int = MAX_SEEDS, min_effect: float = MIN_EFFECT,
                 alpha: float = ALPHA, progress: bool = False):
        self.auto = seeds == "auto"
        self.seeds = FIRST_SEEDS if self.auto else int(seeds)
        self.progress = progress
        self.record = Sequential(max_seeds=max_seeds, min_effect=min_effect, alpha=alpha) if self.auto else None
        self._rows = {b.seeds: b for b in design(max_seeds, alpha)} if self.auto else {}

    def first(self) -> tuple[int, int]:
        return 0, self.seeds

    def after(self, trained: bool, contrast: SplitContrast | None = None) -> tuple[int, int] | None:
        seq = self.record
        if seq is None:
            return None
        n = self.seeds
        look = look_at(contrast, n, self._rows[n].threshold)
        seq.looks.append(look)
        look.decision = "failed" if not trained else next_decision(seq.looks, seq.max_seeds, seq.alpha, seq.min_effect)
        if self.progress:
            log(f"sequential look {len(seq.looks)} ({n} seeds per variant): {look_words(look)}")
        if look.decision != "continue":
            seq.stopped_because = look.decision
            return None
        self.seeds = n + 1
        return n, n + 1
