"""datasets → text → tokenizer → cached token arrays.

`prepare_data(cfg)` turns `cfg.data` + `cfg.tokenizer` into a `PreparedData`: a tokenizer and, per
split, one 1-D array of token ids in which every document is followed by the end-of-text id.

The pipeline, and where each step's result is cached (under `cache_root()`):

    source (hub / files / folder / save_to_disk / builtin)   fingerprint: revision, sizes+mtimes, params
      → splits (mapped by name, or carved from train)         recorded with the tokenizer entry
      → tokenizer (trained on train only)                     tokenizers/<key>/
      → token arrays, one per split (.npy, memory-mapped)     tokens/<key>/

Every cache entry is a folder written under a temporary name and renamed into place, so two
processes preparing the same data at once never see a half-written entry; a write that fails (a
full disk) removes the temporary folder and says so in one line. A second prepare of the
same data reads two JSON manifests and memory-maps the arrays: it imports neither `datasets` nor
trains nor encodes anything.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import glob as globlib
import hashlib
import json
import os
import re
import shutil
import socket
import sys
import time
import uuid
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

import numpy as np

from . import corpora
from .config import Config, DataConfig, TokenizerConfig
from .errors import ConfigError, DataError, TiedlmError

CACHE_FORMAT = 1  # bump when the layout of cache entries changes; old entries are then ignored
SPLITS = ("train", "validation", "test")
BATCH_DOCS = 4096  # documents per encode_batch call (the Rust encoder spreads a batch over threads)
_BUILDERS = {"text": "text", "json": "json", "jsonl": "json", "csv": "csv", "parquet": "parquet"}
_EXTENSIONS = {".txt": "text", ".text": "text", ".md": "text", ".json": "json", ".jsonl": "json",
               ".csv": "csv", ".parquet": "parquet"}
_TEXT_FREE = "local files (data.path: text, data.data_files: FILE) or a built-in corpus " \
             "(data.path: builtin:synthetic or builtin:pydoc)"


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
    tokenizer: "Tokenizer"
    vocab_size: int  # the tokenizer's real size
    model_vocab_size: int  # padded up to tokenizer.pad_to_multiple (>= vocab_size)
    splits: dict[str, SplitData]  # "train" and "validation" always; "test" when there is one
    train_counts: np.ndarray  # int64 [model_vocab_size], count of each token id in the train split
    floor: dict | None  # builtin:synthetic only: the entropy-rate floor (see corpora.synthetic_floor)
    info: dict  # JSON-serialisable: source, fingerprint, carving, cache folders, tokenizer, timings


# --------------------------------------------------------------------------------------------
# The cache folder


def cache_root() -> Path:
    """$TIEDLM_CACHE, or ~/.cache/tiedlm."""
    return Path(os.environ.get("TIEDLM_CACHE") or "~/.cache/tiedlm").expanduser()


def _key(obj: Any) -> str:
    blob = json.dumps(obj, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:20]


def _replace_atomically(path: Path, write: Callable[[Path], Any]) -> None:
    """write(tmp), then rename tmp onto path: a reader sees the old file or the new one, never half
    of one. A failed write removes tmp, so a full disk does not keep holding its space."""
    tmp = path.with_name(f".{path.name}.{_tmp_tag()}.tmp")  # the .tmp suffix, as runs.py names them
    try:
        write(tmp)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise


def _write_json(path: Path, data: Any) -> None:
    text = json.dumps(data, indent=1, default=str)
    _replace_atomically(path, lambda tmp: tmp.write_text(text, encoding="utf-8"))


def _save_npy(path: Path, array: np.ndarray) -> None:
    """np.save, except that a failed write keeps its errno: np.save writes through C stdio and
    reports a full disk as "N requested and M written", which says neither why nor what to do."""
    array = np.ascontiguousarray(array)
    with open(path, "wb") as fh:
        np.lib.format.write_array_header_1_0(fh, np.lib.format.header_data_from_array_1_0(array))
        fh.write(array.data)


def _read_json(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def _size(path: Path) -> int:
    """Bytes of a file, or of every file in a folder (one removed meanwhile counts 0)."""
    files = [path] if not path.is_dir() or path.is_symlink() else [p for p in path.rglob("*") if p.is_file()]
    total = 0
    for f in files:
        with contextlib.suppress(OSError):
            total += f.lstat().st_size
    return total


_NO_ROOM = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)


def _chain(exc: BaseException) -> list[BaseException]:
    """exc and the exceptions it was raised from or while handling, outermost first."""
    chain: list[BaseException] = []
    e: BaseException | None = exc
    while e is not None and e not in chain:
        chain.append(e)
        e = e.__cause__ or e.__context__
    return chain


def _errno_of(exc: BaseException) -> int | None:
    """The errno behind a failed write, wherever it hides: an OSError in the exception's chain, or
    the text of one that wraps it (the Rust tokenizer raises "File too large (os error 27)")."""
    chain = _chain(exc)
    for e in chain:
        if isinstance(e, OSError) and e.errno:
            return e.errno
    for e in chain:
        text = str(e)
        if m := re.search(r"os error (\d+)", text):
            return int(m.group(1))
        for code in _NO_ROOM:
            if os.strerror(code) in text:
                return code
    return None


def _write_failure(exc: BaseException, where: Path | str, what: str = "the token cache",
                   elsewhere: str = "TIEDLM_CACHE") -> DataError:
    """Any failed write into a cache as one line: what is wrong and what to do. `elsewhere` is the
    variable that moves the cache to another disk."""
    code = _errno_of(exc)
    if code in _NO_ROOM:
        limit = ", or raise the file-size limit: ulimit -f" if code == errno.EFBIG else ""
        return DataError(f"{os.strerror(code)} while writing {what} ({where}) — free some disk space "
                         f"(or set {elsewhere} to a disk with room{limit}), then run the same command again")
    why = os.strerror(code) if code else _first_line(exc)
    space = "" if code else ", and the free disk space"
    return DataError(f"cannot write {what} ({where}): {why} — check the path and its permissions{space} "
                     f"(or set {elsewhere} to a folder you can write), then run the same command again")


@contextlib.contextmanager
def _writing(where: Path, cleanup: Path | None = None) -> Iterator[None]:
    """Writes into the cache: on any failure (an interrupt too) remove `cleanup`, the half-written
    temporary folder, and turn the error into _write_failure's one line."""
    try:
        yield
    except BaseException as exc:
        if cleanup is not None:
            _drop(cleanup)
        if isinstance(exc, Exception) and not isinstance(exc, TiedlmError):
            raise _write_failure(exc, where) from exc
        raise


# Temporary names carry host, pid and a random part, so that `cache clear` can tell a folder a
# live process is filling from one a killed process left: the pid means something only on the
# host that wrote it (a cache on a network disk is shared by several machines).
_HOST = re.sub(r"[^A-Za-z0-9.]", "_", socket.gethostname())[:64] or "host"
_TMP_TAG = r"(?:(?P<host>[A-Za-z0-9._]+)-)?(?P<pid>\d+)-[0-9a-f]{8}"  # host is absent in older names
_TMP_ENTRY = re.compile(rf"\.tmp-[0-9a-f]{{20}}-{_TMP_TAG}")
_STALE_S = 6 * 3600  # a writer touches its files all along: untouched this long, nobody is writing


def _tmp_tag() -> str:
    return f"{_HOST}-{os.getpid()}-{uuid.uuid4().hex[:8]}"


def _pid_alive(pid: int) -> bool:
    if os.name != "posix":  # os.kill(pid, 0) would end the process on Windows
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # EPERM: it exists, it is someone else's
        return True
    return True


def _being_written(path: Path, m: re.Match) -> str | None:
    """Why a temporary file or folder of tiedlm's may still be in use, or None if it is abandoned:
    its process (on this host) is gone, or nothing in it changed for _STALE_S."""
    pid = int(m.group("pid"))
    if m.group("host") == _HOST and not _pid_alive(pid):
        return None
    newest = 0.0
    for f in [path, *(path.rglob("*") if path.is_dir() else [])]:
        with contextlib.suppress(OSError):  # the writer may rename or remove it meanwhile
            newest = max(newest, f.lstat().st_mtime)
    if time.time() - newest > _STALE_S:
        return None
    where = "this machine" if m.group("host") == _HOST else (m.group("host") or "an unknown machine")
    return f"being written by process {pid} on {where}"


@contextlib.contextmanager
def _new_entry(kind: str, key: str) -> Iterator[Path]:
    """A fresh temporary folder to fill, renamed to <kind>/<key> when the block ends. Any failure
    removes it and becomes one line (see _write_failure): a full disk leaves nothing behind."""
    final = cache_root() / kind / key
    tmp = final.parent / f".tmp-{key}-{_tmp_tag()}"
    with _writing(final.parent, cleanup=tmp):
        tmp.mkdir(parents=True)
        yield tmp
        _publish(tmp, final)


def _publish(tmp: Path, final: Path) -> None:
    """Rename a complete entry into place. If another process got there first, keep theirs."""
    try:
        os.replace(tmp, final)
    except OSError:
        if not (final / "manifest.json").exists():
            raise
        shutil.rmtree(tmp, ignore_errors=True)


def _drop(folder: Path) -> None:
    """Remove a broken entry so it can be rebuilt (another process may be doing the same)."""
    shutil.rmtree(folder, ignore_errors=True)


# `datasets` keeps arrow copies of local files under cache_root()/"datasets", where tiedlm points
# it: <builder>/<config>/<version>/<hash>/ folders, with lock files beside them. Others may keep
# files in that folder too, so each load marks what it created there (one small file per created
# path, in _MARKS) and `cache clear` removes what is marked and nothing else.
_MARKS = ".tiedlm-made"
_MARK_DEPTH = 4  # builder/config/version/hash: the deepest level a load creates anew


def _listing(folder: Path) -> set[str]:
    """Relative POSIX paths of what is in folder, down to _MARK_DEPTH levels."""
    out: set[str] = set()
    level = [(folder, "")]
    for _ in range(_MARK_DEPTH):
        below = []
        for path, rel in level:
            with contextlib.suppress(OSError):
                for e in os.scandir(path):
                    if rel or e.name != _MARKS:
                        out.add(rel + e.name)
                        if e.is_dir(follow_symlinks=False):
                            below.append((Path(e.path), f"{rel}{e.name}/"))
        level = below
    return out


def _mark_name(rel: str) -> str:
    return hashlib.sha256(rel.encode()).hexdigest()[:20]


def _marked(folder: Path) -> set[str]:
    """The marked paths of folder ("." for the folder itself). A marker is named by the hash of the
    path it holds, so a torn one (a process killed while writing it) marks nothing."""
    out = set()
    for f in (folder / _MARKS).glob("*"):
        with contextlib.suppress(OSError, UnicodeDecodeError):
            rel = f.read_text(encoding="utf-8")
            if _mark_name(rel) == f.name:
                out.add(rel)
    return out


@contextlib.contextmanager
def _marking(folder: Path) -> Iterator[None]:
    """Mark what the block creates in folder: the top-most new paths, and "." if it made folder."""
    existed = folder.exists()
    before = _listing(folder)
    try:
        yield
    finally:  # a failed or interrupted load leaves lock files and folders: tiedlm's to clear too
        created = _listing(folder) - before
        top = {r for r in created if r.rpartition("/")[0] not in created}
        if not existed and folder.is_dir():
            top.add(".")
        with contextlib.suppress(OSError):  # unmarked is left alone by `cache clear`: the safe side
            (folder / _MARKS).mkdir(exist_ok=True)
            for rel in top:
                (folder / _MARKS / _mark_name(rel)).write_text(rel, encoding="utf-8")


# --------------------------------------------------------------------------------------------
# Tokenizers. Ids are 0..vocab_size-1; eot_id follows every document; unk_id, where there is one,
# stands for what the vocabulary lacks. encode_batch is the fast path the pipeline uses.

_META = "tiedlm_tokenizer.json"  # what kind of tokenizer a folder holds; load_tokenizer reads it
_HF_FILE = "tokenizer.json"


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
        _write_json(Path(folder) / _META, {"kind": "byte"})


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
        _write_json(Path(folder) / _META, {"kind": "char", "chars": self.chars})


class HFTokenizer(Tokenizer):
    """bpe, word and pretrained: a `tokenizers.Tokenizer`, whose encoder runs in Rust over threads."""

    def __init__(self, kind: str, tok: Any, eot_token: str):
        self.kind = kind
        self._tok = tok
        self.eot_token = eot_token
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
        _replace_atomically(Path(folder) / _HF_FILE, lambda tmp: self._tok.save(str(tmp)))
        _write_json(Path(folder) / _META, {"kind": self.kind, "eot_token": self.eot_token})


_PIECE = 1 << 16  # characters


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


def load_tokenizer(folder: Path) -> Tokenizer:
    """Read what Tokenizer.save wrote into `folder`."""
    folder = Path(folder)
    meta = _read_json(folder / _META)
    if meta is None:
        raise DataError(f"{folder} holds no tiedlm tokenizer ({_META} is missing or unreadable) — "
                        "prepare the data again (tiedlm data --config ...)")
    if meta["kind"] == "byte":
        return ByteTokenizer()
    if meta["kind"] == "char":
        return CharTokenizer(meta["chars"])
    from tokenizers import Tokenizer as RustTokenizer

    try:
        tok = RustTokenizer.from_file(str(folder / _HF_FILE))
    except Exception as exc:  # the Rust side raises plain Exceptions
        raise DataError(f"cannot read {folder / _HF_FILE}: {_first_line(exc)} — prepare the data again") from exc
    return HFTokenizer(meta["kind"], tok, meta["eot_token"])


def _train_word(batches: Iterator[list[str]], vocab_size: int) -> HFTokenizer:
    from tokenizers import Tokenizer as RustTokenizer, models, pre_tokenizers

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


def _train_bpe(batches: Iterator[list[str]], vocab_size: int, progress: bool) -> HFTokenizer:
    from tokenizers import Tokenizer as RustTokenizer, decoders, models, pre_tokenizers, trainers

    # Byte-level BPE as in GPT-2: every byte is in the alphabet, so there is no <unk> and decoding
    # reproduces the text exactly.
    tok = RustTokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=["<|endoftext|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(batches, trainer)
    return HFTokenizer("bpe", tok, "<|endoftext|>")


_EOT_CANDIDATES = ("<|endoftext|>", "<|end_of_text|>", "</s>", "<eos>", "<|eot_id|>", "<eot>", "<|im_end|>", "[SEP]")


def _pretrained_file(tcfg: TokenizerConfig) -> Path:
    path = Path(tcfg.path or "").expanduser()
    if path.is_dir() and (path / _HF_FILE).is_file():
        path = path / _HF_FILE
    if not path.is_file():
        raise DataError(f"tokenizer.path {tcfg.path} does not exist — point it at a tokenizer.json file "
                        "(as saved by the `tokenizers` library or found in a Hugging Face model repo)")
    return path


def _load_pretrained(tcfg: TokenizerConfig) -> HFTokenizer:
    from tokenizers import Tokenizer as RustTokenizer

    path = _pretrained_file(tcfg)
    try:
        tok = RustTokenizer.from_file(str(path))
    except Exception as exc:
        raise DataError(f"cannot read tokenizer.path {path} as a tokenizer.json ({_first_line(exc)}) — "
                        "use a file saved by the `tokenizers` library") from exc
    wanted = [tcfg.eot_token] if tcfg.eot_token else list(_EOT_CANDIDATES)
    found = [t for t in wanted if tok.token_to_id(t) is not None]
    if not found:
        raise DataError(f"tokenizer {path} has no end-of-text token ({', '.join(wanted)} not in its vocabulary) — "
                        "set tokenizer.eot_token to the token it uses between documents")
    return HFTokenizer("pretrained", tok, found[0])


def _training_batches(docs: "_Docs", max_bytes: int, progress: bool) -> Iterator[list[str]]:
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


def train_tokenizer(tcfg: TokenizerConfig, docs: "_Docs", progress: bool = False) -> Tokenizer:
    """A tokenizer of tcfg.kind, trained (where it needs training) on the given training documents."""
    if tcfg.kind == "byte":
        return ByteTokenizer()
    if tcfg.kind == "pretrained":
        return _load_pretrained(tcfg)
    batches = _training_batches(docs, tcfg.max_train_bytes, progress)
    if tcfg.kind == "char":
        return CharTokenizer.train(batches, tcfg.vocab_size)
    if tcfg.kind == "word":
        return _train_word(batches, tcfg.vocab_size)
    if tcfg.kind == "bpe":
        return _train_bpe(batches, tcfg.vocab_size, progress)
    raise DataError(f"unknown tokenizer.kind {tcfg.kind!r} — use bpe, word, char, byte or pretrained")


def _tokenizer_fingerprint(tcfg: TokenizerConfig) -> dict:
    """What the trained tokenizer depends on (besides the training split)."""
    if tcfg.kind == "byte":
        return {"kind": "byte"}
    if tcfg.kind == "pretrained":
        path = _pretrained_file(tcfg)
        st = path.stat()
        return {"kind": "pretrained", "file": [str(path.resolve()), st.st_size, st.st_mtime_ns],
                "eot_token": tcfg.eot_token}
    return {"kind": tcfg.kind, "vocab_size": tcfg.vocab_size, "max_train_bytes": tcfg.max_train_bytes}


# --------------------------------------------------------------------------------------------
# Documents: one split's non-empty texts, read in batches


class _Docs:
    n: int | None  # documents, when known before reading them

    def batches(self) -> Iterator[list[str]]:
        """All documents from the start, in batches."""
        raise NotImplementedError

    def head(self, max_bytes: int) -> Iterator[list[str]]:
        """Batches from the start, at least max_bytes of text where there is that much (the reader stops)."""
        return self.batches()


class _ArrowDocs(_Docs):
    """Documents at `indices` of an Arrow string column: nothing is read until it is needed."""

    def __init__(self, column: Any, indices: np.ndarray):
        self.column = column  # pyarrow (Chunked)Array of strings
        self.indices = indices
        self.n = len(indices)

    def batches(self) -> Iterator[list[str]]:
        import pyarrow as pa

        for i in range(0, self.n, BATCH_DOCS):
            yield self.column.take(pa.array(self.indices[i:i + BATCH_DOCS])).to_pylist()


class _StreamDocs(_Docs):
    """Documents from an iterator, read once. What the tokenizer trainer reads (head) is kept, so the
    encoder reads it again and then goes on with the stream."""

    n = None

    def __init__(self, make_iter: Callable[[], Iterator[str]]):
        self._make_iter = make_iter
        self._it: Iterator[str] | None = None
        self._kept: list[str] = []
        self._consumed = False  # past the kept part: a restart would lose documents

    def _stream(self) -> Iterator[str]:
        if self._it is None:
            self._it = self._make_iter()
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
        batch: list[str] = []
        for text in self._stream():
            batch.append(text)
            if len(batch) == BATCH_DOCS:
                yield batch
                batch = []
        if batch:
            yield batch


def _chunks(items: list[str]) -> Iterator[list[str]]:
    for i in range(0, len(items), BATCH_DOCS):
        yield items[i:i + BATCH_DOCS]


def _arrow_docs(column: Any) -> tuple[Any, np.ndarray]:
    """The column and the positions of its non-empty (not only whitespace) documents."""
    import pyarrow.compute as pc

    mask = pc.fill_null(pc.greater(pc.utf8_length(pc.utf8_trim_whitespace(column)), 0), False)
    return column, np.flatnonzero(np.asarray(mask.to_numpy(zero_copy_only=False), dtype=bool))


def _carve(n: int, roles: list[str], d: DataConfig, what: str) -> dict[str, np.ndarray]:
    """Deterministic, disjoint positions for train and the carved splits: a permutation seeded
    by data.split_seed, each carved split getting round(fraction * n) documents (at least one)."""
    fraction = {"validation": d.validation_fraction, "test": d.test_fraction}
    sizes = {r: max(1, round(fraction[r] * n)) for r in roles}
    if n - sum(sizes.values()) < 1:
        raise DataError(f"the train split of {what} has {n} non-empty documents, too few to carve "
                        f"{' and '.join(roles)} from — add data or name existing splits (data.validation_split)")
    perm = np.random.default_rng(d.split_seed).permutation(n)
    out, start = {}, 0
    for r in roles:
        out[r] = np.sort(perm[start:start + sizes[r]])
        start += sizes[r]
    out["train"] = np.sort(perm[start:])
    return out


def _carve_stream(docs: Iterator[str], roles: list[str], d: DataConfig) -> tuple[Iterator[str], dict[str, list[str]]]:
    """Streams have no length: each document goes to a carved split with probability equal to its
    fraction (uniforms from a generator seeded by data.split_seed), else to train. The carved lists
    fill while train is read."""
    carved: dict[str, list[str]] = {r: [] for r in roles}
    bounds = np.cumsum([{"validation": d.validation_fraction, "test": d.test_fraction}[r] for r in roles])

    def train() -> Iterator[str]:
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

    return train(), carved


# --------------------------------------------------------------------------------------------
# Sources: where the text comes from, and a fingerprint that changes when it does


@dataclass
class _Source:
    kind: str  # builtin | files | disk | folder | hub
    description: str  # for people
    fingerprint: dict  # JSON; changes when the data changes
    path: str = ""
    builder: str | None = None
    files: dict[str, list[Path]] | None = None  # local files, for builders (and the UTF-8 check)


def _file_stamp(path: Path) -> list:
    st = path.stat()
    return [str(path), st.st_size, st.st_mtime_ns]


def _human_bytes(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1000 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} GB"


def _resolve_data_files(spec: Any, base: Path) -> dict[str, list[Path]]:
    """data.data_files (a path, glob, list, or {split: files}) → {split: sorted existing files}."""
    if isinstance(spec, (str, Path)):
        spec = {"train": [spec]}
    elif isinstance(spec, (list, tuple)):
        spec = {"train": list(spec)}
    elif not isinstance(spec, dict):
        raise DataError(f"data.data_files must be a path, a glob, a list or a mapping split: files, not {spec!r}")
    out: dict[str, list[Path]] = {}
    for split, patterns in spec.items():
        patterns = patterns if isinstance(patterns, (list, tuple)) else [patterns]
        files: list[Path] = []
        for pattern in patterns:
            full = Path(str(pattern)).expanduser()
            full = full if full.is_absolute() else base / full
            matches = sorted(Path(m) for m in globlib.glob(str(full), recursive=True) if Path(m).is_file())
            if not matches:
                raise DataError(f"data.data_files: {pattern!r} matches no file (relative paths start at {base}) "
                                "— check the path or the glob")
            files.extend(m.resolve() for m in matches if m.resolve() not in files)
        out[str(split)] = files
    return out


def _offline() -> bool:
    return any(os.environ.get(v, "").upper() in ("1", "ON", "YES", "TRUE")
               for v in ("HF_DATASETS_OFFLINE", "HF_HUB_OFFLINE"))


def _hub_revision(path: str, revision: str | None) -> str:
    """The commit the hub serves for this dataset revision, so that the cache key changes when the
    dataset does. Offline (or unreachable), the last commit seen, so cached tokens are still used."""
    if revision and re.fullmatch(r"[0-9a-f]{40}", revision):
        return revision  # a pinned commit names itself: no need to ask the hub
    memo_file = cache_root() / "hub-revisions.json"
    memo = _read_json(memo_file) or {}
    name = f"{path}@{revision or 'main'}"
    if not _offline():
        try:
            from huggingface_hub import HfApi

            sha = HfApi().dataset_info(path, revision=revision, timeout=10).sha
            if sha and memo.get(name) != sha:
                memo[name] = sha
                memo_file.parent.mkdir(parents=True, exist_ok=True)
                _write_json(memo_file, memo)
            return sha or name
        except Exception:  # unreachable, gated or missing: load_dataset will say which
            pass
    return memo.get(name, name)


def _resolve_source(d: DataConfig) -> _Source:
    """Decide what data.path names and fingerprint it, without loading anything."""
    p = d.path.strip()
    if p.startswith("builtin:"):
        name = p[len("builtin:"):]
        if name == "synthetic":
            s = d.synthetic
            return _Source("builtin", f"builtin:synthetic ({s.vocab_size} words in {s.n_classes} classes, "
                                      f"zipf {s.zipf}, seed {s.seed})",
                           {"builtin": "synthetic", "version": corpora.SYNTHETIC_VERSION, **dataclasses.asdict(s)}, p)
        if name == "pydoc":
            return _Source("builtin", f"builtin:pydoc (CPython {sys.version_info[0]}.{sys.version_info[1]} "
                                      "documentation topics)",
                           {"builtin": "pydoc", "text": corpora.pydoc_fingerprint()}, p)
        raise DataError(f"unknown built-in corpus {p} — use builtin:synthetic or builtin:pydoc")

    if p in _BUILDERS:
        if d.data_files is None:
            raise DataError(f"data.path: {p} needs data.data_files (a path, a glob, a list, or split: files)")
        return _files_source(_BUILDERS[p], _resolve_data_files(d.data_files, Path.cwd()), p)

    local = Path(p).expanduser()
    if p.startswith(("/", "./", "../", "~", ".\\")) or local.exists():
        if not local.exists():
            raise DataError(f"data.path {p} does not exist — check the path (hub ids look like owner/name)")
        local = local.resolve()
        if local.is_file():
            builder = _EXTENSIONS.get(local.suffix.lower())
            if builder is None:
                raise DataError(f"cannot tell the format of {p} from its extension — use data.path: text (or json, "
                                f"csv, parquet) with data.data_files: {p}")
            return _files_source(builder, {"train": [local]}, p)
        listing = [_file_stamp(f) for f in sorted(local.rglob("*"))
                   if f.is_file() and not any(part.startswith(".") for part in f.relative_to(local).parts)]
        if not listing:
            raise DataError(f"data.path {p} is an empty folder — add data files (.txt, .json, .jsonl, .csv, "
                            ".parquet) or point data.path elsewhere")
        size = _human_bytes(sum(s[1] for s in listing))
        if (local / "dataset_dict.json").exists() or (local / "state.json").exists():
            return _Source("disk", f"dataset saved with save_to_disk at {local} ({size})",
                           {"disk": str(local), "files": listing}, str(local))
        files = _resolve_data_files(d.data_files, local) if d.data_files is not None else None
        return _Source("folder", f"local dataset folder {local} ({len(listing)} files, {size})",
                       {"folder": str(local), "files": listing, "name": d.name,
                        "data_files": {k: [str(f) for f in v] for k, v in (files or {}).items()}},
                       str(local), files=files)

    what = f"hub dataset {p}" + (f" ({d.name})" if d.name else "") + (f" @ {d.revision}" if d.revision else "")
    return _Source("hub", what, {"hub": p, "name": d.name, "revision": _hub_revision(p, d.revision),
                                 "data_files": d.data_files}, p)


def _files_source(builder: str, files: dict[str, list[Path]], path: str) -> _Source:
    stamps = {split: [_file_stamp(f) for f in fs] for split, fs in files.items()}
    n = sum(len(fs) for fs in files.values())
    size = _human_bytes(sum(s[1] for fs in stamps.values() for s in fs))
    names = ", ".join(f.name for fs in files.values() for f in fs[:3]) + (", ..." if n > 3 else "")
    return _Source("files", f"{builder} files: {names} ({n} file{'s' * (n != 1)}, {size})",
                   {"builder": builder, "files": stamps}, path, builder=builder, files=files)


# --------------------------------------------------------------------------------------------
# Loading through `datasets`, and turning its exceptions into one-line DataErrors


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


@contextlib.contextmanager
def _datasets_progress(progress: bool):
    import datasets

    was_disabled = datasets.are_progress_bars_disabled()
    (datasets.enable_progress_bars if progress else datasets.disable_progress_bars)()
    try:
        yield
    finally:
        (datasets.disable_progress_bars if was_disabled else datasets.enable_progress_bars)()


def _first_non_utf8(files: list[Path]) -> tuple[Path, int, int] | None:
    """The first file that is not UTF-8: (file, byte offset, byte value)."""
    import codecs

    for f in files:
        decoder = codecs.getincrementaldecoder("utf-8")()
        offset = 0
        with open(f, "rb") as fh:
            while chunk := fh.read(1 << 20):
                try:
                    decoder.decode(chunk)
                except UnicodeDecodeError as exc:
                    return f, offset + exc.start, chunk[exc.start]
                offset += len(chunk)
    return None


def _local_files(source: _Source) -> list[Path]:
    files = [f for fs in (source.files or {}).values() for f in fs]
    if source.kind == "folder" and not files:
        files = [Path(s[0]) for s in source.fingerprint["files"]]
    return files


def _is_blank(path: Path) -> bool:
    """0 bytes, or (a text format) nothing but whitespace: read up to the first other byte."""
    try:
        if path.stat().st_size == 0:
            return True
        if path.suffix.lower() == ".parquet":
            return False
        with open(path, "rb") as fh:
            while chunk := fh.read(1 << 16):
                if chunk.strip():
                    return False
        return True
    except OSError:  # unreadable: datasets says so
        return False


def _shown(path: Path) -> str:
    """A path as the user probably wrote it: relative to the working folder when it is inside it."""
    try:
        return str(path.relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)


def _empty_files(files: list[Path], source: _Source) -> ConfigError:
    """Data files with nothing in them are what the config names: a config error, like a wrong path."""
    key = "data.data_files" if source.files and (source.kind == "folder" or source.path in _BUILDERS) \
        else "data.path"
    names = ", ".join(_shown(f) for f in files[:3]) + (f" and {len(files) - 3} more" if len(files) > 3 else "")
    if len(files) == 1:
        return ConfigError(f"data file {names} is empty — give a file with text, or check {key}")
    return ConfigError(f"data files {names} are empty — give files with text, or check {key}")


def _check_not_empty(source: _Source) -> None:
    """Name empty data files before `datasets` reads them: it says only "An error occurred while
    generating the dataset". An empty file among others adds no documents to a text split, which
    is harmless; the csv, json and parquet builders fail on one (json on whitespace, not 0 bytes)."""
    for files in (source.files or {}).values():
        empty = [f for f in files if _is_blank(f)]
        fatal = empty if len(empty) == len(files) else \
            [f for f in empty if _EXTENSIONS.get(f.suffix.lower(), source.builder) != "text"]
        if fatal:
            raise _empty_files(fatal, source)


# What `datasets` raises for a file with no data in it: the text builder ("at least one example"),
# pandas for csv, and the json builder (StopIteration, or "Instruction "train" corresponds to no
# data!"). Only taken to mean that when an empty file is found.
_EMPTY_ERRORS = ("SchemaInferenceError", "EmptyDataError", "StopIteration")


def _translate(exc: BaseException, source: _Source, d: DataConfig) -> TiedlmError:
    from datasets.exceptions import DataFilesNotFoundError, DatasetNotFoundError

    chain = _chain(exc)
    msg = _first_line(exc)
    if _errno_of(exc) in _NO_ROOM:  # datasets writing its arrow copy of the data
        if source.kind == "hub":
            import datasets.config

            return _write_failure(exc, datasets.config.HF_DATASETS_CACHE, "the Hugging Face datasets cache",
                                  "HF_DATASETS_CACHE")
        return _write_failure(exc, cache_root() / "datasets")
    if any(type(e).__name__ in _EMPTY_ERRORS for e in chain) or "corresponds to no data" in msg:
        empty = [f for f in _local_files(source) if _is_blank(f)]
        if empty:
            return _empty_files(empty, source)
    if any(isinstance(e, UnicodeDecodeError) for e in chain):
        bad = _first_non_utf8(_local_files(source))
        if bad is None:
            return DataError(f"a data file of {source.description} is not UTF-8 text — convert it to UTF-8 "
                             "(e.g. iconv -f latin1 -t utf-8 FILE > FILE.utf8)")
        return DataError(f"{bad[0]} is not UTF-8 text (byte 0x{bad[2]:02x} at offset {bad[1]}) — convert it to "
                         f"UTF-8, e.g. iconv -f latin1 -t utf-8 {bad[0]} > {bad[0]}.utf8")
    if source.kind == "hub" and (isinstance(exc, ConnectionError) or "Couldn't reach" in msg):
        if _offline():
            return DataError(f"{source.description} is not in the local Hugging Face cache and the hub is switched "
                             "off (HF_DATASETS_OFFLINE / HF_HUB_OFFLINE is set) — unset it to download, "
                             f"or use {_TEXT_FREE}")
        return DataError(f"cannot reach the Hugging Face hub to load {source.description} — check the network, set "
                         f"HF_DATASETS_OFFLINE=1 to use a copy downloaded before, or use {_TEXT_FREE}")
    if isinstance(exc, DataFilesNotFoundError):
        return DataError(f"{source.description}: {msg} — add .txt/.json/.jsonl/.csv/.parquet files "
                         "or set data.data_files")
    if isinstance(exc, DatasetNotFoundError):
        return DataError(f"{source.description} was not found: {msg} — check data.path and data.revision "
                         "(private or gated datasets need `hf auth login`)")
    if isinstance(exc, ValueError) and ("BuilderConfig" in msg or "Config name is missing" in str(exc)):
        configs = str(exc).split("[", 1)[-1].split("]", 1)[0] if "[" in str(exc) else "?"
        if d.name:
            return DataError(f"data.name {d.name!r} is not a config of {d.path}; it has: {configs} — "
                             "set data.name to one of them")
        return DataError(f"{d.path} has several configs: {configs} — set data.name to one of them")
    if isinstance(exc, FileNotFoundError):
        return DataError(f"{source.description}: {msg} — check data.path and data.data_files")
    return DataError(f"datasets could not load {source.description}: {msg} — check data.path, data.data_files "
                     "and the files' format (--debug shows the traceback)")


def _load_raw(source: _Source, d: DataConfig, progress: bool) -> dict[str, Any]:
    """{split name: datasets.Dataset | IterableDataset | list[str]} for the source."""
    if source.kind == "builtin":
        if d.path.strip() == "builtin:synthetic":
            return {k: [v] for k, v in corpora.synthetic_splits(d.synthetic).items()}
        return corpora.pydoc_splits()

    _check_not_empty(source)
    import datasets

    local_cache = str(cache_root() / "datasets")  # arrow copies of local files live with our cache
    marking = _marking(Path(local_cache)) if source.kind in ("files", "folder") else contextlib.nullcontext()
    try:
        with _datasets_progress(progress), marking:
            if source.kind == "disk":
                obj = datasets.load_from_disk(source.path)
            elif source.kind == "files":
                files = {s: [str(f) for f in fs] for s, fs in source.files.items()}
                obj = datasets.load_dataset(source.builder, data_files=files, cache_dir=local_cache,
                                            streaming=d.streaming)
            elif source.kind == "folder":
                files = {s: [str(f) for f in fs] for s, fs in source.files.items()} if source.files else None
                obj = datasets.load_dataset(source.path, name=d.name, data_files=files, cache_dir=local_cache,
                                            streaming=d.streaming)
            else:
                obj = datasets.load_dataset(source.path, name=d.name, data_files=d.data_files, revision=d.revision,
                                            streaming=d.streaming)
    except TiedlmError:
        raise
    except Exception as exc:
        raise _translate(exc, source, d) from exc
    if isinstance(obj, (datasets.Dataset, datasets.IterableDataset)):
        obj = {"train": obj}
    return dict(obj)


def _documents(source: _Source, d: DataConfig, progress: bool) -> tuple[dict[str, _Docs], dict]:
    """The documents of train, validation and (when there is one) test, and how they were chosen."""
    raw = _load_raw(source, d, progress)
    what = source.description
    if source.kind == "builtin":  # built-in corpora bring their own three splits
        docs = {name: _ArrowDocs(*_arrow_docs(_pa_strings(texts))) for name, texts in raw.items()}
        return docs, {"splits": list(docs), "origins": {s: "built in" for s in docs}, "carving": None}

    available = ", ".join(raw) or "none"
    if d.train_split not in raw:
        raise DataError(f"{what} has no split {d.train_split!r}; it has: {available} — set data.train_split")
    chosen = {"train": raw[d.train_split]}
    origins = {"train": d.train_split}
    carve: list[str] = []
    for role, name, fraction, aliases in (
            ("validation", d.validation_split, d.validation_fraction, ("valid", "dev", "val")),
            ("test", d.test_split, d.test_fraction, ())):
        # the default name also finds the usual variants (WikiText's "valid", GLUE's "dev")
        names = [name] + (list(aliases) if name == role else []) if name else []
        found = next((n for n in names if n in raw and n != d.train_split), None)
        if found:
            chosen[role], origins[role] = raw[found], found
        elif name and name != role:
            raise DataError(f"{what} has no split {name!r} (data.{role}_split); it has: {available} — "
                            f"name one of them, or set data.{role}_split: null to carve it from train")
        elif fraction > 0:
            carve.append(role)
        elif role == "validation":
            raise DataError(f"{what} has no validation split and data.validation_fraction is 0 — set "
                            f"data.validation_split to one of: {available}, or data.validation_fraction > 0")

    import datasets

    docs: dict[str, _Docs] = {}
    for role, ds in chosen.items():
        if isinstance(ds, datasets.IterableDataset):
            docs[role] = _StreamDocs(_stream_texts(ds, d.text_column, role, what, source, d))
        else:
            docs[role] = _ArrowDocs(*_arrow_docs(_text_column(ds, d.text_column, role, what)))

    carving = None
    fractions = {"validation": d.validation_fraction, "test": d.test_fraction}
    if carve:
        if isinstance(docs["train"], _StreamDocs):
            train_iter, carved = _carve_stream(docs["train"]._make_iter(), carve, d)
            docs["train"] = _StreamDocs(lambda: train_iter)
            for role in carve:
                docs[role] = _StreamDocs(lambda role=role: iter(carved[role]))
            method = "each streamed document drawn with its fraction's probability"
        else:
            train = docs["train"]
            parts = _carve(train.n, carve, d, what)
            for role, pos in parts.items():
                docs[role] = _ArrowDocs(train.column, train.indices[pos])
            method = "a random permutation of the train split's documents"
        carving = {"from": d.train_split, "split_seed": d.split_seed, "method": method,
                   **{f"{r}_fraction": fractions[r] for r in carve}}
        for role in carve:
            origins[role] = f"carved from {d.train_split} ({100 * fractions[role]:g}%, split_seed {d.split_seed})"
    order = [s for s in SPLITS if s in docs]
    return {s: docs[s] for s in order}, {"splits": order, "origins": origins, "carving": carving}


def _pa_strings(texts: list[str]) -> Any:
    import pyarrow as pa

    return pa.array(texts, type=pa.large_string())


def _text_column(ds: Any, column: str, role: str, what: str) -> Any:
    import pyarrow as pa

    if column not in ds.column_names:
        raise DataError(f"{what} has no column {column!r} in its {role} split; its columns are: "
                        f"{', '.join(ds.column_names)} — set data.text_column")
    col = ds.with_format("arrow")[column]
    t = col.type
    is_view = getattr(pa.types, "is_string_view", lambda _: False)  # pyarrow >= 16
    if not (pa.types.is_string(t) or pa.types.is_large_string(t) or is_view(t)):
        raise DataError(f"column {column!r} of {what} holds {t} values, not text — set data.text_column to a "
                        f"text column (columns: {', '.join(ds.column_names)})")
    return col


def _stream_texts(ds: Any, column: str, role: str, what: str, source: "_Source",
                  d: DataConfig) -> Callable[[], Iterator[str]]:
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
                raise _translate(exc, source, d) from exc
            yield example

    def texts() -> Iterator[str]:
        for example in examples():
            if column not in example:
                raise DataError(f"{what} has no column {column!r} in its {role} split; its columns are: "
                                f"{', '.join(example)} — set data.text_column")
            text = example[column]
            if text is not None and not isinstance(text, str):
                raise DataError(f"column {column!r} of {what} holds {type(text).__name__} values, not text — "
                                "set data.text_column to a text column")
            if text and not text.isspace():
                yield text

    return texts


# --------------------------------------------------------------------------------------------
# Encoding a split, and its cache entry


def _token_dtype(vocab_size: int) -> type:
    return np.uint16 if vocab_size <= 1 << 16 else np.uint32


def encode_split(name: str, docs: _Docs, tok: Tokenizer, limit: int | None,
                 progress: bool = False) -> tuple[np.ndarray, dict]:
    """All documents of a split as one array, each followed by tok.eot_id, cut at `limit` tokens;
    and the split's statistics, of the text actually kept."""
    from tqdm import tqdm

    dtype = _token_dtype(tok.vocab_size)
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


def _store_split(key: str, name: str, tokens: np.ndarray, stats: dict, counts: np.ndarray | None,
                 manifest: dict) -> Path:
    with _new_entry("tokens", key) as tmp:
        _save_npy(tmp / "tokens.npy", tokens)
        if counts is not None:
            _save_npy(tmp / "counts.npy", counts)
        _write_json(tmp / "manifest.json", {**manifest, "format": CACHE_FORMAT, "kind": "tokens", "key": key,
                                            "split": name, "n_tokens": int(len(tokens)), "dtype": str(tokens.dtype),
                                            **stats, "created": time.strftime("%Y-%m-%dT%H:%M:%S")})
    return cache_root() / "tokens" / key


def _read_split(key: str) -> tuple[SplitData, np.ndarray | None, Path] | None:
    """A cached split, memory-mapped; None if there is none (a broken entry is removed)."""
    folder = cache_root() / "tokens" / key
    m = _read_json(folder / "manifest.json")
    if m is None or m.get("format") != CACHE_FORMAT:
        return None
    try:
        tokens = np.load(folder / "tokens.npy", mmap_mode="r")
        counts = np.load(folder / "counts.npy") if (folder / "counts.npy").exists() else None
    except (OSError, ValueError):
        tokens = None
    if tokens is None or tokens.ndim != 1 or len(tokens) != m["n_tokens"] or str(tokens.dtype) != m["dtype"]:
        _drop(folder)
        return None
    split = SplitData(m["split"], tokens, m["n_docs"], m["n_chars"], m["n_bytes"], m["n_words"], m["oov_rate"])
    return split, counts, folder


def _store_tokenizer(key: str, tok: Tokenizer, manifest: dict) -> tuple[Tokenizer, Path]:
    with _new_entry("tokenizers", key) as tmp:
        tok.save(tmp)
        _write_json(tmp / "manifest.json", {**manifest, "format": CACHE_FORMAT, "kind": "tokenizer", "key": key,
                                            "tokenizer_kind": tok.kind, "vocab_size": tok.vocab_size,
                                            "created": time.strftime("%Y-%m-%dT%H:%M:%S")})
    final = cache_root() / "tokenizers" / key
    # Read back what is in place: if another process published first, use its tokenizer so that
    # the token arrays always match the tokenizer stored beside them.
    return load_tokenizer(final), final


def _read_tokenizer(key: str) -> tuple[Tokenizer, dict, Path] | None:
    folder = cache_root() / "tokenizers" / key
    m = _read_json(folder / "manifest.json")
    if m is None or m.get("format") != CACHE_FORMAT:
        return None
    try:
        return load_tokenizer(folder), m, folder
    except (DataError, OSError, KeyError, ValueError):
        _drop(folder)
        return None


# --------------------------------------------------------------------------------------------
# prepare_data


def _split_settings(d: DataConfig, source: _Source) -> dict:
    """The DataConfig fields that decide which documents land in which split."""
    if source.kind == "builtin":
        return {}
    return {"text_column": d.text_column, "train_split": d.train_split, "validation_split": d.validation_split,
            "test_split": d.test_split, "validation_fraction": d.validation_fraction,
            "test_fraction": d.test_fraction, "split_seed": d.split_seed, "streaming": d.streaming,
            # a stream is read until the train limit is reached, so carved splits depend on it
            "stream_limit": d.max_train_tokens if d.streaming else None}


def data_identity(data) -> dict:
    """What the tokens of a run depend on: the source's fingerprint and the tokenizer's key."""
    return {"fingerprint": data.info.get("fingerprint"), "tokenizer": data.info.get("tokenizer", {}).get("key")}


def prepare_data(cfg: Config, progress: bool = True) -> PreparedData:
    """Load, split, tokenize and cache the data that cfg.data and cfg.tokenizer describe."""
    t_start = time.perf_counter()
    d, tcfg = cfg.data, cfg.tokenizer
    if d.streaming and d.max_train_tokens is None:
        raise DataError("data.streaming: true needs data.max_train_tokens (how much of the stream to take)")
    source = _resolve_source(d)
    data_key = _key({"source": source.fingerprint, "splits": _split_settings(d, source)})
    tok_key = _key({"format": CACHE_FORMAT, "data": data_key, "tokenizer": _tokenizer_fingerprint(tcfg)})
    limits = {"train": d.max_train_tokens, "validation": d.max_eval_tokens, "test": d.max_eval_tokens}

    def split_key(name: str) -> str:
        return _key({"tokenizer": tok_key, "split": name, "limit": limits[name]})

    timings: dict[str, float] = {}
    found: dict[str, tuple[SplitData, np.ndarray | None, Path]] = {}
    entry = _read_tokenizer(tok_key)
    tokenizer_hit = entry is not None
    if entry is not None:
        tokenizer, tok_manifest, tok_folder = entry
        layout = tok_manifest["layout"]
        for name in layout["splits"]:
            hit = _read_split(split_key(name))
            if hit is not None:
                found[name] = hit
    if entry is None or len(found) < len(layout["splits"]):
        t = time.perf_counter()
        docs, new_layout = _documents(source, d, progress)
        for name, dd in docs.items():
            if dd.n == 0:
                raise DataError(f"the {name} split of {source.description} has no non-empty documents in column "
                                f"{d.text_column!r} — check the data, data.text_column and the split names")
        timings["load_s"] = time.perf_counter() - t
        if entry is None:
            t = time.perf_counter()
            tokenizer = train_tokenizer(tcfg, docs["train"], progress)
            layout = new_layout
            tokenizer, tok_folder = _store_tokenizer(tok_key, tokenizer, {
                "source": source.description, "data_key": data_key, "layout": layout,
                "trained_on": f"train split, first {tcfg.max_train_bytes:,} bytes"
                if tcfg.kind in ("bpe", "word", "char") else "nothing (no training)"})
            timings["tokenizer_s"] = time.perf_counter() - t
        if any(isinstance(dd, _StreamDocs) for dd in docs.values()):
            found = {}  # a stream is read once, in order: encode every split again
        t = time.perf_counter()
        for name in layout["splits"]:
            if name in found:
                continue
            tokens, stats = encode_split(name, docs[name], tokenizer, limits[name], progress)
            if stats["n_docs"] == 0:
                raise DataError(f"the {name} split of {source.description} has no non-empty documents — "
                                "check the data and data.text_column")
            counts = np.bincount(tokens, minlength=tokenizer.vocab_size).astype(np.int64) if name == "train" else None
            key = split_key(name)
            _store_split(key, name, tokens, stats, counts, {
                "source": source.description, "tokenizer": f"{tokenizer.kind} {tokenizer.vocab_size}",
                "tokenizer_key": tok_key, "limit": limits[name], "origin": layout["origins"][name]})
            found[name] = _read_split(key)
        timings["encode_s"] = time.perf_counter() - t

    splits = {name: found[name][0] for name in layout["splits"]}
    need = cfg.model.block_size + 1
    for name, s in splits.items():
        if len(s.tokens) < need:
            limit_key = "data.max_train_tokens" if name == "train" else "data.max_eval_tokens"
            hint = f"raise {limit_key}, " if limits[name] is not None else ""
            raise DataError(f"the {name} split has {len(s.tokens)} tokens, fewer than model.block_size + 1 = {need} "
                            f"— {hint}use more data or a smaller model.block_size")

    vocab = tokenizer.vocab_size
    model_vocab = -(-vocab // tcfg.pad_to_multiple) * tcfg.pad_to_multiple
    counts = found["train"][1]
    if counts is None:
        counts = np.bincount(splits["train"].tokens, minlength=vocab)
    train_counts = np.zeros(model_vocab, dtype=np.int64)
    train_counts[: len(counts)] = counts

    floor = None
    if source.kind == "builtin" and d.path.strip() == "builtin:synthetic":
        n_sep = {n: int(np.count_nonzero(np.asarray(s.tokens) == tokenizer.eot_id)) for n, s in splits.items()}
        floor = corpora.synthetic_floor(d.synthetic, {n: s.n_words - n_sep[n] for n, s in splits.items()},
                                        {n: s.n_bytes for n, s in splits.items()})

    timings["total_s"] = time.perf_counter() - t_start
    info = {
        "source": source.description,
        "source_kind": source.kind,
        "path": d.path,
        "fingerprint": data_key,
        "splits": layout["origins"],
        "carving": layout["carving"],
        "streaming": d.streaming,
        "limits": {"max_train_tokens": d.max_train_tokens, "max_eval_tokens": d.max_eval_tokens},
        "tokenizer": {"kind": tokenizer.kind, "vocab_size": vocab, "model_vocab_size": model_vocab,
                      "padding": model_vocab - vocab, "eot_id": tokenizer.eot_id, "unk_id": tokenizer.unk_id,
                      "requested_vocab_size": tcfg.vocab_size, "key": tok_key},
        "cache": {"root": str(cache_root()), "hit": tokenizer_hit and "load_s" not in timings,
                  "tokenizer_hit": tokenizer_hit, "tokenizer_folder": str(tok_folder),
                  "split_folders": {n: str(found[n][2]) for n in splits}},
        "timings": {k: round(v, 4) for k, v in timings.items()},
    }
    return PreparedData(tokenizer, vocab, model_vocab, splits, train_counts, floor, info)


# --------------------------------------------------------------------------------------------
# What `tiedlm data` prints, and `tiedlm cache list/clear`


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
        bpb = ", ".join(f"{k} {v:.3f}" for k, v in f["bits_per_byte"].items())
        lines += ["", f"floor      {f['nats_per_word']:.4f} nats/word "
                      f"(perplexity {f['perplexity_per_word']:.2f} per word); bits/byte: {bpb}"]
    c, t = info["cache"], info["timings"]
    how = f"hit, {t['total_s']:.2f} s" if c["hit"] else \
        "built in " + ", ".join(f"{k[:-2]} {v:.2f} s" for k, v in t.items())
    lines += ["", f"cache      {c['root']} ({how})"]
    return "\n".join(lines)


_KINDS = {"tokenizers": "tokenizer", "tokens": "tokens"}  # cache folder → the kind its manifests name
_MEMO = "hub-revisions.json"
_MEMO_TMP = re.compile(rf"\.{re.escape(_MEMO)}\.{_TMP_TAG}\.tmp")  # see _replace_atomically


def _is_entry(folder: Path, kind: str) -> bool:
    """An entry tiedlm published: its manifest names its kind and, as its key, the folder's name."""
    m = _read_json(folder / "manifest.json") if folder.is_dir() and not folder.is_symlink() else None
    return isinstance(m, dict) and m.get("kind") == kind and m.get("key") == folder.name


def _top_marks(marks: set[str]) -> set[str]:
    """The marked paths that no other marked path holds ("." aside)."""
    return {r for r in marks - {"."} if not any(r.startswith(o + "/") for o in marks)}


def cache_entries() -> list[dict]:
    """The token cache, for `tiedlm cache list`: one dict per entry with key, kind ("tokens",
    "tokenizer" or "datasets"), source, split, tokenizer, tokens, bytes (on disk) and path."""
    root = cache_root()
    out = []
    for kind in ("tokenizers", "tokens"):
        for folder in sorted((root / kind).glob("*")) if (root / kind).is_dir() else []:
            if not _is_entry(folder, _KINDS[kind]):
                continue
            m = _read_json(folder / "manifest.json")
            out.append({"key": folder.name, "kind": m.get("kind"), "source": m.get("source"),
                        "split": m.get("split"),
                        "tokenizer": m.get("tokenizer") or f"{m.get('tokenizer_kind')} {m.get('vocab_size')}",
                        "tokens": m.get("n_tokens"), "bytes": _size(folder), "path": str(folder),
                        "created": m.get("created")})
    made = [root / "datasets" / r for r in sorted(_top_marks(_marked(root / "datasets")))]
    if any(p.exists() for p in made):  # only what tiedlm's loads made there: what `cache clear` removes
        out.append({"key": "datasets", "kind": "datasets", "source": "arrow copies of local files made by `datasets`",
                    "split": None, "tokenizer": None, "tokens": None, "bytes": sum(_size(p) for p in made),
                    "path": str(root / "datasets"), "created": None})
    return out


@dataclass
class ClearedCache:
    """What `tiedlm cache clear` did under root."""

    root: Path
    freed_bytes: int = 0
    removed: list[Path] = dataclasses.field(default_factory=list)
    left_alone: list[tuple[Path, str]] = dataclasses.field(default_factory=list)  # (path, why it was kept)


def _remove(path: Path, out: ClearedCache) -> None:
    size = _size(path)
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)  # another process may be removing it too
    else:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
    if os.path.lexists(path):
        out.left_alone.append((path, "could not be removed — check its permissions"))
        return
    out.removed.append(path)
    out.freed_bytes += size


def _remove_unless_in_use(path: Path, m: re.Match, out: ClearedCache) -> None:
    why = _being_written(path, m)
    if why is None:
        _remove(path, out)
    else:
        out.left_alone.append((path, why))


def _clear_entries(folder: Path, kind: str, out: ClearedCache) -> None:
    for path in sorted(folder.iterdir()):
        m = _TMP_ENTRY.fullmatch(path.name)
        if _is_entry(path, kind):
            _remove(path, out)
        elif m and path.is_dir() and not path.is_symlink():  # left by a killed process, or being written
            _remove_unless_in_use(path, m, out)
        else:
            out.left_alone.append((path, "not made by tiedlm"))
    with contextlib.suppress(OSError):  # only if nothing is left in it
        folder.rmdir()


def _clear_datasets(folder: Path, out: ClearedCache) -> None:
    """Remove the marked paths (see _marking); go down into a folder that holds marked paths."""
    marks = _marked(folder)

    def walk(path: Path, rel: str) -> None:
        for child in sorted(path.iterdir()):
            r = rel + child.name
            if r == _MARKS:
                continue
            if r in marks:
                _remove(child, out)
            elif child.is_dir() and not child.is_symlink() and any(m.startswith(r + "/") for m in marks):
                walk(child, r + "/")
            else:
                out.left_alone.append((child, "not made by tiedlm"))

    walk(folder, "")
    for rel in marks - {"."}:  # markers of what is gone now (or was removed by hand)
        if not os.path.lexists(folder / rel):
            with contextlib.suppress(OSError):
                (folder / _MARKS / _mark_name(rel)).unlink()
    if "." in marks and [p.name for p in folder.iterdir()] == [_MARKS]:  # tiedlm made it, and it is empty
        shutil.rmtree(folder, ignore_errors=True)
    with contextlib.suppress(OSError):  # only if no marker is left in it
        (folder / _MARKS).rmdir()


def clear_cache() -> ClearedCache:
    """Remove what tiedlm made under cache_root(): entries with a tiedlm manifest, what its loads
    marked in datasets/, hub-revisions.json, and temporary folders and files that no live process
    is writing. Everything else there is left alone, and listed with the reason."""
    root = cache_root()
    out = ClearedCache(root)
    for path in sorted(root.iterdir()) if root.is_dir() else []:
        real_dir = path.is_dir() and not path.is_symlink()
        if path.name in _KINDS and real_dir:
            _clear_entries(path, _KINDS[path.name], out)
        elif path.name == "datasets" and real_dir:
            _clear_datasets(path, out)
        elif path.name == _MEMO and path.is_file():
            _remove(path, out)
        elif (m := _MEMO_TMP.fullmatch(path.name)) and path.is_file():
            _remove_unless_in_use(path, m, out)
        else:
            out.left_alone.append((path, "not made by tiedlm"))
    return out
