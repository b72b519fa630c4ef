"""Built-in corpora that need no download: `builtin:synthetic` and `builtin:pydoc`.

`builtin:synthetic` is a class-based Markov language. Every word belongs to exactly one latent
class; the class sequence is a sparse Markov chain (each class has `successors` possible next
classes); within a class, words follow a Zipf law. Because a word determines its class,
p(w_t | w_<t) = T[c(w_{t-1}), c(w_t)] * p(w_t | c(w_t)), so the entropy rate is exact:

    H = sum_c pi_c H(T[c, :]) + sum_c pi_c H(W | c)        (nats per word, pi stationary)

and reports can show it as the floor no model can beat.

`builtin:pydoc` is real English that ships with every CPython: the documentation topics of
`pydoc_data.topics` (the text `help("assert")` prints), split by paragraph into train/validation/test.
"""

from __future__ import annotations

import functools
import hashlib
import math
import re
from dataclasses import dataclass

import numpy as np

from .checks import SPLITS
from .config import SyntheticConfig

# Bump when the generator changes, so cached token arrays of the old language are not reused.
SYNTHETIC_VERSION = 1
BUILTINS = ("synthetic", "pydoc")
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


def synthetic_floor(scfg: SyntheticConfig, split_words: dict[str, int], split_bytes: dict[str, int]) -> dict:
    """The floor a perfect model reaches: per word, and per byte for each split.

    split_words counts the words of each split without document separators; split_bytes is the
    split's UTF-8 size with one byte per separator (as bits per byte is reported everywhere)."""
    h = synthetic_entropy_rate(scfg)
    return {
        "nats_per_word": h,
        "perplexity_per_word": math.exp(h),
        "bits_per_byte": {s: h * split_words[s] / math.log(2) / split_bytes[s] for s in split_words if split_bytes[s]},
        "note": ("the floor is per word; it equals the per-token floor with a word tokenizer that covers "
                 "the whole vocabulary; line breaks and the end-of-text token are treated as free"),
    }


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
