"""The leak measure: how much of each evaluation split is found, verbatim, in the training split.

A carving of single random lines puts the copies of a repeated line (a licence, boilerplate, a line
of code) on both sides, so that the model is scored on text it was trained on. For validation and
test, this counts the documents (lines, for text files) of at least MIN_CHARS characters whose
text, stripped of surrounding whitespace, is also a training document:

    {"validation": {"unit": "lines", "min_chars": 32, "checked": 1512, "in_train": 3, "share": 0.00198,
                    "train_checked": 29499, "train_documents": 29499},
     "test": {...}}

`checked` counts the evaluation documents long enough to count, `share` is in_train / checked (None
when nothing was long enough). Each training document is kept as an 8-byte blake2b digest in one
numpy array (8 bytes a document; the odds that a line is matched by a different one are about
T / 2**64 for T training documents, 2·10^-13 at the bound below), sorted, and the evaluation
digests are looked up in it. The work is bounded: at most TRAIN_LIMIT documents or CHARS_LIMIT
characters from the start of the training split, and EVAL_LIMIT documents of each evaluation
split; `train_checked` says how many training documents were read, `train_documents` how many
there are.

The measure is taken where the documents are read (data.prepare_data), on the whole training split
(before data.max_train_tokens and data.train_fraction, which keep a prefix of it; a stream: the
documents encoded), and kept with the tokenizer in the cache, so a cached dataset gives it
without reading its text again.
"""

from __future__ import annotations

import hashlib
from typing import Any, Iterator

import numpy as np

from .documents import ArrowDocs, Docs
from .sources import Source

# Lines shorter than this are not counted. Short lines repeat in any text without carrying a
# leak: Tiny Shakespeare's speaker names ("KING RICHARD III:", "Exeunt.", up to "ARCHBISHOP OF
# YORK:", 19 characters, repeated up to 138 times) and WikiText's section headings ("= = Personal
# life = =", up to 31 characters) stand on both sides of any carving by lines, and at 20
# characters 2% of WikiText-2's test lines were found in its validation text for headings alone.
# From 32 characters (about six English words) none of those counts; a line that long found
# verbatim in train is a copy (a licence, boilerplate, a line of code, a repeated passage).
MIN_CHARS = 32
# The work is bounded, for datasets far larger than a run reads: at most this many documents (and
# characters) from the start of the training split, whichever ends first (4M digests are 32 MB;
# 10^9 characters take about 10 s to hash), and from each evaluation split.
TRAIN_LIMIT = 4_000_000
EVAL_LIMIT = 1_000_000
CHARS_LIMIT = 1_000_000_000
VERSION = 1  # of the measure: a stored one of another version (or MIN_CHARS) is measured again
_EVAL = ("validation", "test")
_CHUNK = 1 << 14  # documents taken from an Arrow column at a time


class Digests:
    """The digests of one split's documents of at least MIN_CHARS characters (stripped of the
    whitespace around them), among its first `limit` documents and CHARS_LIMIT characters."""

    def __init__(self, limit: int):
        self.limit = limit
        self.read = 0  # documents read (of any length)
        self.chars = 0
        self._parts: list[bytes] = []

    @property
    def full(self) -> bool:
        return self.read >= self.limit or self.chars >= CHARS_LIMIT

    def add(self, batch: list[str]) -> None:
        """Documents as they come, until full."""
        for text in batch:
            if self.full:
                return
            self.read += 1
            self.chars += len(text)
            s = text.strip()
            if len(s) >= MIN_CHARS:
                self._parts.append(_digest(s))

    def add_arrow(self, docs: ArrowDocs) -> None:
        """The documents of an Arrow column, trimmed and filtered by length in Arrow (3x faster
        than reading them as Python strings first)."""
        import pyarrow as pa
        import pyarrow.compute as pc

        for i in range(0, docs.n, _CHUNK):
            if self.full:
                return
            taken = docs.column.take(pa.array(docs.indices[i:i + min(_CHUNK, self.limit - self.read)]))
            text = pc.utf8_trim_whitespace(taken)
            long = pc.filter(text, pc.greater_equal(pc.utf8_length(text), MIN_CHARS))
            self.read += len(taken)
            self.chars += int(pc.sum(pc.utf8_length(taken)).as_py() or 0)
            self._parts.extend(map(_digest, long.to_pylist()))

    def array(self) -> np.ndarray:
        return np.frombuffer(b"".join(self._parts), dtype=np.uint64)


def _digest(text: str) -> bytes:
    return hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=8).digest()


def _read(docs: Docs, limit: int) -> Digests:
    out = Digests(limit)
    if isinstance(docs, ArrowDocs):
        out.add_arrow(docs)
        return out
    for batch in docs.batches():
        out.add(batch)
        if out.full:
            break
    return out


def result(train: Digests, evals: dict[str, Digests], unit: str, train_documents: int | None) -> dict:
    """{split: {unit, min_chars, checked, in_train, share, train_checked, train_documents}}."""
    seen = np.sort(train.array())  # looked up by binary search (np.unique and np.isin hash: 50x slower)
    out = {}
    for name, dg in evals.items():
        wanted = dg.array()
        at = np.minimum(np.searchsorted(seen, wanted), max(len(seen) - 1, 0))
        checked = int(wanted.size)
        hits = int(np.count_nonzero(seen[at] == wanted)) if len(seen) else 0
        out[name] = {"unit": unit, "min_chars": MIN_CHARS, "checked": checked, "in_train": hits,
                     "share": hits / checked if checked else None, "train_checked": train.read,
                     "train_documents": train_documents if train_documents is not None else train.read}
    return out


def measure(docs: dict[str, Docs], unit: str) -> dict:
    """The overlap of documents that can be read again (not a stream)."""
    train = _read(docs["train"], TRAIN_LIMIT)
    evals = {name: _read(docs[name], EVAL_LIMIT) for name in _EVAL if name in docs}
    return result(train, evals, unit, docs["train"].n)


class Hashing(Docs):
    """A stream's documents as the encoder reads them, each batch added to `sink` as it passes (a
    stream is read once). What the tokenizer trainer reads (head) is not added: the encoder reads
    it again."""

    def __init__(self, inner: Docs, sink: Digests):
        self.inner, self.sink, self.n = inner, sink, inner.n

    def batches(self) -> Iterator[list[str]]:
        for batch in self.inner.batches():
            if not self.sink.full:
                self.sink.add(batch)
            yield batch

    def head(self, max_bytes: int) -> Iterator[list[str]]:
        return self.inner.head(max_bytes)


def hash_while_encoding(docs: dict[str, Docs]) -> dict[str, Digests]:
    """Wrap each split of docs (in place) so that encoding it collects its digests."""
    sinks = {name: Digests(TRAIN_LIMIT if name == "train" else EVAL_LIMIT) for name in docs}
    for name in docs:
        docs[name] = Hashing(docs[name], sinks[name])
    return sinks


def is_current(stored: Any) -> bool:
    """A stored measure that this code would give the same way."""
    return isinstance(stored, dict) and stored.get("version") == VERSION and stored.get("min_chars") == MIN_CHARS


def unit_of(source: Source) -> str:
    """What one document of the source is, in words: lines of text files, speeches of Tiny
    Shakespeare, paragraphs of the Python documentation, else documents (records, rows)."""
    if source.kind == "builtin":
        return {"shakespeare": "speeches", "pydoc": "paragraphs"}.get(source.fingerprint.get("builtin"),
                                                                      "documents")
    if source.kind == "files" and source.builder == "text":
        return "lines"
    if source.kind == "folder":  # load_dataset(folder) reads .txt and .md files with the text builder
        files = [f for fs in (source.files or {}).values() for f in fs] or \
            [s[0] for s in source.fingerprint.get("files", [])]
        if files and all(str(f).lower().endswith((".txt", ".text", ".md")) for f in files):
            return "lines"
    return "documents"
