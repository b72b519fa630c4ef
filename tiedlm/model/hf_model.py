"""The model of model.arch: hf (hf_config.py builds its configuration): a transformers causal LM as a
tie_layer.TiedLM, so that every tying mode acts on its input and output embeddings, and its count
on the meta device. Imported only where such a model is built (torch and transformers at its top)."""

from __future__ import annotations

import math
import types
import warnings
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from torch import nn

from .arch import HF_SIZE_FIELDS
from ..errors import ConfigError
from .finite import not_finite
from .hf_config import buildable, config_flags_tied, hf_model_config, language_configs, require_transformers
from .pretrained import checkpoint_config, checkpoint_tied, describe_start
from .tie_layer import TiedLM, count_params

if TYPE_CHECKING:
    from transformers import PretrainedConfig

    from ..config import ModelConfig


LINEAR_TOLERANCE = 1e-5  # the largest |logits − hidden·W_outᵀ| over 1 + the largest |logit| of a linear head


class HFCausalLM(TiedLM):
    """A transformers causal LM under tiedlm's tie layer: E is the family's input embeddings,
    W_out its output embeddings, and every tying mode acts on them (tie_layer.TiedLM)."""

    def __init__(self, cfg: ModelConfig, vocab_size: int, start_weights: bool = True):
        """`start_weights`: load a pretrained start's weights (model.init_from); False for a run's
        model rebuilt to take its own checkpoint's, which hold every weight (blocks.rebuild_model):
        the checkpoint's config alone then shapes it, in float32 as a load would."""
        super().__init__()
        transformers = require_transformers()
        self.cfg, self.vocab_size, self.family = cfg, vocab_size, cfg.family
        config = hf_model_config(cfg, vocab_size)
        self.start = None  # a pretrained start: what the run's tie did to the checkpoint's (model/pretrained.py)
        on_meta = torch.empty(0).device.type == "meta"  # counting: the shape, no weights
        if cfg.init_from and not on_meta and start_weights:
            self.hf = self._load_checkpoint(transformers, cfg, config)
        else:  # float32 whatever dtype a config.json names (bf16, a checkpoint's): train.dtype decides the precision
            self.hf = buildable(config.model_type, lambda: transformers.AutoModelForCausalLM.from_config(
                config, dtype=torch.float32))
        self.unlike_linear = None if on_meta else self._check_built(config.model_type)
        self.embed_scale = math.sqrt(cfg.n_embd) if cfg.embed_scale == "sqrt_d" else 1.0
        self.family_scale = self._family_scale(on_meta)
        if self.family_scale != 1.0 and self.embed_scale != 1.0:
            by = f" (by {self.family_scale:.4g} at this width)" if self.family_scale is not None else ""
            raise ConfigError(f"model.embed_scale: sqrt_d — {config.model_type} scales its input embedding "
                              f"itself{by}, so tiedlm's would scale it twice; remove model.embed_scale")
        self.head_kind = self._head_kind()
        self.attach_tie(cfg.tie, cfg.lm_head_bias)
        self.check_tie(not cfg.tie.two_matrices)

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
        try:
            model, info = transformers.AutoModelForCausalLM.from_pretrained(
                cfg.hf_config, config=config, dtype=torch.float32, output_loading_info=True)
        except Exception as exc:  # a truncated or damaged weights file (safetensors' own error, OSError, …)
            if isinstance(exc, (ConfigError, MemoryError)) or type(exc).__name__ == "OutOfMemoryError":
                raise
            raise ConfigError(f"model.init_from {cfg.init_from}: its weights do not load ({type(exc).__name__}: "
                              f"{' '.join(str(exc).split())[:160]}) — the folder is damaged; export or save it "
                              "again") from None
        bad = not_finite(model.named_parameters())
        if bad:
            more = f" and {len(bad) - 1} more tensor(s)" if len(bad) > 1 else ""
            raise ConfigError(f"model.init_from {cfg.init_from}: its weights are not finite ({bad[0][2]:,} NaN or "
                              f"infinite value(s) in {bad[0][0]}{more}) — the checkpoint is damaged or its run "
                              "diverged; start from another")
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

    def _check_built(self, kind: str) -> float:
        """Two checks on the built model, from one forward of two short sequences that differ only
        in their last token. Refused: a family whose logits at a position see later tokens (an
        encoder such as bert, which transformers also offers with a language-model head). Returned:
        how far its logits are from the final hidden state times W_out (+ bias), which _head_kind
        reads, so that a head the config's fields do not declare (recurrent_gemma's soft-cap, a
        logit multiplier) is found on the model itself."""
        ids = torch.tensor([[1, 2, 3, 1], [1, 2, 3, 2]]) % max(2, self.vocab_size)
        was = self.hf.training
        self.hf.eval()
        try:
            with torch.no_grad():
                out = buildable(kind, lambda: self.hf(input_ids=ids, output_hidden_states=True))
        finally:
            self.hf.train(was)
        logits = out.logits
        if not torch.allclose(logits[0, :-1], logits[1, :-1], rtol=1e-4, atol=1e-5):
            raise ConfigError(f"model.hf_config {kind} is not a causal language model: its logits at a position "
                              "change with the tokens after it, so it would be trained to copy the next token — "
                              "choose a decoder family (gpt2, llama, qwen2, …)")
        head = self.hf.get_output_embeddings()
        with torch.no_grad():
            linear = out.hidden_states[-1] @ head.weight.T
            if getattr(head, "bias", None) is not None:
                linear = linear + head.bias
            return float((linear - logits).abs().max() / (1.0 + logits.abs().max()))

    def _family_scale(self, on_meta: bool) -> float | None:
        """How much the family's own input embedding scales E's rows (Gemma's embedding module
        multiplies them by √d), measured on the built model, one row read both ways: 1.0 for a
        plain nn.Embedding; on the meta device, None for a module with a forward of its own."""
        E = self.hf.get_input_embeddings()
        if type(E).forward is nn.Embedding.forward:
            return 1.0
        if on_meta:
            return None
        with torch.no_grad():
            row = E.weight[:1].float()
            out = E(torch.zeros(1, dtype=torch.long, device=E.weight.device)).float()
            norm = row.square().sum().item()
            return round((out * row).sum().item() / norm, 6) if norm > 0 else 1.0

    def _head_kind(self) -> str:
        """'linear' where logits = final hidden state @ W_outᵀ (+ bias); else the reason the
        family's own logits are used."""
        c = language_configs(self.hf.config)[-1]
        if getattr(c, "final_logit_softcapping", None):
            return f"the family's own logits (final-logit soft-capping at {c.final_logit_softcapping:g})"
        for field in ("logit_scale", "logits_scaling", "output_multiplier_scale"):
            if getattr(c, field, None) not in (None, 1, 1.0):
                return f"the family's own logits ({field} {getattr(c, field)})"
        if self.unlike_linear is not None and self.unlike_linear > LINEAR_TOLERANCE:
            return (f"the family's own logits (measured on the built model: they differ from the final hidden state "
                    f"× W_out by {self.unlike_linear:.2g}, relative)")
        return "linear"

    # ---------------------------------------------------------------- what the tie layer asks

    def family_sizes(self) -> dict[str, int]:
        """tiedlm's size keys beyond n_layer, n_embd and n_head that the family's config has, with
        the values the built model has: {"n_kv_head": 2, "intermediate_size": 192} for Qwen2,
        {"intermediate_size": 128} for GPT-NeoX, {} for GPT-2 and OPT, whose configs have neither
        field (their MLP width is the family's own: GPT-2's 4·d, OPT's ffn_dim)."""
        c = language_configs(self.hf.config)[-1]
        return {key: getattr(c, HF_SIZE_FIELDS[key]) for key in ("n_kv_head", "intermediate_size")
                if getattr(c, HF_SIZE_FIELDS[key], None) is not None}

    def get_input_embeddings(self) -> nn.Embedding:
        return self.hf.get_input_embeddings()

    def get_output_embeddings(self) -> nn.Linear:
        return self.hf.get_output_embeddings()

    def position_parameters(self) -> list[nn.Parameter]:
        """A learned position table, where the family has one (GPT-2's wpe, OPT's): the embedding
        tables other than E."""
        E = self.get_input_embeddings()
        return [m.weight for m in self.hf.modules() if isinstance(m, nn.Embedding) and m is not E]

    def blocks(self) -> list[nn.Module]:
        """The family's decoder layers: the classes it names as never to be split (_no_split_modules)."""
        names = set(getattr(self.hf, "_no_split_modules", None) or ())
        return [m for m in self.hf.modules() if type(m).__name__ in names]

    def init_family(self) -> None:
        """The family's own _init_weights, applied to every module."""
        self.hf.apply(self.hf._init_weights)

    def tie_flags(self) -> list[bool]:
        return config_flags_tied(self.hf.config)

    def set_tie_flags(self, tied: bool) -> None:
        for c in language_configs(self.hf.config):
            c.tie_word_embeddings = tied

    def _inputs(self, idx: torch.Tensor) -> dict:
        """The decoder's input: the ids, or E's rows scaled by tiedlm's √d (model.embed_scale)."""
        if idx.shape[1] > self.cfg.block_size:
            raise ValueError(f"sequence length {idx.shape[1]} exceeds block_size {self.cfg.block_size}")
        return {"input_ids": idx} if self.embed_scale == 1.0 else {"inputs_embeds": self.embed(idx)}

    def hidden(self, idx: torch.Tensor) -> torch.Tensor:
        return self.hf.get_decoder()(**self._inputs(idx)).last_hidden_state

    def family_logits(self, idx: torch.Tensor) -> torch.Tensor:
        return self.hf(**self._inputs(idx)).logits


def count_on_meta(m: ModelConfig, vocab_size: int) -> dict:
    """The breakdown tie_layer.count_params gives, of the model built on the meta device (nothing
    is allocated), with the decoder's matmul weights for the FLOPs: its 2-D parameters but the
    embedding tables (E, a learned position table), which are looked up, not multiplied, and of a
    mixture of experts' 3-D expert weights the share of the experts each token is routed to."""
    with torch.device("meta"), warnings.catch_warnings():  # V = 0 (the memory check before a tokenizer
        warnings.filterwarnings("ignore", "Initializing zero-element tensors")  # exists): E has no rows
        model = HFCausalLM(m, vocab_size)
    tables = {id(mod.weight) for mod in model.modules() if isinstance(mod, nn.Embedding)}
    params = list(model.hf.get_decoder().parameters())
    matmul = sum(p.numel() for p in params if p.dim() == 2 and id(p) not in tables)
    # a mixture of experts keeps its experts' weights as one 3-D tensor (experts × in × out): a token
    # multiplies by the num_experts_per_tok experts its router picks, not by all of them
    active = getattr(language_configs(model.hf.config)[-1], "num_experts_per_tok", None)
    matmul += sum(p.numel() // p.shape[0] * min(active or p.shape[0], p.shape[0]) for p in params if p.dim() == 3)
    return {**count_params(model), "non_head_matmul_params": matmul, "head_kind": model.head_kind,
            "family_sizes": model.family_sizes()}
