"""`tiedlm sample`: text from a run's checkpoint, streamed as it is generated.

Sampling is ancestral with temperature, top-k and top-p (nucleus) filtering, drawn from a
generator seeded with --seed, so a seed gives the same text on the same device; temperature 0 is
greedy. A sample stops at the end-of-text token or after --max-new-tokens. The context is the
last block_size tokens; a longer prompt is cut from the left, and a note says so, as it does for
prompt words or characters the vocabulary lacks (the model sees <unk>). The continuation is
decoded together with the prompt, so it joins the prompt as the tokenizer joins tokens. A tiny
temperature or top-p degenerates to greedy sampling, never to a nan distribution. Torch's CPU
threads are the run's train.threads, as in training.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Iterable, Iterator
from .device import cpu_threads, resolve_device

if TYPE_CHECKING:
    from pathlib import Path

    import torch

    from .data import Tokenizer


@dataclass
class SampleOptions:
    prompt: str = ""
    max_new_tokens: int = 200
    temperature: float = 1.0
    top_k: int | None = None
    top_p: float | None = None
    seed: int = 0
    num_samples: int = 1


def next_token(logits: torch.Tensor, opts: SampleOptions, gen: torch.Generator) -> int:
    """One token from the last position's logits (V,) under the options.

    The logits are shifted so that the largest is 0 before they are divided by the temperature,
    in float64: a tiny temperature (1e-300) then sends every other token to -inf and keeps the top
    one at 0, a distribution that is greedy, never inf/inf = nan. Top-p always keeps the most
    likely token, however small top_p is; a distribution left with one token gives that token."""
    import torch

    logits = logits.cpu().double()  # on the CPU: MPS has no float64; the draw is on the CPU anyway
    if opts.temperature == 0:
        return int(logits.argmax())
    logits = (logits - logits.max()) / opts.temperature
    if opts.top_k is not None and opts.top_k < logits.numel():
        kth = torch.topk(logits, opts.top_k).values[-1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = torch.softmax(logits, dim=-1)
    if opts.top_p is not None and opts.top_p < 1.0:
        sorted_p, order = torch.sort(probs, descending=True)
        keep = torch.cumsum(sorted_p, 0) - sorted_p < opts.top_p  # the smallest set with mass >= top_p
        keep[0] = True  # the most likely token, even where top_p is below every probability
        probs = torch.zeros_like(probs).scatter(0, order[keep], sorted_p[keep])
        probs = probs / probs.sum()
    t = int(torch.multinomial(probs, 1, generator=gen))  # drawn in every case: a seed's draws stay in step
    only = torch.nonzero(probs > 0)
    return int(only[0]) if len(only) == 1 else t


def generate_ids(model: torch.nn.Module, context: list[int], opts: SampleOptions, gen: torch.Generator,
                 block_size: int, eot_id: int, device: torch.device | str,
                 vocab_size: int | None = None) -> Iterator[int]:
    """Token ids after `context`, one at a time, up to the end-of-text token (not yielded)."""
    import torch

    ids = list(context)
    with torch.inference_mode():
        for _ in range(opts.max_new_tokens):
            x = torch.tensor([ids[-block_size:]], dtype=torch.long, device=device)
            logits = model(x)[0, -1]
            if vocab_size is not None:
                logits[vocab_size:] = float("-inf")  # padding rows of the vocabulary are no tokens
            t = next_token(logits, opts, gen)
            if t == eot_id:
                return
            ids.append(t)
            yield t


PREFIX_IDS = 64  # the prompt's last ids decoded before the continuation: enough for any decoder's join


def stream_text(tok: Tokenizer, ids: Iterator[int], write: Callable[[str], None], prefix: Iterable[int] = (),
                written: str = "") -> list[int]:
    """Decode as tokens arrive and write each new piece of text; a byte-level token that ends
    inside a UTF-8 character waits for the next one. Returns the ids.

    `prefix` (the prompt's ids) is decoded together with the new ids and what is written is the
    text beyond the prefix's own: the first new token is separated from the prompt as the
    tokenizer's decode separates them (a word tokenizer joins words with a space), whatever the
    kind. `written`: the prompt as already written; where it ends in whitespace, a word
    tokenizer's joining space is not written a second time."""
    prefix = [int(i) for i in prefix][-PREFIX_IDS:]
    out: list[int] = []
    base = tok.decode(prefix) if prefix else ""
    shown = base
    join = " " if getattr(tok, "kind", None) == "word" and written[-1:].isspace() and not base[-1:].isspace() else ""

    def emit(text: str) -> None:
        nonlocal join
        piece = text[len(shown):]
        if join and piece:
            piece, join = (piece[len(join):] if piece.startswith(join) else piece), ""
        if piece:
            write(piece)

    for t in ids:
        out.append(t)
        text = tok.decode(prefix + out)
        if text.endswith("\ufffd"):
            continue
        if text.startswith(shown):
            emit(text)
        shown = text
    text = tok.decode(prefix + out) if out else shown
    if text.startswith(shown) and len(text) > len(shown):
        emit(text)
    return out


def unknown_pieces(tok: Tokenizer, text: str) -> list[str]:
    """The words (word tokenizer) or characters (char tokenizer) of `text` that the tokenizer
    encodes as <unk>, each once, in order; [] for tokenizers without <unk> (byte, bpe)."""
    unk = getattr(tok, "unk_id", None)
    if unk is None or not text:
        return []
    ids = tok.encode(text)
    if tok.kind == "char":
        pieces = list(text)
    elif tok.kind == "word":
        pieces = text.split()
    else:  # a pretrained tokenizer with <unk>: the offsets of its encoding say which text it stands for
        try:
            enc = tok._tok.encode(text, add_special_tokens=False)
            ids, pieces = enc.ids, [text[a:b] for a, b in enc.offsets]
        except Exception:  # no offsets to be had: nothing to name
            return []
    if len(pieces) != len(ids):
        return []
    return list(dict.fromkeys(p for p, i in zip(pieces, ids) if int(i) == unk))


def _unknown_note(tok: Tokenizer, text: str) -> str | None:
    found = unknown_pieces(tok, text)
    if not found:
        return None
    one = len(found) == 1
    what = ("character" if tok.kind == "char" else "word") + ("" if one else "s")
    shown = ", ".join(repr(p) for p in found[:10]) + (f" and {len(found) - 10} more" if len(found) > 10 else "")
    return (f"the prompt's {what} {shown} {'is' if one else 'are'} not in the run's vocabulary: "
            f"the model sees <unk> for {'it' if one else 'them'}")


def sample_run(run_dir: str | Path, opts: SampleOptions, write: Callable[[str], None], note: Callable[[str], None],
               device: str | None = None) -> list[list[int]]:
    """Samples from a run's latest checkpoint on the device the run would use (or `device`), with
    the run's train.threads, written through `write` as they are generated; notes (a cut prompt,
    prompt words the vocabulary lacks) through `note`."""
    import torch

    from .evaluate import load_run_model

    rm = load_run_model(run_dir)
    tok, T = rm.data.tokenizer, rm.cfg.model.block_size
    dev = resolve_device(device or rm.cfg.train.device, "--device" if device else "the run's train.device",
                         "--device auto")
    model = rm.model.to(dev).eval()
    prompt_ids = tok.encode(opts.prompt) if opts.prompt else []
    unknown = _unknown_note(tok, opts.prompt)
    if unknown:
        note(unknown)
    context = [tok.eot_id] + prompt_ids  # a document starts after <eot>
    if len(context) > T:
        note(f"the prompt is {len(context) - 1:,} tokens, more than the block size ({T}): only its last {T} "
             "are the context")
        context = context[-T:]
    gen = torch.Generator().manual_seed(opts.seed)
    samples = []
    with cpu_threads(rm.cfg.train.threads):
        for i in range(opts.num_samples):
            if opts.num_samples > 1:
                write(f"{'' if i == 0 else chr(10)}--- sample {i + 1} ---\n")
            write(opts.prompt)
            ids = generate_ids(model, context, opts, gen, T, tok.eot_id, dev, vocab_size=tok.vocab_size)
            samples.append(stream_text(tok, ids, write, prefix=prompt_ids, written=opts.prompt))
            write("\n")
    return samples
