"""`tiedlm export`: a run as a Hugging Face `GPT2LMHeadModel` folder (`model.arch: gpt2`) or a
`LlamaForCausalLM` one (`model.arch: llama`, whose mapping is export/as_llama.py), checked against tiedlm.

tiedlm's GPT uses GPT-2's names and layout, so the GPT-2 export is a renaming with three changes:
GPT-2's Conv1D stores (in, out) where nn.Linear stores (out, in), so those weights are transposed;
a model without biases (`model.bias: false`) gets zero biases, which is exact; `embed_scale:
sqrt_d` is folded into E when untied (tied, E is also the head, so it cannot be) and refused
otherwise. `lm_head_bias` has no place in GPT2LMHeadModel (nor in LlamaForCausalLM) and is
refused. A tied matrix is stored once (`tie_word_embeddings: true`), and transformers ties it on
load. The projection and lowrank modes (`model.tie_mode`) build W_out from E, which neither class
can express: they are written untied, `lm_head` being the materialised W_out (E·P, or E + A·Bᵀ),
and checked against tiedlm's logits like any other export. Lowrank at rank 0, whose W_out is E
(model/tie.py), is written tied. A soft run (`tie_mode: soft`) is two matrices, however close its λ has
pulled them: it is written untied, `lm_head` its own W_out (the penalty is a training term only).

The folder: config.json, generation_config.json, model.safetensors, tokenizer.json,
tokenizer_config.json, special_tokens_map.json, and README.md, the model card (export/card.py).
With transformers installed, the export is loaded back and both implementations score one fixed
batch of the run's validation tokens; a difference beyond fp32 tolerance fails the export and
removes the folder.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from ..errors import ConfigError, RunError
from .as_llama import CLASS as LLAMA_CLASS
from ..perplexity import perplexity
from ..model.tie import STRENGTHENED
from ..model.hf_config import config_flags_tied
from .card import write_card
from ..runs import AGAIN_HINT, writing

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedModel

    from ..config import Config
    from ..evaluate import RunModel
    from ..model.blocks import GPT

TOLERANCE = 1e-4  # largest |logit difference| accepted between tiedlm and transformers (fp32)
CONV1D = ("attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight")


@dataclass
class ExportResult:
    out: Path
    tied: bool  # written tied (one matrix): W_out is E; a projection or lowrank run is written untied
    checkpoint: str
    verified: bool  # loaded back with transformers and compared
    max_abs_diff: float | None = None
    tiedlm_perplexity: float | None = None
    hf_perplexity: float | None = None
    tokens: int | None = None  # scored in the check
    note: str | None = None
    mode: str | None = None  # the run's model.tie_mode when it has one (one of tie.NAMED_MODES)
    hf_class: str = "GPT2LMHeadModel"  # or LlamaForCausalLM (model.arch: llama), or an arch: hf family's class
    chosen: str = ""  # why these weights: the ones a comparison judges, the latest, or the ones asked for


def writes_tied(model: torch.nn.Module) -> bool:
    """Whether the export is one shared matrix: the model's W_out is E itself now."""
    return model.current_tie.w_out_is_e


def hf_class(cfg: Config) -> str:
    """The transformers class a run is exported as."""
    return cfg.model.family.export_class


def check_exportable(cfg: Config, tied: bool) -> None:
    """What the transformers class cannot express is refused (exit 2) before anything is written."""
    if cfg.model.lm_head_bias:
        raise ConfigError(f"model.lm_head_bias: {hf_class(cfg)} has no bias on its head, so this run cannot be "
                          "exported exactly — export runs trained with model.lm_head_bias: false")
    if cfg.model.family.built_by_transformers and cfg.model.embed_scale == "sqrt_d":
        raise ConfigError("model.embed_scale: sqrt_d — the family's transformers class reads E unscaled, so this run "
                          "cannot be exported exactly — export runs trained with model.embed_scale: 1")
    # A tied llama run folds √d into E and 1/√d into the final RMSNorm's gain (export/as_llama.py).
    if not cfg.model.family.rms_norm and cfg.model.embed_scale == "sqrt_d" and tied:
        raise ConfigError("model.embed_scale: sqrt_d with a tied matrix: GPT-2 scales no embedding, and folding "
                          "√d into the shared E would scale the head too — export an untied run, or one with "
                          "embed_scale: 1")


def hf_config(cfg: Config, vocab: int, tied: bool, eot_id: int) -> dict:
    """config.json of the GPT2LMHeadModel, or of the LlamaForCausalLM."""
    if cfg.model.family.export_class == LLAMA_CLASS:
        from .as_llama import llama_config

        return llama_config(cfg, vocab, tied, eot_id)
    m = cfg.model
    return {"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2", "vocab_size": vocab,
            "n_positions": m.block_size, "n_ctx": m.block_size, "n_embd": m.n_embd, "n_layer": m.n_layer,
            "n_head": m.n_head, "n_inner": 4 * m.n_embd, "activation_function": "gelu",  # exact GELU, as tiedlm
            "layer_norm_epsilon": m.norm_eps, "resid_pdrop": m.dropout, "embd_pdrop": m.dropout,
            "attn_pdrop": m.dropout, "initializer_range": 0.02, "scale_attn_weights": True, "use_cache": True,
            "tie_word_embeddings": tied, "bos_token_id": eot_id, "eos_token_id": eot_id, "torch_dtype": "float32"}


def hf_state_dict(model: GPT) -> dict:
    """tiedlm's tensors under GPT-2's names and layout (see the module docstring), or Llama's."""
    import torch

    # a mode's effective W_out as a matrix of its own, as an arch: hf export writes it (taken before E
    # is scaled below: the head sees E unscaled)
    with model.materialised_head():
        sd = {k: v.detach().float().cpu().contiguous() for k, v in model.state_dict().items()}
    for name, _ in model.head_parameters():  # P, or A and B: folded into the materialised W_out
        sd.pop(name)
    if writes_tied(model):
        sd.pop("lm_head.weight")
    if model.family.export_class == LLAMA_CLASS:
        from .as_llama import llama_state_dict

        return llama_state_dict(model, sd, writes_tied(model))
    if model.embed_scale != 1.0:  # written untied only (check_exportable): fold the scale into E
        sd["transformer.wte.weight"] = sd["transformer.wte.weight"] * model.embed_scale
    for name in list(sd):
        if name.endswith(CONV1D):
            sd[name] = sd[name].t().contiguous()
    d = model.get_input_embeddings().weight.shape[1]
    for i in range(len(model.transformer.h)):  # no biases: GPT-2 has them, so they are zeros
        p = f"transformer.h.{i}."
        for key, size in (("ln_1.bias", d), ("ln_2.bias", d), ("attn.c_attn.bias", 3 * d), ("attn.c_proj.bias", d),
                          ("mlp.c_fc.bias", 4 * d), ("mlp.c_proj.bias", d)):
            sd.setdefault(p + key, torch.zeros(size))
    sd.setdefault("transformer.ln_f.bias", torch.zeros(d))
    return sd


def export_run(run_dir: str | Path, out: str | Path, checkpoint: str | None = None, verify: bool = True,
               batch: int = 4) -> ExportResult:
    """Write the run as a transformers folder at `out`: the weights a comparison judges by default
    (the best validation evaluation's, where the run kept them: train.keep_best; else its latest
    checkpoint), or checkpoints/<checkpoint> (`latest` for the latest). `out` must not exist or be
    empty, nor lie in a run's managed parts (checkpoints/, tb/, ...); the folder is verified when
    transformers is installed."""
    from ..runs.checkpoints import check_outside_runs
    from ..evaluate import kept_best, load_run_model

    out = Path(out)
    check_outside_runs(out, "--out")  # inside checkpoints/, a resume would delete it
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ConfigError(f"--out {out} exists and is not an empty folder — choose a new folder")
    judged = kept_best(run_dir) if checkpoint is None else None  # the weights a comparison judges
    rm = load_run_model(run_dir, checkpoint=judged or checkpoint, chooser="--checkpoint")
    model = rm.model.eval()
    check_exportable(rm.cfg, writes_tied(model))
    out.parent.mkdir(parents=True, exist_ok=True)  # the temporary folder beside it: one rename, no copy
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        _write_folder(tmp, rm, model)
        family_class = type(model.hf).__name__ if rm.cfg.model.family.built_by_transformers else hf_class(rm.cfg)
        result = ExportResult(out, writes_tied(model), rm.checkpoint.name, verified=False,
                              mode=model.built_tie.stored_mode, hf_class=family_class,
                              chosen=_chosen_words(judged, checkpoint, rm.checkpoint.name))
        if verify:
            _verify(tmp, rm, model, result, batch)
        write_card(tmp, Path(run_dir), result)  # README.md: the model card
        if out.exists():
            out.rmdir()
        out.parent.mkdir(parents=True, exist_ok=True)
        shutil.move(str(tmp), str(out))
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return result


def _write_folder(folder: Path, rm: RunModel, model: torch.nn.Module) -> None:
    from safetensors.torch import save_file

    from ..data.hub import write_hf_tokenizer

    tok = rm.data.tokenizer
    if rm.cfg.model.family.built_by_transformers:  # the family's own folder, as transformers writes it
        with writing(folder, AGAIN_HINT):
            for c in [model.hf.config, *(getattr(model.hf.config, k) for k in ("text_config",)
                                          if getattr(model.hf.config, k, None) is not None)]:
                c.bos_token_id = c.eos_token_id = tok.eot_id  # for generation; training had none
            with model.materialised_head():  # a mode's W_out as the family's own untied head
                model.hf.save_pretrained(str(folder), safe_serialization=True)
            write_hf_tokenizer(tok, folder, rm.cfg.model.block_size)
        return
    with writing(folder, AGAIN_HINT):
        (folder / "config.json").write_text(json.dumps(hf_config(rm.cfg, model.vocab_size, writes_tied(model), tok.eot_id),
                                                       indent=2) + "\n")
        (folder / "generation_config.json").write_text(json.dumps(
            {"bos_token_id": tok.eot_id, "eos_token_id": tok.eot_id, "pad_token_id": tok.eot_id}, indent=2) + "\n")
        save_file(hf_state_dict(model), str(folder / "model.safetensors"), metadata={"format": "pt"})
        write_hf_tokenizer(tok, folder, rm.cfg.model.block_size)


def _batch(rm: RunModel, batch: int):
    """A fixed batch: the first `batch` windows of block_size + 1 validation (else test) tokens."""
    import numpy as np
    import torch

    split = rm.data.splits.get("validation") or rm.data.splits.get("test") or rm.data.splits["train"]
    T = rm.cfg.model.block_size
    n = min(batch, max(1, (len(split.tokens) - 1) // T))
    T = min(T, len(split.tokens) - 1)
    xy = np.asarray(split.tokens[: n * T + 1], dtype=np.int64)
    x = torch.from_numpy(np.stack([xy[i * T:(i + 1) * T] for i in range(n)]))
    y = torch.from_numpy(np.stack([xy[i * T + 1:(i + 1) * T + 1] for i in range(n)]))
    return x, y


def _verify(folder: Path, rm: RunModel, model: torch.nn.Module, result: ExportResult, batch: int) -> None:
    """Load the folder with transformers and compare logits on a fixed batch (skipped with a note
    when transformers is not installed)."""
    try:
        import transformers  # noqa: F401
    except ImportError:
        result.note = ("transformers is not installed, so the export was not checked — pip install 'tiedlm[hf]' "
                       "and export again to compare the logits")
        return
    import torch
    from torch.nn import functional as F
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    hf = AutoModelForCausalLM.from_pretrained(str(folder), local_files_only=True).float().eval()
    if writes_tied(model) and hf.get_output_embeddings().weight.data_ptr() != \
            hf.get_input_embeddings().weight.data_ptr():
        raise RunError("the exported model loads untied in transformers although the run is tied — "
                       "this is a bug in tiedlm's export; please report it")
    if rm.cfg.model.family.built_by_transformers:
        _verify_family_tie(folder, hf, writes_tied(model))
    x, y = _batch(rm, batch)
    tok = rm.data.tokenizer
    text = tok.decode([int(i) for i in x[0] if int(i) not in (tok.eot_id, tok.unk_id)])  # the run's own text
    hf_ids = AutoTokenizer.from_pretrained(str(folder), local_files_only=True)(text, add_special_tokens=False)
    if hf_ids["input_ids"] != tok.encode(text) and rm.cfg.model.family.built_by_transformers:
        # transformers picks some families' own tokenizer class from config.json's model_type (qwen2),
        # which builds its own pipeline over tokenizer.json: the folder's tokenizer is read as it is written
        from transformers import PreTrainedTokenizerFast

        hf_ids = PreTrainedTokenizerFast.from_pretrained(str(folder), local_files_only=True)(
            text, add_special_tokens=False)
        family = rm.model.hf.config.model_type  # a start's path names no family: its config's model_type does
        result.note = (f"AutoTokenizer reads this folder's tokenizer as {family}'s own class, which "
                       "encodes otherwise: load it with transformers.PreTrainedTokenizerFast.from_pretrained(folder)")
    if hf_ids["input_ids"] != tok.encode(text):
        raise RunError("the exported tokenizer encodes the run's text to other ids than tiedlm's — the export "
                       "was removed; this is a bug in tiedlm's export, please report it")
    with torch.inference_mode():
        ours = model(x).float()
        theirs = hf(input_ids=x).logits.float()
    if not bool(torch.isfinite(ours).all()):  # finite weights whose logits overflow: the run's fault, not the export's
        raise RunError(f"tiedlm's own logits for {rm.checkpoint} are not finite although its weights are — the run "
                       "diverged; export an earlier checkpoint (--checkpoint), or retrain with a lower train.lr")
    diff = float((ours - theirs).abs().max())
    result.max_abs_diff, result.tokens, result.verified = diff, y.numel(), True
    result.tiedlm_perplexity = perplexity(float(F.cross_entropy(ours.reshape(-1, ours.size(-1)), y.reshape(-1))))
    result.hf_perplexity = perplexity(float(F.cross_entropy(theirs.reshape(-1, theirs.size(-1)), y.reshape(-1))))
    allowed = TOLERANCE * max(1.0, float(ours.abs().max()))  # fp32 sums in another order grow with the logits
    if not diff <= allowed:
        raise RunError(f"the exported model's logits differ from tiedlm's by up to {diff:.3g} (more than {allowed:.3g}) "
                       "— the export was removed; this is a bug in tiedlm's export, please report it")


def _verify_family_tie(folder: Path, hf: PreTrainedModel, tied: bool) -> None:
    """arch: hf: the reloaded model's tie flag, in every nested config, and the safetensors agree
    with the run: a tied export holds one V × d matrix (E), an untied one two (E and W_out),
    whatever names the family saves them under (GPT-NeoX's embed_out)."""
    import torch
    from safetensors import safe_open

    flags = config_flags_tied(hf.config)
    E, W = (m.weight.detach().cpu() for m in (hf.get_input_embeddings(), hf.get_output_embeddings()))
    with safe_open(str(folder / "model.safetensors"), "pt") as f:  # the keys holding E's or W_out's values: a
        matrices = [k for k in f.keys() if f.get_slice(k).get_shape() == list(E.shape)  # block's V × d matrix
                    and any(torch.equal(f.get_tensor(k).float(), m.float()) for m in (E, W))]  # (GPT-2's MLP at V = 4d) is neither
    if any(flag != tied for flag in flags) or len(matrices) != (1 if tied else 2):
        raise RunError(f"the exported {type(hf).__name__} does not hold the run's tie ({'tied' if tied else 'untied'}: "
                       f"tie_word_embeddings {flags}, V × d matrices in the safetensors {matrices}) — the export was "
                       "removed; this is a bug in tiedlm's export, please report it")


def _chosen_words(judged: str | None, asked: str | None, name: str) -> str:
    """Why the exported weights are these, in words."""
    if judged:
        step = int(name.removeprefix("best-step-").split("-")[0])
        return (f"the weights a comparison judges: the run's best validation evaluation, step {step:,} "
                "(--checkpoint latest for its last weights)")
    if asked:
        return "as asked (--checkpoint)"
    return "the run's latest checkpoint: it kept no best weights (train.keep_best)"


def summary(r: ExportResult) -> str:
    form = "tied" if r.tied else "untied"
    if r.mode is not None:
        form = f"{r.mode}, written tied: its W_out is E" if r.tied else \
            f"{r.mode}, written untied: lm_head is its own W_out" if r.mode in STRENGTHENED else \
            f"{r.mode}, written untied: lm_head is the materialised W_out"
    lines = [f"exported {r.checkpoint} ({form}) to {r.out} as a {r.hf_class}"]
    if r.chosen:
        lines.append(f"{r.checkpoint}: {r.chosen}")
    if r.verified:
        lines.append(f"checked with transformers on {r.tokens:,} validation tokens: max |logit difference| "
                     f"{r.max_abs_diff:.2e}; perplexity {r.tiedlm_perplexity:.4f} (tiedlm) vs {r.hf_perplexity:.4f} "
                     "(transformers)")
    if r.note:
        lines.append(r.note)
    return "\n".join(lines)
