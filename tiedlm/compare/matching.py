"""--match params: a tied variant grown until its parameter count is closest to the untied one's,
by depth (`params`, `params:depth`: extra layers, MobileLLM's argument: reinvest the V·d
parameters tying frees in depth) or by width (`params:width`: n_embd grown in steps of the head
size, one more head a step, the head size kept). Parameter-matched is not compute-matched: the
extra layers or width cost FLOPs the untied model does not spend.

With the matched variant trained, a comparison makes two contrasts against the untied model: the
tied variant at equal architecture (the primary contrast, which --seeds auto decides on) and the
matched variant at equal parameters. `MatchFamily` holds the two on the primary split, judged
together by Holm's procedure (closed testing with a Bonferroni intersection test, which for two
hypotheses is Holm's step-down): one of them must be significant at half the level before either
is judged at the full level. With fixed seeds the levels are 0.05 and 0.025 (the Holm-adjusted
p-values, stats.holm, against 0.05 say the same); under the sequential design the primary
contrast's levels are the design's own thresholds at its last look, at α and at α/2
(sequential.Sequential.apply)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Iterable, Sequence

from ..model.counting import count_params_config
from ..errors import ConfigError
from ..model.tie import UNTIED, Tie
from .stats import ALPHA, holm, significant

if TYPE_CHECKING:
    from ..config import ModelConfig
    from .variants import Variant

MATCH_BY = {"params": "depth", "params:depth": "depth", "params:width": "width"}  # --match value -> how
STEP_LIMIT = 100_000  # layers or heads added at most: a bound on the search, never reached in practice
ROLES = {"primary": "tied vs untied at equal architecture", "matched": "matched tied vs untied at equal parameters"}
# Parameter-matched: totals within 10% of the reference's, stated wherever a contrast is called
# matched (the exact counts are always given beside it). --match params picks the depth nearest the
# untied total, so its variant misses by up to half a layer (+5.2% at d 64, 2 layers, V 2,048); a
# one-layer model can miss by more, and is then not called matched.
PARAM_MATCH = 0.10


def match_by(value: str | None) -> str | None:
    """'depth' or 'width' for a --match value, None for none; a ConfigError for any other value."""
    if value is None:
        return None
    if value not in MATCH_BY:
        raise ConfigError(f"--match {value!r} is not known — choose params (the tied model deeper: extra layers) or "
                          "params:width (the tied model wider: n_embd grown by the head size)")
    return MATCH_BY[value]


@dataclass
class ParamMatch:
    """The parameter-matched tied variant of a model config."""

    untied_total: int
    tied_total: int
    matched_total: int
    n_layer: int  # the config's
    matched_n_layer: int  # the matched variant's (by depth: the one whose total is closest to untied_total)
    layer_params: int  # the parameters of one more layer (of the config's width)
    vocab_size: int
    note: str | None = None  # set when no third variant is trained
    by: str = "depth"  # depth (extra layers) or width (n_embd grown by the head size)
    n_embd: int = 0  # the config's, then the matched variant's
    matched_n_embd: int = 0
    n_head: int = 0
    matched_n_head: int = 0
    n_kv_head: int | None = None  # llama with grouped-query attention: kept in proportion to n_head
    matched_n_kv_head: int | None = None
    step_params: int = 0  # the parameters one step adds to the tied model: a layer, or one head's width

    @property
    def adds_a_variant(self) -> bool:
        return (self.matched_n_layer, self.matched_n_embd) != (self.n_layer, self.n_embd)

    @property
    def gap(self) -> float:
        """The matched variant's total against the untied one's, relative (+0.145: 14.5% more)."""
        return self.matched_total / self.untied_total - 1.0 if self.untied_total else 0.0

    @property
    def within(self) -> bool:
        """Whether the matched variant is within PARAM_MATCH of the untied total: only then is its
        contrast called 'at equal parameters'."""
        return abs(self.matched_total - self.untied_total) <= PARAM_MATCH * self.untied_total

    @property
    def group(self) -> int:
        """Query heads per key/value head (1 without grouped-query attention): one step of width."""
        return self.n_head // self.n_kv_head if self.n_kv_head else 1

    def step_words(self) -> str:
        """'one layer holds 12,704', 'one step of width, a head, adds 4,160', or with grouped-query
        attention 'one step of width, 2 query heads (64 of n_embd), adds 14,128'."""
        if self.by == "depth":
            return f"one layer holds {self.layer_params:,}"
        head = self.n_embd // self.n_head if self.n_head else 0
        heads = "a head" if self.group == 1 else f"{self.group} query heads ({self.group * head} of n_embd)"
        return f"one step of width, {heads}, adds {self.step_params:,}"

    def role_words(self) -> str:
        """The matched contrast's name: 'at equal parameters' only within PARAM_MATCH."""
        if self.within:
            return ROLES["matched"]
        return (f"grown tied vs untied at the nearest parameter count ({self.gap:+.1%}, outside the "
                f"{PARAM_MATCH:.0%} counted as equal)").replace("-", "−")

    @property
    def option(self) -> str:
        return "params" if self.by == "depth" else "params:width"

    @property
    def tag(self) -> str:
        """The matched variant's run tag."""
        return "tied-matched" if self.by == "depth" else "tied-matched-width"

    def grown_keys(self) -> dict[str, int]:
        """The model keys the match grew, with their matched values."""
        if self.by == "depth":
            return {"n_layer": self.matched_n_layer}
        kv = {"n_kv_head": self.matched_n_kv_head} if self.matched_n_kv_head is not None else {}
        return {"n_embd": self.matched_n_embd, "n_head": self.matched_n_head, **kv}

    def overrides(self) -> list[str]:
        """The matched variant's overrides (the plain tied model's plus what the match grew)."""
        return ["model.tie_embeddings=true"] + [f"model.{k}={v}" for k, v in self.grown_keys().items()]

    def grown(self) -> str:
        """What the matched variant changes: 'n_layer=6 instead of 2', 'n_embd=96 (3 heads of 32) instead of 64'."""
        if self.by == "depth":
            return f"n_layer={self.matched_n_layer} instead of {self.n_layer}"
        head = self.n_embd // self.n_head if self.n_head else 0
        kv = (f", n_kv_head={self.matched_n_kv_head} instead of {self.n_kv_head}"
              if self.matched_n_kv_head is not None else "")
        return (f"n_embd={self.matched_n_embd} ({self.matched_n_head} heads of {head}) instead of {self.n_embd} "
                f"({self.n_head} heads){kv}")

    def is_matched(self, model_cfg: ModelConfig) -> bool:
        """Whether a (tied) model config is the matched variant's: its depth and width are the match's."""
        return self.adds_a_variant and (model_cfg.n_layer, model_cfg.n_embd) == (self.matched_n_layer,
                                                                                self.matched_n_embd)

    def to_json(self) -> dict:
        out = {**dataclasses.asdict(self), "parameter_matched": self.within}
        if self.note is None:
            del out["note"]
        return out


def match_params(model_cfg: ModelConfig, vocab_size: int, by: str = "depth",
                 count: Callable[[Any, int], dict] | None = None) -> ParamMatch:
    """The tied variant whose total is closest to the untied model's, grown by `by` (depth or
    width). `count` is counting.count_params_config (the default) or a stand-in with its signature."""
    return match_layers(model_cfg, vocab_size, count) if by == "depth" else match_width(model_cfg, vocab_size, count)


def _plain_tied(model_cfg: ModelConfig) -> ModelConfig:
    """The model config tied, without untie_at: the model a match grows."""
    return dataclasses.replace(model_cfg.with_tie(Tie("tied")), untie_at=None)


def _start(model_cfg: ModelConfig, vocab_size: int, count: Callable | None) -> tuple[Any, Callable, int, int, int]:
    """(the tied config, count, the untied total, the tied total, one more layer's parameters)."""
    count = count or count_params_config
    tied = _plain_tied(model_cfg)
    untied_total = count(dataclasses.replace(model_cfg.with_tie(UNTIED), untie_at=None), vocab_size)["total"]
    tied_total = count(tied, vocab_size)["total"]
    per_layer = count(dataclasses.replace(tied, n_layer=tied.n_layer + 1), vocab_size)["total"] - tied_total
    return tied, count, untied_total, tied_total, per_layer


def _closest(candidates: Iterable[tuple[ModelConfig, int]], untied_total: int) -> tuple[Any, int]:
    """The (config, total) of candidates (growing totals) closest to untied_total; the search stops
    at the first total at or past it. Ties go to the smaller model."""
    best = None
    for cfg, total in candidates:
        if best is None or abs(total - untied_total) < abs(best[1] - untied_total):
            best = (cfg, total)
        if total >= untied_total:
            break
    return best


def match_layers(model_cfg: ModelConfig, vocab_size: int,
                 count: Callable[[Any, int], dict] | None = None) -> ParamMatch:
    """The n_layer of a tied model whose total is closest to the untied model's."""
    tied, count, untied_total, tied_total, per_layer = _start(model_cfg, vocab_size, count)

    def deeper():
        yield tied, tied_total
        for layers in range(tied.n_layer + 1, tied.n_layer + STEP_LIMIT):
            cfg = dataclasses.replace(tied, n_layer=layers)
            yield cfg, count(cfg, vocab_size)["total"]

    best, best_total = _closest(deeper(), untied_total)
    match = ParamMatch(untied_total=untied_total, tied_total=tied_total, matched_total=best_total,
                       n_layer=tied.n_layer, matched_n_layer=best.n_layer, layer_params=per_layer,
                       vocab_size=vocab_size, by="depth", n_embd=tied.n_embd, matched_n_embd=tied.n_embd,
                       n_head=tied.n_head, matched_n_head=tied.n_head, step_params=per_layer)
    if not match.adds_a_variant:
        match.note = ("tying saves fewer parameters than half a layer holds, so the matched "
                      "variant is the tied one; no third variant was trained")
    return match


def match_width(model_cfg: ModelConfig, vocab_size: int, count: Callable[[Any, int], dict] | None = None) -> ParamMatch:
    """The n_embd of a tied model whose total is closest to the untied model's, in steps of the
    head size: n_embd = k·head_size with k heads (the head size kept, so rotary embeddings and the
    attention's scale are unchanged). With grouped-query attention (llama's n_kv_head) the query
    heads per key/value head are kept: k grows in steps of that group, n_kv_head = k / group. An
    explicit model.intermediate_size (llama) is kept; otherwise the MLP widens by the block's rule."""
    tied, count, untied_total, tied_total, per_layer = _start(model_cfg, vocab_size, count)
    head = tied.n_embd // tied.n_head
    kv = tied.n_kv_head if getattr(tied, "n_kv_head", None) is not None else None
    group = tied.n_head // kv if kv else 1

    def wider_at(k: int) -> ModelConfig:
        more = {"n_kv_head": k // group} if kv else {}
        return dataclasses.replace(tied, n_embd=k * head, n_head=k, **more)

    def wider():
        yield tied, tied_total
        for k in range(tied.n_head + group, tied.n_head + group * STEP_LIMIT, group):
            cfg = wider_at(k)
            yield cfg, count(cfg, vocab_size)["total"]

    best, best_total = _closest(wider(), untied_total)
    step = count(wider_at(tied.n_head + group), vocab_size)["total"] - tied_total
    match = ParamMatch(untied_total=untied_total, tied_total=tied_total, matched_total=best_total,
                       n_layer=tied.n_layer, matched_n_layer=tied.n_layer, layer_params=per_layer,
                       vocab_size=vocab_size, by="width", n_embd=tied.n_embd, matched_n_embd=best.n_embd,
                       n_head=tied.n_head, matched_n_head=best.n_head, n_kv_head=kv,
                       matched_n_kv_head=best.n_kv_head if kv else None, step_params=step)
    if not match.adds_a_variant:
        match.note = (f"tying saves fewer parameters than half a step of width holds ({group * head} more of "
                      "n_embd), so the matched variant is the tied one; no third variant was trained")
    return match


def found_match(variants: list, tuned: Sequence[str] = ()) -> ParamMatch | None:
    """The parameter match of runs that `compare --config --match` trained, compared again as a
    folder (`tiedlm compare FOLDER`): exactly one untied variant and two tied ones, one of them the
    untied model tied and the other that tied model grown as match_params grows it (by depth or by
    width), each model equal to the one expected in every key but the tuned ones. None for any other
    set of variants. The vocabulary is the untied variant's, read from its embedding's parameter count."""
    untied = [v for v in variants if v.tied is False]
    tied = [v for v in variants if v.tied is True]
    if len(variants) != 3 or len(untied) != 1 or len(tied) != 2:
        return None
    model = untied[0].config.model
    wte = untied[0].params.get("wte")
    if not isinstance(wte, int) or wte <= 0 or wte % model.n_embd or model.untie_at is not None:
        return None
    skip = {k.split(".", 1)[1] for k in tuned if k.startswith("model.")}

    def view(m: ModelConfig) -> dict:
        return {k: v for k, v in dataclasses.asdict(m).items() if k not in skip}

    plain = _plain_tied(model)
    for by in ("depth", "width"):
        match = match_params(model, wte // model.n_embd, by)
        if not match.adds_a_variant:
            continue
        grown = dataclasses.replace(plain, **match.grown_keys())
        want = sorted((repr(view(plain)), repr(view(grown))))
        if sorted(repr(view(v.config.model)) for v in tied) == want:
            return match
    return None


# ============================================================================ the two contrasts


@dataclass
class FamilyMember:
    """One of the two contrasts against the untied model on the primary split: its raw p-value,
    Holm's adjusted one (fixed seeds; None under the sequential design, whose levels are named
    instead), the levels it is judged at (`half`: Holm's first step, `level`: alone) and the result."""

    role: str  # "primary" (equal architecture) or "matched" (equal parameters)
    label: str  # the tied variant's
    p_value: float | None
    p_holm: float | None
    level: float
    half: float
    significant: bool | None = None
    name: str | None = None  # the contrast's words where they are not ROLES' (a match outside PARAM_MATCH)

    @property
    def words(self) -> str:
        return self.name or ROLES[self.role]

    def to_json(self) -> dict:
        return {**dataclasses.asdict(self), "contrast": self.words}


@dataclass
class MatchFamily:
    """The two contrasts of a --match comparison, judged together by Holm's procedure."""

    reference: str  # the untied variant's label
    split: str
    members: list[FamilyMember] = field(default_factory=list)  # the primary contrast first
    sequential: bool = False  # the primary contrast's levels are the sequential design's

    def member(self, label: str) -> FamilyMember | None:
        return next((m for m in self.members if m.label == label), None)

    @property
    def primary(self) -> FamilyMember:
        return self.members[0]

    def judge(self) -> None:
        """Each member's `significant`: closed testing over the two (Holm's step-down). One of them
        must be significant at its `half` level (the intersection, by Bonferroni) before each is
        judged at its own `level`. A family of one is judged at its level alone."""

        if len(self.members) == 1:
            m = self.members[0]
            m.significant = significant(m.p_value, m.level)
            return
        ps = [m.p_value for m in self.members]
        if any(p is None for p in ps):  # a contrast without a p-value: the other is judged alone (Bonferroni)
            for m in self.members:
                m.significant = significant(m.p_value, m.half) if m.p_value is not None else None
            return
        gate = any(significant(m.p_value, m.half) for m in self.members)
        for m in self.members:
            m.significant = bool(gate and significant(m.p_value, m.level))

    def to_json(self) -> dict:
        return {"reference": self.reference, "split": self.split, "sequential": self.sequential,
                "method": "Holm over the two contrasts (closed testing, Bonferroni intersection test)",
                "contrasts": [m.to_json() for m in self.members]}


def match_family(match: ParamMatch | None, variants: list, base: Variant | None, split: str) -> MatchFamily | None:
    """The two contrasts against the untied baseline (the plain tied variant's first), Holm-adjusted
    on `split` and judged at 0.05; each contrast's `significant` set to the family's judgement.
    None without a match, or when the baseline is not the untied variant (--baseline another)."""

    if match is None or base is None or base.tied is not False:
        return None
    tied = [v for v in variants if v.tied and v.vs_baseline is not None and v.contrast(split) is not None]
    primary = [v for v in tied if not match.is_matched(v.config.model)]
    matched = [v for v in tied if match.is_matched(v.config.model)]
    if len(primary) != 1 or len(matched) > 1:
        return None  # not the variants a --match comparison trains
    chosen = [("primary", primary[0])] + [("matched", v) for v in matched]
    ps = [v.contrast(split).p_value for _, v in chosen]
    adjusted = holm(ps) if len(chosen) > 1 else ps
    n = len(chosen)
    family = MatchFamily(reference=base.label, split=split,
                         members=[FamilyMember(role, v.label, p, q, ALPHA, ALPHA / n,
                                               name=match.role_words() if role == "matched" else None)
                                  for (role, v), p, q in zip(chosen, ps, adjusted)])
    family.judge()
    apply_family(family, variants)
    return family


def apply_family(family: MatchFamily, variants: list) -> None:
    """Each member's judgement onto its variant's contrast on the family's split."""
    for m in family.members:
        v = next(x for x in variants if x.label == m.label)
        v.contrast(family.split).significant = m.significant
