"""The model of model.arch: hf (hf.py builds its configuration): a transformers causal LM with the
interface tiedlm's loop, evaluation, checkpoints and counting ask of model.GPT, and its count on the
meta device. Imported only where such a model is built (torch and transformers at its top)."""

from __future__ import annotations

import types
import warnings
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from torch import nn
from torch.nn import functional as F

from .errors import ConfigError
from .hf import language_configs, config_flags_tied, hf_model_config, require_transformers
from .pretrained import checkpoint_config, checkpoint_tied, describe_start
from .tie import UNTIED, Tie
from .loss import cross_entropy, token_losses

if TYPE_CHECKING:
    from transformers import PretrainedConfig

    from .config import ModelConfig


class HFCausalLM(nn.Module):
    """A transformers causal LM with the interface tiedlm's loop asks of model.GPT."""

    def __init__(self, cfg: ModelConfig, vocab_size: int):
        super().__init__()
        transformers = require_transformers()
        self.cfg, self.vocab_size, self.family = cfg, vocab_size, cfg.family
        config = hf_model_config(cfg, vocab_size)
        self.start = None  # a pretrained start: what the run's tie did to the checkpoint's (pretrained.py)
        on_meta = torch.empty(0).device.type == "meta"  # counting: the shape, no weights
        if cfg.init_from and not on_meta:
            self.hf = self._load_checkpoint(transformers, cfg, config)
        else:
            self.hf = transformers.AutoModelForCausalLM.from_config(config)
        self.built_tie = cfg.tie
        self.embed_scale = 1.0  # the family scales its own embeddings where it does (Gemma)
        # not registered: the same module as the family's, under the name tiedlm's code reads
        object.__setattr__(self, "transformer", types.SimpleNamespace(wte=self.hf.get_input_embeddings()))
        self.head_kind = self._head_kind()
        self.check_tie(cfg.tie.w_out_is_e)

    def _load_checkpoint(self, transformers: types.ModuleType, cfg: ModelConfig,
                         config: PretrainedConfig) -> nn.Module:
        """The checkpoint's weights in float32, its tie checked by storage against its config, then
        set to the run's: untied by copy, or tied from E, W_out or their mean (model.tie_from)."""
        saved = checkpoint_config(Path(cfg.hf_config))
        was_tied, rows = checkpoint_tied(saved), config.vocab_size
        config.vocab_size = saved.vocab_size  # loaded as it was saved; new tokens' rows are added below
        for c in language_configs(config):
            c.tie_word_embeddings = was_tied  # loaded as it was saved; the run's tie is set below
        transformers.utils.logging.disable_progress_bar()  # tiedlm says what it loads; no bar per run
        model, info = transformers.AutoModelForCausalLM.from_pretrained(cfg.hf_config, config=config,
                                                                         dtype=torch.float32, output_loading_info=True)
        missing = [k for k in info.get("missing_keys", []) if not (was_tied and k.endswith("lm_head.weight"))]
        if missing:  # transformers would fill them at random, and say so only in a log line
            raise ConfigError(f"model.init_from {cfg.init_from}: the checkpoint's weights lack {len(missing)} of the "
                              f"model's ({', '.join(sorted(missing)[:3])}) — it would start with those at random; "
                              "give a complete model folder")
        model.train()
        E, head = model.get_input_embeddings(), model.get_output_embeddings()
        if (head.weight is E.weight) != was_tied:
            raise ConfigError(f"model.init_from {cfg.init_from}: its config says tie_word_embeddings {was_tied}, but its "
                              f"weights load as {'one matrix' if head.weight is E.weight else 'two different matrices'} "
                              "— fix tie_word_embeddings in the folder's config.json")
        tied = cfg.tie.w_out_is_e
        with torch.no_grad():
            if was_tied and not tied:  # untie by copy: never a random head
                head.weight = nn.Parameter(E.weight.detach().clone())
            elif tied and not was_tied:
                source = cfg.tie_from or "e"
                if source == "w_out":
                    E.weight.copy_(head.weight)
                elif source == "mean":
                    E.weight.copy_((E.weight + head.weight) / 2)
                head.weight = E.weight
        for c in language_configs(model.config):
            c.tie_word_embeddings = tied
        if rows > saved.vocab_size:  # tokenizer.add_tokens: rows for the new ids (model.init_new_rows sets them)
            model.resize_token_embeddings(rows, mean_resizing=False)
        self.start = {"init_from": cfg.init_from, "checkpoint_tied": was_tied,
                      "start": describe_start(was_tied, tied, cfg.tie_from)}
        return model

    def _head_kind(self) -> str:
        """'linear' where logits = final hidden state @ W_outᵀ (+ bias); else the reason the
        family's own logits are used."""
        c = language_configs(self.hf.config)[-1]
        if getattr(c, "final_logit_softcapping", None):
            return f"the family's own logits (final-logit soft-capping at {c.final_logit_softcapping:g})"
        for field in ("logit_scale", "logits_scaling", "output_multiplier_scale"):
            if getattr(c, field, None) not in (None, 1, 1.0):
                return f"the family's own logits ({field} {getattr(c, field)})"
        return "linear"

    # ---------------------------------------------------------------- the tie

    @property
    def lm_head(self) -> nn.Module:
        return self.hf.get_output_embeddings()

    @property
    def head_key(self) -> str:
        """W_out's name in the state dict: stored once when tied."""
        name = next(n for n, mod in self.hf.named_modules(remove_duplicate=False) if mod is self.lm_head)
        return f"hf.{name}.weight"

    @property
    def is_tied(self) -> bool:
        return self.lm_head.weight is self.transformer.wte.weight

    @property
    def current_tie(self) -> Tie:
        return self.built_tie if self.is_tied else UNTIED

    @property
    def w_out_is_e(self) -> bool:
        return self.is_tied

    def _flag(self, tied: bool) -> None:
        for c in language_configs(self.hf.config):
            c.tie_word_embeddings = tied

    def tie(self) -> None:
        self.lm_head.weight = self.transformer.wte.weight
        self._flag(True)
        assert self.is_tied

    def untie(self) -> nn.Parameter:
        assert self.is_tied, "untie() on a model that is not tied"
        new = nn.Parameter(self.transformer.wte.weight.detach().clone())
        self.lm_head.weight = new
        self._flag(False)
        return new

    def check_tie(self, tied: bool) -> None:
        """The tie by storage and by the config flag (and every nested one)."""
        if self.is_tied != tied or any(flag != tied for flag in config_flags_tied(self.hf.config)):
            raise AssertionError(f"expected the model to be {'tied' if tied else 'untied'}, by storage and by "
                                 f"tie_word_embeddings: storage {self.is_tied}, flags "
                                 f"{config_flags_tied(self.hf.config)}")

    def head(self, h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        return h, self.lm_head.weight, getattr(self.lm_head, "bias", None)

    def output_weight(self) -> torch.Tensor:
        return self.lm_head.weight.detach()

    def tie_distance(self) -> None:
        return None

    def tie_penalty(self) -> None:
        return None

    def pull_tie(self, lr: float) -> None:  # pull is refused for arch: hf: nothing to pull
        return None

    def head_parameters(self) -> list:
        return []

    def embedding_parameters(self) -> list[nn.Parameter]:
        out = [self.transformer.wte.weight]
        return out if self.is_tied else out + [self.lm_head.weight]

    # ---------------------------------------------------------------- forward

    def hidden(self, idx: torch.Tensor) -> torch.Tensor:
        if idx.shape[1] > self.cfg.block_size:
            raise ValueError(f"sequence length {idx.shape[1]} exceeds block_size {self.cfg.block_size}")
        return self.hf.get_decoder()(input_ids=idx).last_hidden_state

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None,
                reduction: str = "mean") -> torch.Tensor:
        if self.head_kind != "linear":
            logits = self.hf(input_ids=idx).logits
            if targets is None:
                return logits
            losses = F.cross_entropy(logits.reshape(-1, logits.size(-1)).float(), targets.reshape(-1),
                                     reduction="none" if reduction == "none" else "mean")
            return losses.view(targets.shape) if reduction == "none" else losses
        h, weight, bias = self.head(self.hidden(idx))
        if targets is None:
            return F.linear(h, weight, bias)

        h2, t = h.reshape(-1, h.size(-1)), targets.reshape(-1)
        if reduction == "none":
            with torch.no_grad():
                return token_losses(h2, weight, bias, t).view(targets.shape)
        return cross_entropy(h2, weight, bias, t)


def count_on_meta(m: ModelConfig, vocab_size: int) -> dict:
    """The breakdown model.count_params gives, of the model built on the meta device (nothing is
    allocated): every parameter once (a shared one is one Parameter), E, W_out's own (0 tied), and
    the rest; with the decoder's matmul weights (its 2-D parameters but E), for the FLOPs."""
    with torch.device("meta"), warnings.catch_warnings():  # V = 0 (the memory check before a tokenizer
        warnings.filterwarnings("ignore", "Initializing zero-element tensors")  # exists): E has no rows
        model = HFCausalLM(m, vocab_size)
    total = sum(p.numel() for p in model.parameters())  # parameters() yields a shared one once
    wte, tied = model.transformer.wte.weight.numel(), model.is_tied
    lm_head = 0 if tied else model.lm_head.weight.numel()
    bias = getattr(model.lm_head, "bias", None)
    embeddings = {id(model.transformer.wte.weight)}
    matmul = sum(p.numel() for p in model.hf.get_decoder().parameters() if p.dim() == 2 and id(p) not in embeddings)
    return {"total": total, "wte": wte, "lm_head": lm_head, "lm_head_bias": bias.numel() if bias is not None else 0,
            "wpe": 0, "non_embedding": total - wte - lm_head, "saved_by_tying": wte if tied else 0,
            "tie_mode": model.current_tie.mode, "tied": tied, "vocab_size": vocab_size,
            "non_head_matmul_params": matmul, "head_kind": model.head_kind}
