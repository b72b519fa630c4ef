"""--match params: the tied model with extra layers whose parameter count is closest to the untied
one's (MobileLLM's argument: reinvest the V·d parameters tying frees in depth). Parameter-matched
is not compute-matched: the extra layers cost FLOPs the untied model does not spend."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Callable

from ..tie import UNTIED, Tie


@dataclass
class ParamMatch:
    """The parameter-matched tied variant of a model config."""

    untied_total: int
    tied_total: int
    matched_total: int
    n_layer: int  # the config's
    matched_n_layer: int  # the tied variant's whose total is closest to untied_total
    layer_params: int  # the parameters of one more layer
    vocab_size: int
    note: str | None = None  # set when no third variant is trained

    @property
    def adds_a_variant(self) -> bool:
        return self.matched_n_layer != self.n_layer

    def to_json(self) -> dict:
        out = dataclasses.asdict(self)
        if self.note is None:
            del out["note"]
        return out


def match_layers(model_cfg: Any, vocab_size: int, count: Callable[[Any, int], dict] | None = None) -> ParamMatch:
    """The n_layer of a tied model whose total is closest to the untied model's. `count` is
    model.count_params_config (the default) or a stand-in with its signature."""
    if count is None:
        from ..counting import count_params_config as count
    tied = dataclasses.replace(model_cfg.with_tie(Tie("tied")), untie_at=None)
    untied_total = count(dataclasses.replace(model_cfg.with_tie(UNTIED), untie_at=None), vocab_size)["total"]
    tied_total = count(tied, vocab_size)["total"]
    best_layers, best_total = tied.n_layer, tied_total
    layers = tied.n_layer
    while True:
        layers += 1
        total = count(dataclasses.replace(tied, n_layer=layers), vocab_size)["total"]
        if abs(total - untied_total) < abs(best_total - untied_total):
            best_layers, best_total = layers, total
        if total >= untied_total or layers > tied.n_layer + 100_000:
            break
    per_layer = count(dataclasses.replace(tied, n_layer=tied.n_layer + 1), vocab_size)["total"] - tied_total
    match = ParamMatch(untied_total=untied_total, tied_total=tied_total, matched_total=best_total,
                       n_layer=tied.n_layer, matched_n_layer=best_layers, layer_params=per_layer,
                       vocab_size=vocab_size)
    if not match.adds_a_variant:
        match.note = ("tying saves fewer parameters than half a layer holds, so the matched "
                      "variant is the tied one; no third variant was trained")
    return match
