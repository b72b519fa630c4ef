"""Built-in corpora that need no download: `builtin:synthetic`, `builtin:pydoc` and `builtin:shakespeare`.

`builtin:synthetic` is a class-based Markov language. Every word belongs to exactly one latent
class; the class sequence is a sparse Markov chain (each class has `successors` possible next
classes); within a class, words follow a Zipf law. Because a word determines its class,
p(w_t | w_<t) = T[c(w_{t-1}), c(w_t)] * p(w_t | c(w_t)), so the entropy rate is exact:

    H = sum_c pi_c H(T[c, :]) + sum_c pi_c H(W | c)        (nats per word, pi stationary)

H is an expectation over endless text. What a perfect model scores on a finite split is that
split's own value, `synthetic_floor`'s "splits": the true model's loss on the split's tokens, per
token, computed exactly (and, where a word tokenizer maps words to `<unk>`, by a forward pass over
the hidden classes: the best loss achievable on the token stream the model sees).

`builtin:pydoc` is real English that ships with every CPython: the documentation topics of
`pydoc_data.topics` (the text `help("assert")` prints), split by paragraph into train/validation/test.

`builtin:shakespeare` is Tiny Shakespeare (Karpathy's char-rnn corpus, public domain), shipped in
the package and checked by SHA-256 when it is read; split into contiguous blocks of lines (90/5/5)
cut at speech boundaries, one document per speech.
"""

from __future__ import annotations

import functools
import gzip
import hashlib
import re
import time
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from ..config.checks import SPLITS
from ..config import DataConfig, SyntheticConfig
from ..errors import DataError
from ..perplexity import bits_per_byte, perplexity

if TYPE_CHECKING:
    from . import SplitData
    from .tokenizers import Tokenizer

# Bump when the generator changes, so cached token arrays of the old language are not reused.
SYNTHETIC_VERSION = 1
BUILTINS = ("synthetic", "pydoc", "shakespeare")
WORDS_PER_LINE = 16

# Syllables for pronounceable pseudo-words: onset + vowel (+ coda at the end of a word).
_ONSETS = ["", "b", "c", "d", "f", "g", "h", "j", "k", "l", "m", "n", "p", "r", "s", "t", "v", "w", "z",
           "br", "ch", "cl", "dr", "fl", "gr", "pl", "pr", "sh", "sl", "st", "th", "tr"]
_VOWELS = ["a", "e", "i", "o", "u", "ai", "ea", "ie", "oo", "ou"]
_CODAS = ["", "", "", "n", "r", "s", "t", "l", "m", "nd", "st", "ck"]


@dataclass
class SyntheticLanguage:
    """The exact model behind `builtin:synthetic`. Word ids are ordered by unigram frequency."""

    words: list[str]  # [V] distinct lowercase pseudo-words; shorter strings for frequent words
    word_class: np.ndarray  # [V] int, the one class of each word
    emission: np.ndarray  # [V] p(word | its class)
    transitions: np.ndarray  # [C, C] row-stochastic, `successors` non-zeros per row
    stationary: np.ndarray  # [C] pi, with pi T = pi

    @property
    def n_classes(self) -> int:
        return len(self.stationary)

    def entropy_rate(self) -> float:
        """Nats per word of the stationary process."""
        t = self.transitions
        h_next = -np.sum(np.where(t > 0, t * np.log(np.where(t > 0, t, 1.0)), 0.0), axis=1)  # [C]
        h_word = np.zeros(self.n_classes)
        np.add.at(h_word, self.word_class, -self.emission * np.log(self.emission))  # [C] H(W | c)
        return float(self.stationary @ h_next + self.stationary @ h_word)

    def sample(self, n: int, rng: np.random.Generator) -> np.ndarray:
        """n word ids from the stationary chain (the first class is drawn from pi)."""
        classes = self._sample_classes(n, rng)
        # Words given classes are independent: draw them class by class, vectorised.
        words = np.empty(n, dtype=np.int64)
        u = rng.random(n)
        for c in range(self.n_classes):
            at = np.flatnonzero(classes == c)
            ids = np.flatnonzero(self.word_class == c)  # this class's words, most frequent first
            cdf = np.cumsum(self.emission[ids])
            pick = np.minimum(np.searchsorted(cdf, u[at] * cdf[-1], side="right"), len(ids) - 1)
            words[at] = ids[pick]
        return words

    def _sample_classes(self, n: int, rng: np.random.Generator) -> np.ndarray:
        # The chain is sequential by nature. A loop over plain Python ints with the uniforms drawn
        # up front costs ~0.3 µs a step (0.3 s per million words); composing the per-step maps
        # in parallel costs O(C^2) a step and was ten times slower for the default 32 classes.
        succ = [np.flatnonzero(row).tolist() for row in self.transitions]
        cum = [np.cumsum(row[s]).tolist() for row, s in zip(self.transitions, succ)]
        for c_cum in cum:
            c_cum[-1] = 1.0  # guard against rounding: u < 1 always lands on a successor
        c = int(np.searchsorted(np.cumsum(self.stationary), rng.random() * self.stationary.sum()))
        c = min(c, self.n_classes - 1)
        u = rng.random(n).tolist()
        out = [0] * n
        for t in range(n):
            out[t] = c
            row = cum[c]
            k = 0
            while row[k] <= u[t]:  # at most `successors` comparisons
                k += 1
            c = succ[c][k]
        return np.asarray(out, dtype=np.int64)

    def log_probs(self, ids: np.ndarray) -> np.ndarray:
        """log p(w_t | w_{t-1}) for t = 1..n-1 (nats): the true per-word loss along a sequence."""
        ids = np.asarray(ids)
        c = self.word_class[ids]
        with np.errstate(divide="ignore"):
            return np.log(self.transitions[c[:-1], c[1:]]) + np.log(self.emission[ids[1:]])

    def unk_mass(self, unk_words: np.ndarray) -> np.ndarray:
        """[C] the probability that class c emits a word of `unk_words` (a [V] bool mask)."""
        u = np.zeros(self.n_classes)
        np.add.at(u, self.word_class[unk_words], self.emission[unk_words])
        return u

    def stream_nll(self, codes: np.ndarray, unk_words: np.ndarray | None = None) -> np.ndarray:
        """-log P(x_t | x_<t) (nats) at every position of a stream of word ids and UNKs (no EOTs).

        The exact forward pass of the hidden-class HMM: the first class is drawn from pi; a word
        of the language reveals its class (each word has one); UNK stands for any word of
        `unk_words` and is emitted by class c with probability unk_mass[c], so after an UNK the
        class is known only as a distribution. Known words reset that distribution, so the
        sequential part runs over the runs of consecutive UNKs only, all runs in step."""
        codes = np.asarray(codes, dtype=np.int64)
        n, t = len(codes), self.transitions
        known = codes >= 0
        cls = self.word_class[np.where(known, codes, 0)]
        log_e = np.log(self.emission)
        nll = np.zeros(n)
        with np.errstate(divide="ignore"):
            log_t, log_pi = np.log(t), np.log(self.stationary)
            after_word = np.flatnonzero(known[1:] & known[:-1]) + 1  # a word right after a word
            nll[after_word] = -(log_t[cls[after_word - 1], cls[after_word]] + log_e[codes[after_word]])
            if n and known[0]:
                nll[0] = -(log_pi[cls[0]] + log_e[codes[0]])
            if known.all():
                return nll
            if unk_words is None:
                raise ValueError("the stream holds UNK codes: pass the words that map to <unk>")
            u = self.unk_mass(np.asarray(unk_words, dtype=bool))
            starts = np.flatnonzero(~known & np.concatenate([[True], known[:-1]]))  # a run of UNKs begins
            words_at = np.flatnonzero(known)
            k = np.searchsorted(words_at, starts)
            ends = np.where(k < len(words_at), words_at[np.minimum(k, len(words_at) - 1)], n)  # first word after
            order = np.argsort(-(ends - starts), kind="stable")  # longest runs first: the active runs are a prefix
            starts, ends = starts[order], ends[order]
            p = np.where((starts > 0)[:, None], t[cls[np.maximum(starts - 1, 0)]], self.stationary[None, :])
            for j in range(int((ends - starts).max())):
                r = int(np.count_nonzero(ends - starts > j))  # runs with an UNK at offset j
                q = p[:r] * u[None, :]  # [r, C] joint of the class and an UNK
                mass = q.sum(axis=1)
                nll[starts[:r] + j] = -np.log(mass)
                p[:r] = (q / mass[:, None]) @ t  # the filtered class, pushed one step on
            after = ends < n  # the word that ends each run, under the run's predictive distribution
            e = ends[after]
            nll[e] = -(np.log(p[after, cls[e]]) + log_e[codes[e]])
        return nll


def _pseudo_words(n: int, rng: np.random.Generator) -> list[str]:
    """n distinct pronounceable lowercase strings, shortest first."""
    words: dict[str, None] = {}
    batch = max(64, 2 * n)
    while len(words) < n:
        n_syl = rng.choice([1, 2, 3, 4], size=batch, p=[0.25, 0.4, 0.25, 0.1])
        onset = rng.integers(len(_ONSETS), size=(batch, 4))
        vowel = rng.integers(len(_VOWELS), size=(batch, 4))
        coda = rng.integers(len(_CODAS), size=batch)
        for i in range(batch):
            w = "".join(_ONSETS[onset[i, j]] + _VOWELS[vowel[i, j]] for j in range(n_syl[i])) + _CODAS[coda[i]]
            words.setdefault(w)
            if len(words) == n:
                break
    # Stable sort by length: frequent words get the short strings, as in natural language.
    return sorted(words, key=len)


def _stationary(t: np.ndarray) -> np.ndarray:
    """pi with pi T = pi, sum pi = 1 (unique: the chain is irreducible by construction)."""
    c = len(t)
    a = t.T - np.eye(c)
    a[-1, :] = 1.0  # replace one (redundant) balance equation by the normalisation
    b = np.zeros(c)
    b[-1] = 1.0
    pi = np.linalg.solve(a, b)
    pi = np.clip(pi, 0.0, None)
    return pi / pi.sum()


def _build_language(vocab_size: int, n_classes: int, successors: int, zipf: float, seed: int) -> SyntheticLanguage:
    rng = np.random.default_rng([seed, 0])  # stream 0: the language; streams 1..3: the splits

    # Transitions: a random cycle through all classes makes the chain irreducible (one stationary
    # distribution); the other successors - 1 next classes are random, with random probabilities.
    order = rng.permutation(n_classes)
    cycle_next = np.empty(n_classes, dtype=np.int64)
    cycle_next[order] = np.roll(order, -1)
    t = np.zeros((n_classes, n_classes))
    for c in range(n_classes):
        others = np.setdiff1d(np.arange(n_classes), [cycle_next[c]])
        succ = np.concatenate([[cycle_next[c]], rng.choice(others, size=successors - 1, replace=False)])
        t[c, succ] = rng.dirichlet(np.ones(successors))
    pi = _stationary(t)

    # Words over classes: every class gets one word, the rest are spread at random.
    slot_class = np.concatenate([np.arange(n_classes), rng.integers(n_classes, size=vocab_size - n_classes)])
    slot_rank = np.zeros(vocab_size, dtype=np.int64)  # 1-based Zipf rank within the class
    slot_p = np.zeros(vocab_size)
    for c in range(n_classes):
        at = np.flatnonzero(slot_class == c)
        ranks = np.arange(1, len(at) + 1)
        slot_rank[at] = ranks
        slot_p[at] = ranks ** -zipf / np.sum(ranks ** -zipf)

    # Word ids ordered by unigram probability pi_c * p(w | c), most frequent first.
    by_freq = np.lexsort((slot_rank, slot_class, -pi[slot_class] * slot_p))
    return SyntheticLanguage(
        words=_pseudo_words(vocab_size, rng),
        word_class=slot_class[by_freq],
        emission=slot_p[by_freq],
        transitions=t,
        stationary=pi,
    )


@functools.lru_cache(maxsize=8)
def _cached_language(key: tuple) -> SyntheticLanguage:
    return _build_language(*key)


def synthetic_language(scfg: SyntheticConfig) -> SyntheticLanguage:
    """The language a SyntheticConfig describes (deterministic for its seed, cached)."""
    return _cached_language((scfg.vocab_size, scfg.n_classes, scfg.successors, float(scfg.zipf), scfg.seed))


def synthetic_entropy_rate(scfg: SyntheticConfig) -> float:
    """The exact entropy rate of `builtin:synthetic`, in nats per word."""
    return synthetic_language(scfg).entropy_rate()


def sample_synthetic(scfg: SyntheticConfig, n: int, seed: int = 12345) -> tuple[np.ndarray, np.ndarray]:
    """A sample of n word ids and the true log p(w_t | w_{t-1}) of its words 1..n-1, for checks."""
    lang = synthetic_language(scfg)
    ids = lang.sample(n, np.random.default_rng([scfg.seed, seed]))
    return ids, lang.log_probs(ids)


def synthetic_splits(scfg: SyntheticConfig) -> dict[str, str]:
    """One document per split, as lines of WORDS_PER_LINE words. Each split has its own random
    stream, so changing train_tokens leaves validation and test unchanged."""
    lang = synthetic_language(scfg)
    vocab = np.array(lang.words, dtype=object)
    sizes = {"train": scfg.train_tokens, "validation": scfg.validation_tokens, "test": scfg.test_tokens}
    out = {}
    for i, split in enumerate(SPLITS, start=1):
        words = vocab[lang.sample(sizes[split], np.random.default_rng([scfg.seed, i]))].tolist()
        out[split] = "\n".join(" ".join(words[j:j + WORDS_PER_LINE]) for j in range(0, len(words), WORDS_PER_LINE))
    return out


UNK, EOT = -1, -2  # codes of a FloorStream besides word ids (>= 0)


@dataclass
class FloorStream:
    """One split as the floor sees it (prepared_floor builds it from the split's tokens)."""

    codes: np.ndarray  # word id, UNK or EOT: one per token (per_token) or one per word of the decoded text
    per_token: bool  # True: codes[i] is token i (a word tokenizer); False: the words of the decoded tokens,
    #                  less a last word that a token limit may have cut (the builder leaves it out)
    n_tokens: int  # tokens of the split; the model scores all but the first
    n_bytes: int  # as SplitData.n_bytes
    n_words: int  # as SplitData.n_words (a separator counts as a word)


def _eot_determined(codes: np.ndarray) -> bool:
    """Whether every end-of-text sits where the generator's layout puts it: after documents of one
    length L (the last ended one may be shorter, the split's own end), so it costs nothing."""
    at = np.flatnonzero(codes == EOT)
    if len(at) == 0:
        return True
    lens = np.diff(np.concatenate([[-1], at])) - 1  # words of each document an EOT ends
    tail = len(codes) - 1 - int(at[-1])  # words after the last EOT (a document cut by a limit)
    full = lens[0]
    return bool((lens[:-1] == full).all() and lens[-1] <= full and (tail == 0 or (lens[-1] == full and tail <= full)))


def split_floor(lang: SyntheticLanguage, s: FloorStream, unk_words: np.ndarray | None = None) -> dict | None:
    """The true model's loss on one split, in the units of the model's own evaluation.

    A word tokenizer (per_token): the sum of -log P(token_t | tokens_<t) over the targets the model
    is scored on (tokens 1..n-1; token 0 is context, its class drawn from pi), divided by their
    count n-1. End-of-text tokens cost 0: the generator puts them at fixed places (after every
    document of the same length, and at the split's end); they do not break the class chain,
    as the split is one sample of the chain. With UNKs this is the best loss achievable on the
    stream the model sees (stream_nll's forward pass). Other tokenizers (decoded words): a
    deterministic tokenizer gives the token sequence the probability of its text, so the total
    is the words' NLL, over the same n-1 scored tokens; the first word (partly unscored) and a
    last word cut by a limit are left out, which can only lower it. None where the EOTs are not
    where the generator puts them (their cost would need a model of document lengths)."""
    codes = np.asarray(s.codes, dtype=np.int64)
    eot = codes == EOT
    if not _eot_determined(codes) or s.n_tokens < 2:
        return None
    nll = np.zeros(len(codes))
    nll[~eot] = lang.stream_nll(codes[~eot], unk_words)
    if s.per_token:
        total, unk = float(nll[1:].sum()), int(np.count_nonzero(codes[1:] == UNK))
    else:
        total, unk = float(nll[~eot][1:].sum()), 0
    n = s.n_tokens - 1
    share = n / s.n_tokens  # bytes and words apportioned to the scored tokens, as evaluate.summarize_nll does
    mean = total / n
    return {"label": "best achievable" if unk else "split floor", "tokens": n, "nats_per_token": mean,
            "perplexity": perplexity(mean), "bits_per_byte": bits_per_byte(total, s.n_bytes * share),
            "word_perplexity": perplexity(total / (s.n_words * share)) if s.n_words else None,
            "unk_tokens": unk, "per_token": s.per_token}


def synthetic_floor(scfg: SyntheticConfig, split_words: dict[str, int], split_bytes: dict[str, int],
                    streams: dict[str, FloorStream] | None = None, unk_words: np.ndarray | None = None) -> dict:
    """The language's expected entropy rate, per word and per byte of each split (the top-level
    keys), and, given the splits' streams, each split's own floor (split_floor) under "splits".

    split_words counts the words of each split without document separators; split_bytes is the
    split's UTF-8 size with one byte per separator (as bits per byte is reported everywhere)."""
    t0 = time.perf_counter()
    lang = synthetic_language(scfg)
    h = lang.entropy_rate()
    out: dict = {
        "nats_per_word": h,
        "perplexity_per_word": perplexity(h),
        "bits_per_byte": {s: bits_per_byte(h * split_words[s], split_bytes[s]) for s in split_words if split_bytes[s]},
        "note": ("these are the language's expected entropy rate per word (an average over endless text, "
                 "not a bound on a split); each split's own floor, per token, is under 'splits'"),
    }
    if streams is not None:
        found = {name: split_floor(lang, st, unk_words) for name, st in streams.items()}
        out["splits"] = {name: f for name, f in found.items() if f is not None}
        out["with_unk"] = any(f["unk_tokens"] for f in out["splits"].values())
        out["unk_words"] = int(np.count_nonzero(unk_words)) if unk_words is not None else 0
        out["seconds"] = round(time.perf_counter() - t0, 4)
    return out


# --------------------------------------------------------------------------------------------
# The floor of prepared splits: their tokens read back as the language's words


def _word_streams(lang: SyntheticLanguage, splits: dict[str, SplitData],
                  tok: Tokenizer) -> tuple[dict[str, FloorStream], np.ndarray]:
    """A word tokenizer's splits, token for token, as language words, UNK and EOT; and the [V] mask
    of the language's words that the tokenizer maps to <unk>."""
    ids = np.asarray(tok.encode_batch([" ".join(lang.words)])[0], dtype=np.int64)
    if len(ids) != len(lang.words):
        return {}, np.zeros(len(lang.words), dtype=bool)
    unk_words = ids == tok.unk_id if tok.unk_id is not None else np.zeros(len(ids), dtype=bool)
    code_of = np.full(max(tok.vocab_size, int(ids.max()) + 1), -3, dtype=np.int64)  # -3: no word of the language
    code_of[ids[~unk_words]] = np.flatnonzero(~unk_words)
    if tok.unk_id is not None:
        code_of[tok.unk_id] = UNK
    code_of[tok.eot_id] = EOT
    streams = {}
    for name, s in splits.items():
        codes = code_of[np.asarray(s.tokens, dtype=np.int64)]
        if not (codes == -3).any():
            streams[name] = FloorStream(codes, True, len(s.tokens), s.n_bytes, s.n_words)
    return streams, unk_words


def _text_stream(lang: SyntheticLanguage, s: SplitData, tok: Tokenizer) -> FloorStream | None:
    """Any other tokenizer's split as the words of its decoded documents, EOT after each ended one."""
    tokens = np.asarray(s.tokens)
    if tok.unk_id is not None and (tokens == tok.unk_id).any():
        return None  # a character tokenizer's <unk> breaks a word apart: no exact floor
    index = {w: i for i, w in enumerate(lang.words)}
    ends = np.flatnonzero(tokens == tok.eot_id)
    starts = np.concatenate([[0], ends + 1])
    cut = len(tokens) > 0 and int(tokens[-1]) != tok.eot_id
    codes: list[int] = []
    for i, a in enumerate(starts):
        b = ends[i] if i < len(ends) else len(tokens)
        piece = tokens[a:b]
        text = piece.astype(np.uint8).tobytes().decode("utf-8", "replace") if tok.kind == "byte" else tok.decode(piece)
        words = text.split()
        if i == len(ends) and cut:
            words = words[:-1]  # perhaps partial: left out
        if any(w not in index for w in words):
            return None
        codes += [index[w] for w in words] + ([EOT] if i < len(ends) else [])
    return FloorStream(np.asarray(codes, dtype=np.int64), False, len(tokens), s.n_bytes, s.n_words)


def prepared_floor(d: DataConfig, splits: dict[str, SplitData], tok: Tokenizer) -> dict | None:
    """builtin:synthetic's expected entropy rate, and the own floor of validation and test on the
    tokens the model sees (synthetic_floor); None for any other corpus. `splits`: prepare_data's
    SplitData by name (tokens, n_bytes, n_words), `tok` the Tokenizer that made them (duck-typed:
    data/ imports this module, not the other way round)."""
    if d.path.strip() != "builtin:synthetic":
        return None
    t0 = time.perf_counter()
    lang = synthetic_language(d.synthetic)
    scored = {n: s for n, s in splits.items() if n != "train"}  # the splits a model is evaluated on: the
    #   floor of train would cost time in proportion to it at every prepare, for a number no report shows
    if tok.kind == "word":
        streams, unk_words = _word_streams(lang, scored, tok)
    else:
        found = {name: _text_stream(lang, s, tok) for name, s in scored.items()}
        streams, unk_words = {n: f for n, f in found.items() if f is not None}, None
    n_sep = {n: int(np.count_nonzero(np.asarray(s.tokens) == tok.eot_id)) for n, s in splits.items()}
    floor = synthetic_floor(d.synthetic, {n: s.n_words - n_sep[n] for n, s in splits.items()},
                            {n: s.n_bytes for n, s in splits.items()}, streams, unk_words)
    floor["seconds"] = round(time.perf_counter() - t0, 4)  # mapping the tokens to words and the floor itself
    return floor


# --------------------------------------------------------------------------------------------
# builtin:pydoc


def _pydoc_topics() -> dict[str, str]:
    from pydoc_data.topics import topics

    return topics


PYDOC_VERSION = 2  # the splitting rule; bumped whenever pydoc_splits changes (v2: duplicates removed)


def pydoc_fingerprint() -> str:
    """Changes when the Python version ships different documentation text, or the split rule changes."""
    h = hashlib.sha256(f"pydoc-v{PYDOC_VERSION}\0".encode())
    for name, text in sorted(_pydoc_topics().items()):
        h.update(name.encode() + b"\0" + text.encode() + b"\0")
    return h.hexdigest()[:16]


def pydoc_splits() -> dict[str, list[str]]:
    """The distinct paragraphs of every topic (in topic-name order) are the documents; of every 20,
    the 10th goes to validation and the 20th to test (90/5/5), so each split covers all topics."""
    paragraphs = [p.strip("\n") for _, text in sorted(_pydoc_topics().items())
                  for p in re.split(r"\n[ \t]*\n", text) if p.strip()]
    # The documentation repeats paragraphs ("Changed in version 3.7: ...", operator tables): keep
    # the first of each, or validation and test would hold text seen word for word in training.
    paragraphs = list(dict.fromkeys(paragraphs))
    out: dict[str, list[str]] = {s: [] for s in SPLITS}
    for i, p in enumerate(paragraphs):
        out["validation" if i % 20 == 9 else "test" if i % 20 == 19 else "train"].append(p)
    return out


def builtin_origins(path: str) -> dict[str, str]:
    """Where each split of a built-in corpus comes from, as `tiedlm data`'s "from" column shows it."""
    if path == "builtin:shakespeare":
        lines, ranges = _shakespeare_layout()
        return {split: f"built in: lines {a + 1:,}-{b:,} of {len(lines):,} (contiguous)"
                for split, (a, b) in ranges.items()}
    return {s: "built in" for s in SPLITS}


# --------------------------------------------------------------------------------------------
# builtin:shakespeare

SHAKESPEARE_FILE = Path(__file__).parent / "corpora" / "tinyshakespeare.txt.gz"
# SHA-256 of the text inside: Karpathy's input.txt (char-rnn), 1,115,394 bytes, 40,000 lines
SHAKESPEARE_SHA256 = "86c4e6aa9db7c042ec79f339dcb96d42b0075e16b8fc2e86bf0ca57e2dc565ed"
SHAKESPEARE_VERSION = 1  # the splitting rule; bump whenever shakespeare_splits changes
# train ends at the first speech boundary at or after 90% of the lines, validation at or after 95%
SHAKESPEARE_CUTS = (0.90, 0.95)


def shakespeare_text() -> str:
    """The bundled text, verified: a file that is missing, unreadable or not byte for byte the
    corpus tiedlm shipped is a DataError (a damaged or edited install)."""
    path = SHAKESPEARE_FILE
    try:
        st = path.stat()
        return _verified_text(str(path), st.st_size, st.st_mtime_ns)
    except OSError as exc:
        why = "is missing" if isinstance(exc, FileNotFoundError) else f"cannot be read ({exc.strerror or exc})"
        raise DataError(f"the bundled corpus {path} {why} — reinstall tiedlm "
                        "(pip install --force-reinstall --no-deps tiedlm)") from None


@functools.lru_cache(maxsize=2)
def _verified_text(path: str, size: int, mtime_ns: int) -> str:  # size and mtime: re-read a changed file
    fix = "reinstall tiedlm (pip install --force-reinstall --no-deps tiedlm)"
    try:
        raw = gzip.decompress(Path(path).read_bytes())
    except (EOFError, gzip.BadGzipFile, zlib.error) as exc:
        raise DataError(f"the bundled corpus {path} is damaged ({exc}) — {fix}") from None
    digest = hashlib.sha256(raw).hexdigest()
    if digest != SHAKESPEARE_SHA256:
        raise DataError(f"the bundled corpus {path} is not the text tiedlm shipped (SHA-256 {digest[:16]}..., "
                        f"expected {SHAKESPEARE_SHA256[:16]}...) — {fix}")
    return raw.decode("utf-8")


def _boundary(lines: list[str], i: int) -> int:
    """The first line at or after i that is blank (between two speeches), or the end."""
    while i < len(lines) and lines[i].strip():
        i += 1
    return i


@functools.lru_cache(maxsize=2)
def _layout_of(text: str) -> tuple[list[str], dict[str, tuple[int, int]]]:
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()  # the file ends with a newline
    n = len(lines)
    cuts = [_boundary(lines, round(f * n)) for f in SHAKESPEARE_CUTS]
    bounds = [0, *cuts, n]
    return lines, {split: (a, b) for split, a, b in zip(SPLITS, bounds, bounds[1:])}


def _shakespeare_layout() -> tuple[list[str], dict[str, tuple[int, int]]]:
    """The lines of the text and each split's [start, end) line range."""
    return _layout_of(shakespeare_text())


def shakespeare_fingerprint() -> dict:
    """Changes when the shipped text or the splitting rule does (the text is checked when read)."""
    return {"builtin": "shakespeare", "sha256": SHAKESPEARE_SHA256, "version": SHAKESPEARE_VERSION}


def shakespeare_splits() -> dict[str, list[str]]:
    """Contiguous blocks of lines, in text order: train from the start to the first blank line at
    or after 90% of the lines, validation from there to the first blank line at or after 95%, test
    the rest. No speech straddles two splits. The documents of a split are its speeches (runs of
    non-blank lines: the speaker's name and what they say, line breaks kept); the blank lines
    between them become the end-of-text token. A random split by line would leak context: the
    neighbouring lines of a test line would be in training."""
    lines, ranges = _shakespeare_layout()
    out: dict[str, list[str]] = {}
    for split, (a, b) in ranges.items():
        speeches, current = [], []
        for line in lines[a:b]:
            if line.strip():
                current.append(line)
            elif current:
                speeches.append("\n".join(current))
                current = []
        if current:
            speeches.append("\n".join(current))
        out[split] = speeches
    return out
