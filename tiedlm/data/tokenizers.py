"""The five tokenizer kinds (byte, char, word, bpe, pretrained): training on the train split,
saving and loading, the fingerprint of what a trained tokenizer depends on, and encoding a
split into one array of token ids.

Ids are 0..vocab_size-1; eot_id follows every document; unk_id, where there is one, stands for
what the vocabulary lacks. encode_batch is the fast path the pipeline uses. `tokenizers` (the
Rust library) is imported only where a bpe, word or pretrained tokenizer is built or read.
"""

from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING, Iterator, Protocol

import numpy as np

from ..config import TokenizerConfig
from ..errors import ConfigError, DataError
from ..files import atomic_write_json, first_line, read_json, replace_atomically

if TYPE_CHECKING:
    import tokenizers

META = "tiedlm_tokenizer.json"  # what kind of tokenizer a folder holds; load_tokenizer reads it
HF_FILE = "tokenizer.json"
_PIECE = 1 << 16  # characters
_EOT_CANDIDATES = ("<|endoftext|>", "<|end_of_text|>", "</s>", "<eos>", "<|eot_id|>", "<eot>", "<|im_end|>", "[SEP]")


class Texts(Protocol):
    """One split's documents as a tokenizer reads them (documents.Docs is one)."""

    n: int | None  # documents, when known before reading them

    def batches(self) -> Iterator[list[str]]: ...

    def head(self, max_bytes: int) -> Iterator[list[str]]: ...


def _write_meta(folder: Path, meta: dict) -> None:
    atomic_write_json(Path(folder) / META, meta, indent=1)


class Tokenizer:
    """The protocol the trainer and evaluator use. Subclasses: ByteTokenizer, CharTokenizer and
    HFTokenizer (bpe, word, pretrained); load_tokenizer reads any of them back."""

    kind: str
    vocab_size: int
    eot_id: int
    unk_id: int | None = None

    def encode(self, text: str) -> list[int]:
        return self.encode_batch([text])[0].tolist()

    def encode_batch(self, texts: list[str]) -> list[np.ndarray]:
        raise NotImplementedError

    def decode(self, ids) -> str:
        raise NotImplementedError

    def save(self, folder: Path) -> None:
        raise NotImplementedError

    def prefix_text(self, text: str, n_tokens: int) -> str:
        """The part of `text` that its first n_tokens tokens cover (for a document cut by a token limit)."""
        return self.decode(self.encode(text)[:n_tokens])

    def __repr__(self) -> str:
        return f"<{self.kind} tokenizer, {self.vocab_size} tokens>"


def _split_at(ids, sep: int) -> list[list[int]]:
    pieces: list[list[int]] = [[]]
    for i in (int(x) for x in ids):
        if i == sep:
            pieces.append([])
        else:
            pieces[-1].append(i)
    return pieces


class ByteTokenizer(Tokenizer):
    """The 256 byte values are their own ids and <eot> is 256. Nothing to train."""

    kind = "byte"
    vocab_size = 257
    eot_id = 256
    unk_id = None

    def encode_batch(self, texts: list[str]) -> list[np.ndarray]:
        return [np.frombuffer(t.encode("utf-8"), dtype=np.uint8) for t in texts]

    def decode(self, ids) -> str:
        return "<eot>".join(bytes(p).decode("utf-8", errors="replace") for p in _split_at(ids, self.eot_id))

    def prefix_text(self, text: str, n_tokens: int) -> str:
        return text.encode("utf-8")[:n_tokens].decode("utf-8", errors="ignore")

    def save(self, folder: Path) -> None:
        _write_meta(folder, {"kind": "byte"})


class CharTokenizer(Tokenizer):
    """The most frequent characters of the training text; <unk> = 0, <eot> = 1, then characters."""

    kind = "char"
    unk_id = 0
    eot_id = 1

    def __init__(self, chars: list[str]):
        self.chars = list(chars)
        self.vocab_size = len(self.chars) + 2
        # A lookup table over every Unicode code point (4.4 MB) encodes a whole batch in one numpy op.
        self._table = np.zeros(0x110000, dtype=np.int32)
        self._table[[ord(c) for c in self.chars]] = np.arange(2, self.vocab_size)
        self._strings = ["<unk>", "<eot>", *self.chars]

    @staticmethod
    def _code_points(text: str) -> np.ndarray:
        return np.frombuffer(text.encode("utf-32-le", errors="surrogatepass"), dtype="<u4")

    @classmethod
    def train(cls, batches: Iterator[list[str]], vocab_size: int) -> "CharTokenizer":
        counts = np.zeros(0x110000, dtype=np.int64)
        for batch in batches:
            counts += np.bincount(cls._code_points("".join(batch)), minlength=0x110000)
        seen = np.flatnonzero(counts)
        keep = seen[np.lexsort((seen, -counts[seen]))][: vocab_size - 2]  # by count, ties by code point
        return cls([chr(c) for c in keep])

    def encode_batch(self, texts: list[str]) -> list[np.ndarray]:
        ids = self._table[self._code_points("".join(texts))]
        return np.split(ids, np.cumsum([len(t) for t in texts])[:-1])

    def decode(self, ids) -> str:
        return "".join(self._strings[int(i)] for i in ids)

    def prefix_text(self, text: str, n_tokens: int) -> str:
        return text[:n_tokens]

    def save(self, folder: Path) -> None:
        _write_meta(folder, {"kind": "char", "chars": self.chars})


class HFTokenizer(Tokenizer):
    """bpe, word and pretrained: a `tokenizers.Tokenizer`, whose encoder runs in Rust over threads."""

    def __init__(self, kind: str, tok: tokenizers.Tokenizer, eot_token: str, added: list[str] | None = None):
        self.kind = kind
        self._tok = tok
        self.eot_token = eot_token
        self.added = list(added or [])  # tokenizer.add_tokens: the new tokens, in id order
        self.added_ids = [tok.token_to_id(t) for t in self.added]
        self._context: np.ndarray | None = None  # pieces_of's "a", encoded once
        self.vocab_size = tok.get_vocab_size(with_added_tokens=True)
        self.eot_id = tok.token_to_id(eot_token)
        unk = getattr(tok.model, "unk_token", None)
        self.unk_id = tok.token_to_id(unk) if unk else None
        # Text that happens to contain "<|endoftext|>" is encoded as text: only the pipeline puts
        # end-of-text ids between documents.
        tok.encode_special_tokens = True

    def _encode(self, texts: list[str]) -> list[np.ndarray]:
        encodings = self._tok.encode_batch_fast(texts, add_special_tokens=False)
        return [np.asarray(e.ids, dtype=np.uint32) for e in encodings]

    def encode_batch(self, texts: list[str]) -> list[np.ndarray]:
        # encode_batch_fast runs one thread per text: long documents are cut into pieces that
        # encode to the same ids (see _cut), so one 5 MB document encodes as fast as 5 MB of lines.
        # A pretrained tokenizer's pre-tokenizer is unknown, so its texts are never cut.
        if self.kind == "pretrained" or max(map(len, texts), default=0) <= _PIECE:
            return self._encode(texts)
        cuts = [_cut(t) for t in texts]
        ids = self._encode([p for c in cuts for p in c])
        bounds = np.cumsum([0] + [len(c) for c in cuts])
        return [np.concatenate(ids[a:b]) if b - a > 1 else ids[a] for a, b in zip(bounds[:-1], bounds[1:])]

    def decode(self, ids) -> str:
        return self._tok.decode([int(i) for i in ids], skip_special_tokens=False)

    def prefix_text(self, text: str, n_tokens: int) -> str:
        if self.kind == "word":  # one token per whitespace word
            return " ".join(text.split()[:n_tokens])
        return super().prefix_text(text, n_tokens)

    def save(self, folder: Path) -> None:
        replace_atomically(Path(folder) / HF_FILE, lambda tmp: self._tok.save(str(tmp)))
        _write_meta(folder, {"kind": self.kind, "eot_token": self.eot_token,
                             **({"added": self.added} if self.added else {})})

    def pieces_of(self, piece: str) -> int:
        """How many tokens `piece` takes inside a text (after a letter, so that a tokenizer that
        prepends a space marker to a text does not count it), or 0 where that cannot be told; an
        <unk> counts as a piece the tokenizer does not hold (2)."""
        if self._context is None:
            self._context = self._encode(["a"])[0]
        before = self._context
        ids = self._encode(["a" + piece])[0]
        if len(ids) < len(before) or list(ids[:len(before)]) != list(before):
            ids = self._encode([piece])[0]  # the context merged into the piece: the piece alone
        else:
            ids = ids[len(before):]
        if self.unk_id is not None and self.unk_id in ids:
            return 2
        return len(ids)

    def with_added(self, tokens: list[str]) -> HFTokenizer:
        """This tokenizer with new tokens (each one id, matched in the text before the rest is
        split), given ids after every existing one; a token it already has is refused."""
        from tokenizers import AddedToken

        have = [t for t in tokens if self._tok.token_to_id(t) is not None or self.pieces_of(t) == 1]
        if have:
            raise ConfigError(f"tokenizer.add_tokens: {have[0]!r} is already a token of the tokenizer — remove it "
                              "from the list")
        # Matched wherever its text stands, the start of a longer word too (" king" in " kingdom", as a
        # BPE piece would be): single_word would refuse " king" after "the" (a letter before the
        # space), and lstrip would drop the space it absorbs from the decoded text.
        self._tok.add_tokens([AddedToken(t, normalized=False) for t in tokens])
        return HFTokenizer(self.kind, self._tok, self.eot_token, tokens)


def _cut(text: str, size: int = _PIECE) -> list[str]:
    """Cut a long text into pieces of about `size` characters, only after a line break that has a
    non-space character on both sides. Neither whitespace splitting nor byte-level BPE's
    pre-tokenizer (GPT-2's regex) joins anything across such a point: "\n" between two
    non-space characters is a pre-token of its own. So the pieces encode to the same ids as the
    whole, and count the same words for training."""
    out, start = [], 0
    while len(text) - start > size:
        i = text.find("\n", start + size)
        while i != -1 and (i + 1 >= len(text) or text[i + 1].isspace() or text[i - 1].isspace()):
            i = text.find("\n", i + 1)
        if i == -1:
            break
        out.append(text[start:i + 1])
        start = i + 1
    out.append(text[start:])
    return out


# --------------------------------------------------------------------------------------------
# Loading and training


def load_tokenizer(folder: Path) -> Tokenizer:
    """Read what Tokenizer.save wrote into `folder`."""
    folder = Path(folder)
    meta = read_json(folder / META)
    if meta is None:
        raise DataError(f"{folder} holds no tiedlm tokenizer ({META} is missing or unreadable) — "
                        "prepare the data again (tiedlm data --config ...)")
    if meta["kind"] == "byte":
        return ByteTokenizer()
    if meta["kind"] == "char":
        return CharTokenizer(meta["chars"])
    from tokenizers import Tokenizer as RustTokenizer

    try:
        tok = RustTokenizer.from_file(str(folder / HF_FILE))
    except Exception as exc:  # the Rust side raises plain Exceptions
        raise DataError(f"cannot read {folder / HF_FILE}: {first_line(exc)} — prepare the data again") from exc
    return HFTokenizer(meta["kind"], tok, meta["eot_token"], meta.get("added"))


def _train_word(batches: Iterator[list[str]], vocab_size: int) -> HFTokenizer:
    from tokenizers import Tokenizer as RustTokenizer
    from tokenizers import models, pre_tokenizers

    counts: Counter[str] = Counter()
    for batch in batches:
        for text in batch:
            counts.update(text.split())
    specials = ["<unk>", "<eot>"]
    for s in specials:  # WikiText already contains "<unk>": it is the unknown token, not a word
        counts.pop(s, None)
    # by count, ties by the word itself, so the vocabulary does not depend on hash order
    words = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))[: vocab_size - len(specials)]
    vocab = {w: i for i, w in enumerate(specials + [w for w, _ in words])}
    tok = RustTokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()  # line breaks are whitespace too
    return HFTokenizer("word", tok, "<eot>")


def _train_bpe(batches: Iterator[list[str]], vocab_size: int) -> HFTokenizer:
    from tokenizers import Tokenizer as RustTokenizer
    from tokenizers import decoders, models, pre_tokenizers, trainers

    # Byte-level BPE as in GPT-2: every byte is in the alphabet, so there is no <unk> and decoding
    # reproduces the text exactly.
    tok = RustTokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=["<|endoftext|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(batches, trainer)
    return HFTokenizer("bpe", tok, "<|endoftext|>")


def _pretrained_file(tcfg: TokenizerConfig) -> Path:
    path = Path(tcfg.path or "").expanduser()
    if path.is_dir() and (path / HF_FILE).is_file():
        path = path / HF_FILE
    if not path.is_file():
        raise ConfigError(f"tokenizer.path {tcfg.path} does not exist — point it at a tokenizer.json file "
                          "(as saved by the `tokenizers` library or found in a Hugging Face model repo)")
    return path


def _load_pretrained(tcfg: TokenizerConfig) -> HFTokenizer:
    from tokenizers import Tokenizer as RustTokenizer

    path = _pretrained_file(tcfg)
    try:
        tok = RustTokenizer.from_file(str(path))
    except Exception as exc:
        raise ConfigError(f"cannot read tokenizer.path {path} as a tokenizer.json ({first_line(exc)}) — "
                          "use a file saved by the `tokenizers` library") from exc
    wanted = [tcfg.eot_token] if tcfg.eot_token else list(_EOT_CANDIDATES)
    found = [t for t in wanted if tok.token_to_id(t) is not None]
    if not found:
        raise ConfigError(f"tokenizer {path} has no end-of-text token ({', '.join(wanted)} not in its vocabulary) — "
                          "set tokenizer.eot_token to the token it uses between documents")
    return HFTokenizer("pretrained", tok, found[0])


def _training_batches(docs: Texts, max_bytes: int, progress: bool) -> Iterator[list[str]]:
    """The training split's first max_bytes of text, in batches, with a progress bar."""
    from tqdm import tqdm

    seen = 0
    with tqdm(unit="B", unit_scale=True, desc="tokenizer text", file=sys.stderr,
              disable=None if progress else True, leave=False) as bar:  # None: off when not a terminal
        for batch in docs.head(max_bytes):
            batch = [piece for text in batch for piece in _cut(text)]  # see _cut: same counts, faster
            out = []
            for text in batch:
                n = len(text.encode("utf-8"))
                if seen + n > max_bytes:  # cut the last document at the budget
                    text = text.encode("utf-8")[: max_bytes - seen].decode("utf-8", errors="ignore")
                    n = max_bytes - seen
                out.append(text)
                seen += n
                if seen >= max_bytes:
                    break
            bar.update(sum(len(t.encode("utf-8")) for t in out))
            yield out
            if seen >= max_bytes:
                return


def train_tokenizer(tcfg: TokenizerConfig, docs: Texts, progress: bool = False) -> Tokenizer:
    """A tokenizer of tcfg.kind (config.validate admits only the five kinds), trained where it
    needs training on the given training documents."""
    if tcfg.kind == "byte":
        return ByteTokenizer()
    if tcfg.kind == "pretrained":
        tok = _load_pretrained(tcfg)
        if tcfg.add_tokens is None:
            return tok
        new = tcfg.add_tokens if isinstance(tcfg.add_tokens, list) else \
            frequent_split_words(tok, _training_batches(docs, tcfg.max_train_bytes, progress), tcfg.add_tokens)
        tok = tok.with_added(new)
        fewer = fewer_added(tcfg, tok)
        if fewer:  # said once, where the tokenizer is made: the runs that read it from the cache share it
            sys.stderr.write(f"warning: {fewer}\n")
        return tok
    train = {"char": CharTokenizer.train, "word": _train_word, "bpe": _train_bpe}[tcfg.kind]
    return train(_training_batches(docs, tcfg.max_train_bytes, progress), tcfg.vocab_size)


ADD_TOKENS_RULE = 2  # how add_tokens: N picks its pieces (frequent_split_words); part of the tokenizer's key


def frequent_split_words(tok: HFTokenizer, batches: Iterator[list[str]], n: int) -> list[str]:
    """tokenizer.add_tokens: N — the N most frequent pieces of the training text (its first
    max_train_bytes) that the tokenizer's own pre-tokenizer cuts out (" word" with its space, as a
    byte-level BPE cuts it; "word" for a whitespace one) and that it then encodes as two tokens or
    more, or as its <unk>. Each is counted as it stands in the text, so a word never seen after a
    space is never added with one. Fewer when the text has fewer such pieces."""
    counts: Counter[str] = Counter()
    pre = tok._tok.pre_tokenizer
    for batch in batches:
        for text in batch:
            if pre is None:
                counts.update(" " + w for w in text.split())
            else:
                counts.update(text[a:b] for _, (a, b) in pre.pre_tokenize_str(text))
    out = []
    for piece, _ in counts.most_common():
        if piece.strip() and tok.pieces_of(piece) != 1 and tok._tok.token_to_id(piece) is None:
            out.append(piece)
            if len(out) == n:
                break
    if not out:
        raise ConfigError(f"tokenizer.add_tokens: {n} — the training text has no word that the tokenizer splits or reads "
                          "as <unk>; nothing to add (remove tokenizer.add_tokens)")
    return out


def fewer_added(tcfg: TokenizerConfig, tok: Tokenizer) -> str | None:
    """tokenizer.add_tokens: N where the training text had fewer pieces to add (frequent_split_words
    takes what there is): the warning that says how many were added; None otherwise."""
    n, added = tcfg.add_tokens, getattr(tok, "added", None)
    if not isinstance(n, int) or isinstance(n, bool) or added is None or len(added) >= n:
        return None
    return (f"tokenizer.add_tokens: {n:,} added {len(added):,} new tokens, every piece of the training text (its "
            f"first {tcfg.max_train_bytes:,} bytes, tokenizer.max_train_bytes) that the tokenizer splits or reads "
            f"as <unk> — set tokenizer.add_tokens: {len(added)} to ask for what there is")


def tokenizer_fingerprint(tcfg: TokenizerConfig) -> dict:
    """What the trained tokenizer depends on (besides the training split)."""
    if tcfg.kind == "byte":
        return {"kind": "byte"}
    if tcfg.kind == "pretrained":
        path = _pretrained_file(tcfg)
        st = path.stat()
        return {"kind": "pretrained", "file": [str(path.resolve()), st.st_size, st.st_mtime_ns],
                "eot_token": tcfg.eot_token,
                **({"add_tokens": tcfg.add_tokens, "max_train_bytes": tcfg.max_train_bytes,
                    "pieces": ADD_TOKENS_RULE} if tcfg.add_tokens is not None else {})}
    return {"kind": tcfg.kind, "vocab_size": tcfg.vocab_size, "max_train_bytes": tcfg.max_train_bytes}


# --------------------------------------------------------------------------------------------
# Encoding a split


def token_dtype(vocab_size: int) -> type:
    return np.uint16 if vocab_size <= 1 << 16 else np.uint32


def encode_split(name: str, docs: Texts, tok: Tokenizer, limit: int | None,
                 progress: bool = False) -> tuple[np.ndarray, dict]:
    """All documents of a split as one array, each followed by tok.eot_id, cut at `limit` tokens;
    and the split's statistics, of the text actually kept."""
    from tqdm import tqdm

    dtype = token_dtype(tok.vocab_size)
    parts: list[np.ndarray] = []
    n_tokens = 0
    stats = Counter()  # docs, chars, bytes, words, separators, unk
    with tqdm(total=docs.n, unit="doc", desc=f"encoding {name}", file=sys.stderr,
              disable=None if progress else True,  # None: off when stderr is not a terminal
              leave=False) as bar:
        for batch in docs.batches():
            encoded = tok.encode_batch(batch)
            lengths = np.array([len(e) for e in encoded], dtype=np.int64)
            tail = None
            if limit is not None and n_tokens + int(lengths.sum()) + len(batch) > limit:
                room = limit - n_tokens
                fits = int(np.searchsorted(np.cumsum(lengths + 1), room, side="right"))  # whole docs + EOT
                cut = room - int(lengths[:fits].sum()) - fits  # tokens of the next document that still fit
                if cut > 0:  # that document is kept cut short, without a separator after it
                    tail = (tok.prefix_text(batch[fits], cut), encoded[fits][:cut])
                batch, encoded, lengths = batch[:fits], encoded[:fits], lengths[:fits]
            if batch:
                flat = np.concatenate(encoded).astype(dtype, copy=False)
                parts.append(np.insert(flat, np.cumsum(lengths), tok.eot_id))  # an EOT after every document
                n_tokens += len(parts[-1])
                _count(stats, batch, flat, tok)
                stats["separators"] += len(batch)
            if tail is not None:
                parts.append(tail[1].astype(dtype, copy=False))
                n_tokens += len(tail[1])
                _count(stats, [tail[0]], tail[1], tok)
            bar.update(len(batch) + (tail is not None))
            if limit is not None and n_tokens >= limit:
                break
    tokens = np.concatenate(parts) if parts else np.zeros(0, dtype=dtype)
    words, sep = stats["words"], stats["separators"]
    return tokens, {
        "n_docs": stats["docs"], "n_chars": stats["chars"],
        "n_bytes": stats["bytes"] + sep,  # a separator stands for one byte (a line break)
        "n_words": words + sep,  # and for one word (PTB's <eos>)
        "oov_rate": (stats["unk"] / words if words else 0.0) if tok.kind == "word" else None,
    }


def _count(stats: Counter, texts: list[str], ids: np.ndarray, tok: Tokenizer) -> None:
    stats["docs"] += len(texts)
    stats["chars"] += sum(map(len, texts))
    stats["bytes"] += sum(len(t.encode("utf-8")) for t in texts)
    stats["words"] += sum(len(t.split()) for t in texts)
    if tok.unk_id is not None:
        stats["unk"] += int(np.count_nonzero(ids == tok.unk_id))
