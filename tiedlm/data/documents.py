"""Documents: the non-empty texts of train, validation and test, read in batches.

Splits are mapped by name (data.train_split, data.validation_split, data.test_split, with the
usual aliases) or carved with data.validation_fraction / data.test_fraction: validation from train,
test from train or (data.test_from: validation) from validation; at random by document
(data.carve: random, seeded by data.split_seed) or as consecutive blocks at the end of the split
they come from (data.carve: contiguous, so neighbouring lines of one text never straddle training
and evaluation). The text is read from data.text_column; a streamed dataset is read once, in
order, and carved as it is read.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Iterator

import numpy as np

from . import builtin
from ..config.checks import SPLITS, carved_test_fits
from ..config import DataConfig
from ..errors import ConfigError, DataError, TiedlmError
from .sources import Source, load_raw, translate

if TYPE_CHECKING:
    import datasets
    import pyarrow as pa

BATCH_DOCS = 4096  # documents per encode_batch call (the Rust encoder spreads a batch over threads)
_ALIASES = {"validation": ("valid", "dev", "val"), "test": ()}  # WikiText's "valid", GLUE's "dev"


class Docs:
    """One split's documents. A tokenizer reads them through batches() and head()."""

    n: int | None  # documents, when known before reading them

    def batches(self) -> Iterator[list[str]]:
        """All documents from the start, in batches."""
        raise NotImplementedError

    def head(self, max_bytes: int) -> Iterator[list[str]]:
        """Batches from the start, at least max_bytes of text where there is that much (the reader stops)."""
        return self.batches()


class ArrowDocs(Docs):
    """Documents at `indices` of an Arrow string column: nothing is read until it is needed."""

    def __init__(self, column: pa.Array | pa.ChunkedArray, indices: np.ndarray):
        self.column = column  # pyarrow (Chunked)Array of strings
        self.indices = indices
        self.n = len(indices)

    @classmethod
    def of(cls, column: pa.Array | pa.ChunkedArray) -> ArrowDocs:
        """The non-empty (not only whitespace) documents of a column."""
        import pyarrow.compute as pc

        mask = pc.fill_null(pc.greater(pc.utf8_length(pc.utf8_trim_whitespace(column)), 0), False)
        return cls(column, np.flatnonzero(np.asarray(mask.to_numpy(zero_copy_only=False), dtype=bool)))

    def batches(self) -> Iterator[list[str]]:
        import pyarrow as pa

        for i in range(0, self.n, BATCH_DOCS):
            yield self.column.take(pa.array(self.indices[i:i + BATCH_DOCS])).to_pylist()


class StreamDocs(Docs):
    """Documents from an iterator, read once. What the tokenizer trainer reads (head) is kept, so the
    encoder reads it again and then goes on with the stream."""

    n = None

    def __init__(self, make_iter: Callable[[], Iterator[str]]):
        self.make_iter = make_iter
        self._it: Iterator[str] | None = None
        self._kept: list[str] = []
        self._consumed = False  # past the kept part: a restart would lose documents

    def _stream(self) -> Iterator[str]:
        if self._it is None:
            self._it = self.make_iter()
        return self._it

    def head(self, max_bytes: int) -> Iterator[list[str]]:
        kept_bytes = sum(len(t.encode("utf-8")) for t in self._kept)
        yield from _chunks(self._kept)
        for text in self._stream():
            self._kept.append(text)
            yield [text]
            kept_bytes += len(text.encode("utf-8"))
            if kept_bytes >= max_bytes:
                return

    def batches(self) -> Iterator[list[str]]:
        if self._consumed:
            raise RuntimeError("a stream of documents can be read only once")
        self._consumed = True
        yield from _chunks(self._kept)
        self._kept = []
        yield from _chunks(self._stream())


def _chunks(items: Iterator[str] | list[str]) -> Iterator[list[str]]:
    """Batches of BATCH_DOCS documents (the last one shorter)."""
    batch: list[str] = []
    for text in items:
        batch.append(text)
        if len(batch) == BATCH_DOCS:
            yield batch
            batch = []
    if batch:
        yield batch


# --------------------------------------------------------------------------------------------
# The text column


def _pa_strings(texts: list[str]) -> pa.Array:
    import pyarrow as pa

    return pa.array(texts, type=pa.large_string())


def _text_column(ds: datasets.Dataset, column: str, role: str, what: str) -> pa.Array | pa.ChunkedArray:
    import pyarrow as pa

    if column not in ds.column_names:
        raise ConfigError(f"{what} has no column {column!r} in its {role} split; its columns are: "
                          f"{', '.join(ds.column_names)} — set data.text_column")
    col = ds.with_format("arrow")[column]
    t = col.type
    is_view = getattr(pa.types, "is_string_view", lambda _: False)  # pyarrow >= 16
    if not (pa.types.is_string(t) or pa.types.is_large_string(t) or is_view(t)):
        raise ConfigError(f"column {column!r} of {what} holds {t} values, not text — set data.text_column to a "
                          f"text column (columns: {', '.join(ds.column_names)})")
    return col


def _stream_texts(ds: datasets.IterableDataset, role: str, source: Source,
                  d: DataConfig) -> Callable[[], Iterator[str]]:
    column, what = d.text_column, source.description

    def examples() -> Iterator[dict]:
        # a stream fails while it is read (a file that is not UTF-8, the network gone): one line too
        it = iter(ds)
        while True:
            try:
                example = next(it)
            except StopIteration:
                return
            except TiedlmError:
                raise
            except Exception as exc:
                raise translate(exc, source, d) from exc
            yield example

    def texts() -> Iterator[str]:
        for example in examples():
            if column not in example:
                raise ConfigError(f"{what} has no column {column!r} in its {role} split; its columns are: "
                                  f"{', '.join(example)} — set data.text_column")
            text = example[column]
            if text is not None and not isinstance(text, str):
                raise ConfigError(f"column {column!r} of {what} holds {type(text).__name__} values, not text — "
                                  "set data.text_column to a text column")
            if text and not text.isspace():
                yield text

    return texts


# --------------------------------------------------------------------------------------------
# Carving validation and test from train (or test from validation)


def _fractions(d: DataConfig) -> dict[str, float]:
    return {"validation": d.validation_fraction, "test": d.test_fraction}


def _carve(n: int, source: str, roles: list[str], d: DataConfig, what: str) -> dict[str, np.ndarray]:
    """Deterministic, disjoint positions among the n documents of the `source` split for what it
    keeps (under its own role) and for each carved split, which gets round(fraction * n) documents
    (at least one). data.carve: random draws them by a permutation seeded by data.split_seed;
    contiguous takes consecutive blocks in source order: the source's part first, then the carved
    splits in `roles` order, at the end."""
    sizes = {r: max(1, round(_fractions(d)[r] * n)) for r in roles}
    if n - sum(sizes.values()) < 1:
        hint = "data.validation_split" if source == "train" else "data.test_split"
        raise DataError(f"the {source} split of {what} has {n} non-empty documents, too few to carve "
                        f"{' and '.join(roles)} from — add data or name existing splits ({hint})")
    if d.carve == "contiguous":  # [source's part | roles[0] | roles[1]]
        kept = n - sum(sizes.values())
        out, start = {source: np.arange(kept)}, kept
        for r in roles:
            out[r] = np.arange(start, start + sizes[r])
            start += sizes[r]
        return out
    perm = np.random.default_rng(d.split_seed).permutation(n)  # [roles[0] | roles[1] | source's part]
    out, start = {}, 0
    for r in roles:
        out[r] = np.sort(perm[start:start + sizes[r]])
        start += sizes[r]
    out[source] = np.sort(perm[start:])
    return out


def _carve_stream(docs: Iterator[str], roles: list[str], d: DataConfig) -> tuple[Iterator[str], dict[str, list[str]]]:
    """Streams have no length: each document goes to a carved split with probability equal to its
    fraction (uniforms from a generator seeded by data.split_seed), else to the split it is carved
    from (train, or validation). The carved lists fill while that split is read, which the encoder
    does before it reads them (splits are encoded in the order train, validation, test)."""
    carved: dict[str, list[str]] = {r: [] for r in roles}
    bounds = np.cumsum([_fractions(d)[r] for r in roles])

    def kept() -> Iterator[str]:
        rng = np.random.default_rng(d.split_seed)
        u = rng.random(4096)
        for i, text in enumerate(docs):
            if i % 4096 == 0 and i:
                u = rng.random(4096)
            k = int(np.searchsorted(bounds, u[i % 4096], side="right"))
            if k < len(roles):
                carved[roles[k]].append(text)
            else:
                yield text

    return kept(), carved


def _carve_docs(docs: dict[str, Docs], source: str, roles: list[str], d: DataConfig, what: str) -> str:
    """Add the carved splits to docs, taking their documents out of the `source` split (train or
    validation); how it was done."""
    if isinstance(docs[source], StreamDocs):
        if d.carve == "contiguous":
            raise ConfigError(f"data.carve: contiguous puts {' and '.join(roles)} at the end of the {source} split, "
                              f"and a stream (data.streaming: true) has no end to find — use data.carve: random, or "
                              "data.streaming: false")
        kept_iter, carved = _carve_stream(docs[source].make_iter(), roles, d)
        docs[source] = StreamDocs(lambda: kept_iter)
        for role in roles:
            docs[role] = StreamDocs(lambda role=role: iter(carved[role]))
        return "each streamed document drawn with its fraction's probability"
    kept = docs[source]
    for role, pos in _carve(kept.n, source, roles, d, what).items():
        docs[role] = ArrowDocs(kept.column, kept.indices[pos])
    if d.carve == "contiguous":
        return f"consecutive blocks at the end of the {source} split's documents, in source order"
    return f"a random permutation of the {source} split's documents"


# --------------------------------------------------------------------------------------------
# The splits of a source


def _choose_splits(raw: dict[str, Any], d: DataConfig, what: str) -> tuple[dict[str, Any], dict[str, str], list[str]]:
    """The datasets of train, validation and test mapped by name, their origins, and the roles to
    carve (from train, or test from validation with data.test_from: validation)."""
    available = ", ".join(raw) or "none"
    if d.train_split not in raw:
        raise ConfigError(f"{what} has no split {d.train_split!r}; it has: {available} — set data.train_split")
    chosen, origins, carve = {"train": raw[d.train_split]}, {"train": d.train_split}, []
    for role, name in (("validation", d.validation_split), ("test", d.test_split)):
        # the default name also finds the usual variants (WikiText's "valid", GLUE's "dev")
        names = [name] + (list(_ALIASES[role]) if name == role else []) if name else []
        found = next((n for n in names if n in raw and n != d.train_split), None)
        if found:
            chosen[role], origins[role] = raw[found], found
        elif name and name != role:
            source = d.test_from if role == "test" else "train"
            raise ConfigError(f"{what} has no split {name!r} (data.{role}_split); it has: {available} — "
                              f"name one of them, or set data.{role}_split: null to carve it from {source}")
        elif _fractions(d)[role] > 0:
            carve.append(role)
        elif role == "validation":
            raise ConfigError(f"{what} has no validation split and data.validation_fraction is 0 — set "
                              f"data.validation_split to one of: {available}, or data.validation_fraction > 0")
    if d.test_from == "validation":
        if "validation" in carve:
            raise ConfigError(f"data.test_from: validation carves test from the validation split, and {what} has none "
                              f"(it has: {available}) — name it with data.validation_split, or carve test from train "
                              f"({_from_train(d)})")
        if "test" in chosen:
            raise ConfigError(f"data.test_from: validation would carve test from validation, and {what} has a test "
                              f"split of its own ({origins['test']!r}) — use it ({_from_train(d)}), or set "
                              "data.test_split: null to carve test from validation anyway")
    return chosen, origins, carve


def _from_train(d: DataConfig) -> str:
    """The options that carve test from train instead: test_from, and a test_fraction that fits
    train (one meant for half of the validation documents would take half the training text)."""
    return "--set data.test_from=train" + ("" if carved_test_fits(d) else " --set data.test_fraction=0.05")


def _origin(d: DataConfig, source: str, role: str) -> str:
    """How a carved split is shown (`tiedlm data`'s "from" column): "carved from train (5%, split_seed 0)"."""
    how = "contiguous" if d.carve == "contiguous" else f"split_seed {d.split_seed}"
    return f"carved from {source} ({100 * _fractions(d)[role]:g}%, {how})"


def split_documents(source: Source, d: DataConfig, progress: bool) -> tuple[dict[str, Docs], dict]:
    """The documents of train, validation and (when there is one) test, and how they were chosen:
    {"splits": names in order, "origins": {split: where it came from}, "carving": how, or None}."""
    raw = load_raw(source, d, progress)
    what = source.description
    if source.kind == "builtin":  # built-in corpora bring their own three splits
        docs = {name: ArrowDocs.of(_pa_strings(texts)) for name, texts in raw.items()}
        return docs, {"splits": list(docs), "origins": builtin.builtin_origins(d.path.strip()), "carving": None}

    chosen, origins, carve = _choose_splits(raw, d, what)
    import datasets

    docs: dict[str, Docs] = {}
    for role, ds in chosen.items():
        if isinstance(ds, datasets.IterableDataset):
            docs[role] = StreamDocs(_stream_texts(ds, role, source, d))
        else:
            docs[role] = ArrowDocs.of(_text_column(ds, d.text_column, role, what))
    carving = None
    if carve:
        parent = "validation" if d.test_from == "validation" else "train"  # _choose_splits: then carve == [test]
        method = _carve_docs(docs, parent, carve, d, what)
        carving = {"from": origins[parent], "split_seed": d.split_seed if d.carve == "random" else None,
                   "method": method, **{f"{r}_fraction": _fractions(d)[r] for r in carve}}
        if d.carve != "random":
            carving["carve"] = d.carve
        for role in carve:
            origins[role] = _origin(d, origins[parent], role)
    order = [s for s in SPLITS if s in docs]
    return {s: docs[s] for s in order}, {"splits": order, "origins": origins, "carving": carving}
