"""datasets → text → tokenizer → cached token arrays.

`prepare_data(cfg)` turns `cfg.data` + `cfg.tokenizer` into a `PreparedData`: a tokenizer and, per
split, one 1-D array of token ids in which every document is followed by the end-of-text id.

The pipeline, the module that does each step, and where its result is cached (under `cache_root()`):

    source (hub / files / folder / save_to_disk / builtin)   sources     fingerprint: revision, sizes+digests, params
      → splits (mapped by name, or carved from train)         documents   recorded with the tokenizer entry
      → eval documents also in train (the leak measure)       overlap     tokenizers/<key>/overlap.json
      → tokenizer (trained on train only)                     tokenizers  tokenizers/<key>/
      → token arrays, one per split (.npy, memory-mapped)     tokenizers  tokens/<key>/
                                                              cache       entries, list, clear

Imports point down: this package's __init__ → overlap → documents → sources → cache → tokenizers. A
second prepare of the same data reads the entries' JSON manifests and memory-maps the arrays: it
imports neither `datasets` nor trains nor encodes anything.

Errors: what the config names and is not there, empty or unusable as named (a path, a file, a
split, a column, a dataset config, a tokenizer file) is a ConfigError, exit 2; what the world does
(an unreachable hub, a full disk, a broken cache entry) and what the data turns out to hold (text
that is not UTF-8, splits too small for the config) is a DataError, exit 1.
"""

from __future__ import annotations

import dataclasses

import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from . import builtin
from ..config import Config, DataConfig, TokenizerConfig
from ..config.identity import ADDED_KEYS
from ..errors import ConfigError, DataError
from . import overlap
from .cache import (
    CACHE_FORMAT,
    ClearedCache,
    cache_entries,
    cache_root,
    clear_cache,
    key_of,
    read_overlap,
    read_tokenizer,
    read_tokens,
    store_overlap,
    store_tokenizer,
    store_tokens,
)
from .documents import BATCH_DOCS, Docs, StreamDocs, split_documents
from .sources import Source, check_source, file_stamps, resolve_source
from .tokenizers import (
    ByteTokenizer,
    CharTokenizer,
    HFTokenizer,
    Tokenizer,
    encode_split,
    load_tokenizer,
    tokenizer_fingerprint,
    train_tokenizer,
)

__all__ = ["BATCH_DOCS", "CACHE_FORMAT", "ByteTokenizer", "CharTokenizer", "ClearedCache", "HFTokenizer",
           "PreparedData", "SplitData", "Tokenizer", "cache_entries", "cache_root", "check_source", "clear_cache",
           "core_identity", "data_identity", "encode_split", "identity_fits", "load_tokenizer", "prepare_data",
           "summarize", "train_tokenizer"]


@dataclass
class SplitData:
    name: str  # "train" | "validation" | "test"
    tokens: np.ndarray  # 1-D uint16 (vocab <= 65536) or uint32, usually an np.memmap
    n_docs: int
    n_chars: int
    n_bytes: int  # UTF-8 bytes of the split's text (documents plus one byte per separator)
    n_words: int  # whitespace-separated words + one per document separator (PTB-style <eos>)
    oov_rate: float | None  # word tokenizer: fraction of words mapped to <unk>; else None


@dataclass
class PreparedData:
    tokenizer: Tokenizer
    vocab_size: int  # the tokenizer's real size
    model_vocab_size: int  # padded up to tokenizer.pad_to_multiple (>= vocab_size)
    splits: dict[str, SplitData]  # "train" and "validation" always; "test" when there is one
    train_counts: np.ndarray  # int64 [model_vocab_size], count of each token id in the train split
    floor: dict | None  # builtin:synthetic only: expected rate and each split's own floor (builtin.synthetic_floor)
    info: dict  # JSON-serialisable: source, fingerprint, carving, overlap, cache folders, tokenizer, timings


def data_identity(data: PreparedData) -> dict:
    """What the tokens of a run depend on: the source's fingerprint and the tokenizer's key; for
    local files also `by_mtime`, the same two keys as tiedlm computed them before it hashed the
    files' content, which runs recorded then carry (see identity_fits)."""
    ident = {"fingerprint": data.info.get("fingerprint"), "tokenizer": data.info.get("tokenizer", {}).get("key")}
    by_mtime = data.info.get("by_mtime")
    return {**ident, "by_mtime": by_mtime} if by_mtime else ident


def core_identity(ident: dict) -> dict:
    """The fingerprint and tokenizer key of a recorded data identity, without its by_mtime alias
    (compare.collect reads the same two keys of a report, below this layer's reach)."""
    return {"fingerprint": ident.get("fingerprint"), "tokenizer": ident.get("tokenizer")}


def identity_fits(recorded: dict | None, data: PreparedData) -> bool:
    """Whether a run's recorded data identity names these tokens: none recorded, the same keys, or
    (a run recorded before local files were known by their content) the keys by modification
    time, which still match while the files have not been touched since."""
    if recorded is None:
        return True
    if not isinstance(recorded, dict):  # damaged: it cannot show that these are its tokens
        return False
    now = data_identity(data)
    return core_identity(recorded) in (core_identity(now), now.get("by_mtime"))


# --------------------------------------------------------------------------------------------
# prepare_data, in stages: plan the keys, read what is cached, build what is missing, check


@dataclass
class _Plan:
    """What prepare_data reads or builds: the source and the cache key of every entry."""

    source: Source
    data_key: str  # the source's fingerprint and the settings that choose the splits
    tok_key: str
    limits: dict[str, int | None]  # tokens per split
    by_mtime: dict | None = None  # local files: data_key and tok_key from Source.by_mtime (data_identity)
    tokenizer: TokenizerConfig | None = None  # what the tokenizer is read from, where not the config's (a copy)

    def split_key(self, name: str) -> str:
        return key_of({"tokenizer": self.tok_key, "split": name, "limit": self.limits[name]})


@dataclass
class _Entries:
    """The tokenizer entry and the split entries of one prepare, cached or built."""

    tokenizer: Tokenizer | None = None
    tok_folder: Path | None = None
    layout: dict | None = None  # splits, origins, carving: recorded with the tokenizer
    found: dict[str, tuple[SplitData, np.ndarray | None, Path]] = field(default_factory=dict)
    tokenizer_hit: bool = False
    timings: dict[str, float] = field(default_factory=dict)
    overlap: dict | None = None  # the leak measure (data.overlap), stored with the tokenizer

    @property
    def complete(self) -> bool:
        return self.layout is not None and all(name in self.found for name in self.layout["splits"])


def _split_settings(d: DataConfig, source: Source) -> dict:
    """The DataConfig fields that decide which documents land in which split."""
    if source.kind == "builtin":
        return {}
    settings = {"text_column": d.text_column, "train_split": d.train_split, "validation_split": d.validation_split,
                "test_split": d.test_split, "validation_fraction": d.validation_fraction,
                "test_fraction": d.test_fraction, "split_seed": d.split_seed, "streaming": d.streaming,
                # a stream is read until the train limit is reached, so carved splits depend on it
                "stream_limit": d.max_train_tokens if d.streaming else None}
    # Keys added later join the key only away from their "as before" value, so that the entries
    # (and the data identity runs record) of configs written before them stay the same.
    for key in ("data.carve", "data.test_from"):
        leaf = key.split(".")[1]
        if getattr(d, leaf) != ADDED_KEYS[key]:
            settings[leaf] = getattr(d, leaf)
    if d.carve == "contiguous":
        settings["split_seed"] = None  # a contiguous carving draws nothing
    return settings


def _plan(d: DataConfig, tcfg: TokenizerConfig, tokenizer_copy: Path | None = None) -> _Plan:
    source = resolve_source(d)
    read = tcfg if tokenizer_copy is None else dataclasses.replace(tcfg, path=str(tokenizer_copy))
    splits, tok_by_mtime = _split_settings(d, source), tokenizer_fingerprint(read)
    tok = tok_by_mtime
    if "file" in tok_by_mtime:  # a pretrained tokenizer file: known by its content too, as data files are
        real = Path(tok_by_mtime["file"][0])
        if read is not tcfg:  # a copy: its size and content, under the path of the file it stands for
            tok_by_mtime = {**tok_by_mtime, "file": [str(Path(tcfg.path or "").expanduser().resolve()),
                                                     *tok_by_mtime["file"][1:]]}
        [[_, _, digest]], _ = file_stamps([real])
        tok = {**tok_by_mtime, "file": [*tok_by_mtime["file"][:2], digest]}

    def keys(fingerprint: dict, tokenizer: dict) -> tuple[str, str]:
        data_key = key_of({"source": fingerprint, "splits": splits})
        return data_key, key_of({"format": CACHE_FORMAT, "data": data_key, "tokenizer": tokenizer})

    data_key, tok_key = keys(source.fingerprint, tok)
    limits = {"train": d.max_train_tokens, "validation": d.max_eval_tokens, "test": d.max_eval_tokens}
    by_mtime = None
    if source.by_mtime or tok is not tok_by_mtime:
        old = keys(source.by_mtime or source.fingerprint, tok_by_mtime)
        by_mtime = dict(zip(("fingerprint", "tokenizer"), old))
    return _Plan(source, data_key, tok_key, limits, by_mtime, None if read is tcfg else read)


def _read_split(key: str) -> tuple[SplitData, np.ndarray | None, Path] | None:
    """A cached split, memory-mapped, with its train counts and folder; None if there is none."""
    hit = read_tokens(key)
    if hit is None:
        return None
    tokens, counts, m, folder = hit
    return SplitData(m["split"], tokens, m["n_docs"], m["n_chars"], m["n_bytes"], m["n_words"], m["oov_rate"]), \
        counts, folder


def _read_cached(plan: _Plan) -> _Entries:
    """What the cache holds already: the tokenizer and, where they are there, its splits."""
    entry = read_tokenizer(plan.tok_key)
    if entry is None:
        return _Entries()
    tokenizer, manifest, folder = entry
    found = {}
    for name in manifest["layout"]["splits"]:
        hit = _read_split(plan.split_key(name))
        if hit is not None:
            found[name] = hit
    stored = read_overlap(folder)
    measured = stored["splits"] if overlap.is_current(stored) else None
    return _Entries(tokenizer, folder, manifest["layout"], found, tokenizer_hit=True, overlap=measured)


def _load_documents(plan: _Plan, d: DataConfig, progress: bool) -> tuple[dict[str, Docs], dict]:
    docs, layout = split_documents(plan.source, d, progress)
    for name, dd in docs.items():
        if dd.n == 0:
            raise DataError(f"the {name} split of {plan.source.description} has no non-empty documents in column "
                            f"{d.text_column!r} — check the data, data.text_column and the split names")
    return docs, layout


def _train_tokenizer(plan: _Plan, tcfg: TokenizerConfig, train: Docs, layout: dict, entries: _Entries,
                     progress: bool) -> None:
    tokenizer = train_tokenizer(tcfg, train, progress)
    trained_on = f"train split, first {tcfg.max_train_bytes:,} bytes" if tcfg.kind in ("bpe", "word", "char") \
        else "nothing (no training)"
    entries.tokenizer, entries.tok_folder = store_tokenizer(plan.tok_key, tokenizer, {
        "source": plan.source.description, "data_key": plan.data_key, "layout": layout, "trained_on": trained_on})
    entries.layout = layout


def _encode(plan: _Plan, name: str, docs: Docs, tokenizer: Tokenizer, origin: str,
            progress: bool) -> tuple[SplitData, np.ndarray | None, Path]:
    """Encode one split, store it in the cache and read it back memory-mapped."""
    tokens, stats = encode_split(name, docs, tokenizer, plan.limits[name], progress)
    if stats["n_docs"] == 0:  # a stream's documents are counted only as they are read
        raise DataError(f"the {name} split of {plan.source.description} has no non-empty documents — "
                        "check the data and data.text_column")
    counts = np.bincount(tokens, minlength=tokenizer.vocab_size).astype(np.int64) if name == "train" else None
    key = plan.split_key(name)
    store_tokens(key, name, tokens, stats, counts, {
        "source": plan.source.description, "tokenizer": f"{tokenizer.kind} {tokenizer.vocab_size}",
        "tokenizer_key": plan.tok_key, "limit": plan.limits[name], "origin": origin})
    return _read_split(key)


def _build_missing(plan: _Plan, cfg: Config, entries: _Entries, progress: bool) -> None:
    """Load the documents, then train the tokenizer and encode the splits the cache lacks; measure
    the overlap of the splits (overlap.py) where the cache lacks it too."""
    t = time.perf_counter()
    docs, layout = _load_documents(plan, cfg.data, progress)
    entries.timings["load_s"] = time.perf_counter() - t
    streamed = any(isinstance(dd, StreamDocs) for dd in docs.values())
    sinks, measuring = None, entries.overlap is None
    if measuring:
        if streamed:  # read once: the encoder's reading is hashed as it goes
            sinks = overlap.hash_while_encoding(docs)
        else:
            t = time.perf_counter()
            entries.overlap = overlap.measure(docs, overlap.unit_of(plan.source))
            entries.timings["overlap_s"] = time.perf_counter() - t
    if entries.tokenizer is None:
        t = time.perf_counter()
        _train_tokenizer(plan, plan.tokenizer or cfg.tokenizer, docs["train"], layout, entries, progress)
        entries.timings["tokenizer_s"] = time.perf_counter() - t
    if streamed:
        entries.found = {}  # a stream is read once, in order: encode every split again
    t = time.perf_counter()
    for name in entries.layout["splits"]:
        if name not in entries.found:
            entries.found[name] = _encode(plan, name, docs[name], entries.tokenizer,
                                          entries.layout["origins"][name], progress)
    entries.timings["encode_s"] = time.perf_counter() - t
    if sinks is not None:
        entries.overlap = overlap.result(sinks["train"], {n: d for n, d in sinks.items() if n != "train"},
                                         overlap.unit_of(plan.source), None)
    if measuring:
        store_overlap(entries.tok_folder, {"version": overlap.VERSION, "min_chars": overlap.MIN_CHARS,
                                           "splits": entries.overlap})


def _check_lengths(splits: dict[str, SplitData], block_size: int, limits: dict[str, int | None]) -> None:
    need = block_size + 1
    for name, s in splits.items():
        if len(s.tokens) < need:
            limit_key = "data.max_train_tokens" if name == "train" else "data.max_eval_tokens"
            hint = f"raise {limit_key}, " if limits[name] is not None else ""
            raise DataError(f"the {name} split has {len(s.tokens)} tokens, fewer than model.block_size + 1 = {need} "
                            f"— {hint}use more data or a smaller model.block_size")


def _first_fraction(split: SplitData, fraction: float) -> SplitData:
    """data.train_fraction: the first `fraction` of a split's tokens (a prefix, so that a smaller
    fraction is a subset of a larger one, and the tokenizer, trained on the whole split, is shared).
    Its document, character, byte and word counts are pro-rated by the tokens kept."""
    n = max(1, round(len(split.tokens) * fraction))
    share = n / len(split.tokens) if len(split.tokens) else 1.0
    return dataclasses.replace(split, tokens=split.tokens[:n], n_docs=max(1, round(split.n_docs * share)),
                               n_chars=round(split.n_chars * share), n_bytes=round(split.n_bytes * share),
                               n_words=round(split.n_words * share))


def _train_counts(splits: dict[str, SplitData], counts: np.ndarray | None, vocab: int, model_vocab: int) -> np.ndarray:
    """The count of each id in train, padded to the model's vocabulary."""
    if counts is None:  # an entry written without counts.npy
        counts = np.bincount(splits["train"].tokens, minlength=vocab)
    train_counts = np.zeros(model_vocab, dtype=np.int64)
    train_counts[: len(counts)] = counts
    return train_counts


def _info(plan: _Plan, cfg: Config, entries: _Entries, model_vocab: int) -> dict:
    d, tcfg, tok = cfg.data, cfg.tokenizer, entries.tokenizer
    return {
        "source": plan.source.description,
        "source_kind": plan.source.kind,
        "path": d.path,
        "fingerprint": plan.data_key,
        "by_mtime": plan.by_mtime,
        "splits": entries.layout["origins"],
        "carving": entries.layout["carving"],
        # validation and test documents found verbatim in train (overlap.py); None for a cache
        # entry made before the measure existed
        "overlap": entries.overlap,
        "streaming": d.streaming,
        "limits": {"max_train_tokens": d.max_train_tokens, "max_eval_tokens": d.max_eval_tokens,
                   **({"train_fraction": d.train_fraction} if d.train_fraction < 1.0 else {})},
        "tokenizer": {"kind": tok.kind, "vocab_size": tok.vocab_size, "model_vocab_size": model_vocab,
                      "padding": model_vocab - tok.vocab_size, "eot_id": tok.eot_id, "unk_id": tok.unk_id,
                      "requested_vocab_size": tcfg.vocab_size, "key": plan.tok_key},
        "cache": {"root": str(cache_root()), "hit": entries.tokenizer_hit and "load_s" not in entries.timings,
                  "tokenizer_hit": entries.tokenizer_hit, "tokenizer_folder": str(entries.tok_folder),
                  "split_folders": {n: str(entries.found[n][2]) for n in entries.layout["splits"]}},
        "timings": {k: round(v, 4) for k, v in entries.timings.items()},
    }


def prepare_data(cfg: Config, progress: bool = True, tokenizer_copy: Path | None = None) -> PreparedData:
    """Load, split, tokenize and cache the data that cfg.data and cfg.tokenizer describe.
    `tokenizer_copy`: a copy of tokenizer.path's file, read in its place and keyed as that file, so
    that the same bytes give the same tokens and identity wherever the file went (the copy a run
    keeps of its pretrained start's tokenizer.json: runs/layout.py START)."""
    t_start = time.perf_counter()
    plan = _plan(cfg.data, cfg.tokenizer, tokenizer_copy)
    entries = _read_cached(plan)
    if not entries.complete:
        _build_missing(plan, cfg, entries, progress)
    splits = {name: entries.found[name][0] for name in entries.layout["splits"]}
    counts = entries.found["train"][1]
    if cfg.data.train_fraction < 1.0:
        splits["train"], counts = _first_fraction(splits["train"], cfg.data.train_fraction), None
    _check_lengths(splits, cfg.model.block_size, plan.limits)
    vocab = entries.tokenizer.vocab_size
    model_vocab = model_vocab_size(cfg, vocab)
    train_counts = _train_counts(splits, counts, vocab, model_vocab)
    floor = builtin.prepared_floor(cfg.data, splits, entries.tokenizer)
    entries.timings["total_s"] = time.perf_counter() - t_start
    info = _info(plan, cfg, entries, model_vocab)
    return PreparedData(entries.tokenizer, vocab, model_vocab, splits, train_counts, floor, info)


# --------------------------------------------------------------------------------------------
# What `tiedlm data` prints


def summarize(prepared: PreparedData) -> str:
    """A table per split: documents, characters, tokens, bytes per token, OOV rate; and the cache."""
    info = prepared.info
    tok = info["tokenizer"]
    pad = f", padded to {tok['model_vocab_size']:,} for the model" if tok["padding"] else ""
    lines = [f"data       {info['source']}",
             f"tokenizer  {tok['kind']}, {tok['vocab_size']:,} tokens{pad}", ""]
    header = f"{'split':<12}{'documents':>11}{'characters':>14}{'tokens':>13}{'bytes/token':>13}{'OOV':>8}  from"
    lines.append(header)
    for name, s in prepared.splits.items():
        oov = f"{100 * s.oov_rate:.2f}%" if s.oov_rate is not None else "-"
        bpt = s.n_bytes / len(s.tokens) if len(s.tokens) else float("nan")
        lines.append(f"{name:<12}{s.n_docs:>11,}{s.n_chars:>14,}{len(s.tokens):>13,}{bpt:>13.2f}{oov:>8}  "
                     f"{info['splits'].get(name, '')}")
    if prepared.floor:
        f = prepared.floor
        lines += ["", f"rate       {f['nats_per_word']:.4f} nats/word (perplexity {f['perplexity_per_word']:.2f}): "
                      "the language's expected entropy rate, an average over endless text"]
        for name, sf in (f.get("splits") or {}).items():
            lines.append(f"{name:<11}{sf['label']} {sf['nats_per_token']:.4f} nats/token (perplexity "
                         f"{sf['perplexity']:.2f}, {sf['bits_per_byte']:.4f} bits/byte): the true model on its tokens")
    shown = _overlap_line(info.get("overlap"))
    if shown:
        lines += ["", shown]
    c, t = info["cache"], info["timings"]
    how = f"hit, {t['total_s']:.2f} s" if c["hit"] else \
        "built in " + ", ".join(f"{k[:-2]} {v:.2f} s" for k, v in t.items())
    lines += ["", f"cache      {c['root']} ({how})"]
    return "\n".join(lines)


def _overlap_line(measured: dict | None) -> str | None:
    """'overlap    validation: 2 of 1,085 lines of 32+ characters are also in train (0.18%); test: ...'."""
    if not measured:
        return None
    parts = []
    for name, o in measured.items():
        share = f" ({100 * o['share']:.2f}%)" if o["share"] is not None else ""
        parts.append(f"{name}: {o['in_train']:,} of {o['checked']:,}{share}")
    o = next(iter(measured.values()))
    part = "" if o["train_checked"] >= o["train_documents"] else \
        f" (the first {o['train_checked']:,} of {o['train_documents']:,} training {o['unit']})"
    return (f"overlap    {o['unit']} of {o['min_chars']}+ characters also in train{part} — " + "; ".join(parts))


def model_vocab_size(cfg: Config, vocab: int) -> int:
    """The model's vocabulary for a tokenizer of `vocab` ids: model.vocab_size where set (a
    pretrained start's, init_from), which must hold every id, else `vocab` padded up to
    tokenizer.pad_to_multiple."""
    if cfg.model.vocab_size is not None:
        if cfg.tokenizer.add_tokens is not None:  # new tokens: the model's vocabulary grows to hold them
            return max(cfg.model.vocab_size, vocab)
        if cfg.model.vocab_size < vocab:
            raise ConfigError(f"the tokenizer has {vocab:,} ids but the model's vocabulary is {cfg.model.vocab_size:,} "
                              "— use the checkpoint's own tokenizer (leave the tokenizer keys unset) or a smaller one")
        return cfg.model.vocab_size
    pad = cfg.tokenizer.pad_to_multiple
    return -(-vocab // pad) * pad
