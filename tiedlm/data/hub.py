"""A run's tokenizer as a Hugging Face `tokenizer.json` (with tokenizer_config.json), for every
tokenizer kind, encoding text to the same ids as tiedlm: bpe, word and pretrained are already
`tokenizers` models; byte becomes a byte-level BPE without merges whose ids are the byte values;
char becomes a BPE without merges over the characters, <unk> for the rest."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import tokenizers

    from .tokenizers import Tokenizer


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's printable stand-in for each byte, which tokenizers' ByteLevel pre-tokenizer uses."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    chars, extra = list(keep), 0
    for b in range(256):
        if b not in keep:
            keep.append(b)
            chars.append(256 + extra)
            extra += 1
    return {b: chr(c) for b, c in zip(keep, chars)}


def to_hf_tokenizer(tok: Tokenizer) -> tokenizers.Tokenizer:
    """A `tokenizers.Tokenizer` that encodes like `tok` (a tiedlm Tokenizer)."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

    if tok.kind in ("bpe", "word", "pretrained"):
        return Tokenizer.from_str(tok._tok.to_str())
    if tok.kind == "byte":
        vocab = {ch: b for b, ch in _bytes_to_unicode().items()}
        out = Tokenizer(models.BPE(vocab=vocab, merges=[]))
        out.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
        out.decoder = decoders.ByteLevel()
        out.add_special_tokens([AddedToken("<eot>", special=True)])  # id 256, after the 256 bytes
        return out
    vocab = {"<unk>": 0, "<eot>": 1, **{c: i for i, c in enumerate(tok.chars, start=2)}}
    out = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>"))
    out.decoder = decoders.Fuse()  # characters are joined as they are, with no space between them
    out.add_special_tokens([AddedToken("<unk>", special=True), AddedToken("<eot>", special=True)])
    return out


def special_tokens(tok: Tokenizer) -> dict:
    eot = tok.decode([tok.eot_id]) if tok.kind != "byte" else "<eot>"
    out = {"bos_token": eot, "eos_token": eot}
    if tok.unk_id is not None:
        out["unk_token"] = tok.decode([tok.unk_id])
    return out


def write_hf_tokenizer(tok: Tokenizer, folder: Path, block_size: int) -> None:
    """tokenizer.json, tokenizer_config.json and special_tokens_map.json into `folder`."""
    folder = Path(folder)
    to_hf_tokenizer(tok).save(str(folder / "tokenizer.json"))
    specials = special_tokens(tok)
    # split_special_tokens: text that contains "<|endoftext|>" is encoded as text, as tiedlm does;
    # only the data pipeline puts end-of-text ids between documents.
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": block_size,
              "clean_up_tokenization_spaces": False, "split_special_tokens": True, **specials}
    (folder / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")
    (folder / "special_tokens_map.json").write_text(json.dumps(specials, indent=2) + "\n")
