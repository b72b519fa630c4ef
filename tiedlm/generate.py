"""`tiedlm sample`: text from a run's checkpoint, streamed as it is generated.

Sampling is ancestral with temperature, top-k and top-p (nucleus) filtering, drawn from a
generator seeded with --seed, so a seed gives the same text on the same device; temperature 0 is
greedy. A sample stops at the end-of-text token or after --max-new-tokens. The context is the
last block_size tokens; a longer prompt is cut from the left, and a note says so.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Iterator


@dataclass
class SampleOptions:
    prompt: str = ""
    max_new_tokens: int = 200
    temperature: float = 1.0
    top_k: int | None = None
    top_p: float | None = None
    seed: int = 0
    num_samples: int = 1


def next_token(logits: Any, opts: SampleOptions, gen: Any) -> int:
    """One token from the last position's logits (V,) under the options."""
    import torch

    logits = logits.float()
    if opts.temperature == 0:
        return int(logits.argmax())
    logits = logits / opts.temperature
    if opts.top_k is not None and opts.top_k < logits.numel():
        kth = torch.topk(logits, opts.top_k).values[-1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = torch.softmax(logits, dim=-1)
    if opts.top_p is not None and opts.top_p < 1.0:
        sorted_p, order = torch.sort(probs, descending=True)
        keep = torch.cumsum(sorted_p, 0) - sorted_p < opts.top_p  # the smallest set with mass >= top_p
        probs = torch.zeros_like(probs).scatter(0, order[keep], sorted_p[keep])
        probs = probs / probs.sum()
    return int(torch.multinomial(probs.cpu(), 1, generator=gen))


def generate_ids(model: Any, context: list[int], opts: SampleOptions, gen: Any, block_size: int, eot_id: int,
                 device: Any, vocab_size: int | None = None) -> Iterator[int]:
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


def stream_text(tok: Any, ids: Iterator[int], write: Callable[[str], None]) -> list[int]:
    """Decode as tokens arrive and write each new piece of text; a byte-level token that ends
    inside a UTF-8 character waits for the next one. Returns the ids."""
    out: list[int] = []
    shown = ""
    for t in ids:
        out.append(t)
        text = tok.decode(out)
        if text.endswith("\ufffd"):
            continue
        if text.startswith(shown):
            write(text[len(shown):])
        shown = text
    text = tok.decode(out)
    if text.startswith(shown) and len(text) > len(shown):
        write(text[len(shown):])
    return out


def sample_run(run_dir: Any, opts: SampleOptions, write: Callable[[str], None], note: Callable[[str], None],
               device: str | None = None) -> list[list[int]]:
    """Samples from a run's latest checkpoint on the device the run would use (or `device`),
    written through `write` as they are generated; notes (a cut prompt) through `note`."""
    import torch

    from .device import resolve_device
    from .evaluate import load_run_model

    rm = load_run_model(run_dir)
    tok, T = rm.data.tokenizer, rm.cfg.model.block_size
    dev = resolve_device(device or rm.cfg.train.device)
    model = rm.model.to(dev).eval()
    context = [tok.eot_id] + (tok.encode(opts.prompt) if opts.prompt else [])  # a document starts after <eot>
    if len(context) > T:
        note(f"the prompt is {len(context) - 1:,} tokens, more than the block size ({T}): only its last {T} "
             "are the context")
        context = context[-T:]
    gen = torch.Generator().manual_seed(opts.seed)
    samples = []
    for i in range(opts.num_samples):
        if opts.num_samples > 1:
            write(f"{'' if i == 0 else chr(10)}--- sample {i + 1} ---\n")
        write(opts.prompt)
        ids = generate_ids(model, context, opts, gen, T, tok.eot_id, dev, vocab_size=tok.vocab_size)
        samples.append(stream_text(tok, ids, write))
        write("\n")
    return samples
