"""tiedlm.data.tokenizers: the five kinds, what they are trained on, saving and loading, and the
vocabulary the model gets."""

import json

import numpy as np
import pytest

from tiedlm import data
from tiedlm.errors import ConfigError, DataError

from .test_data import DOCS, cfg_for, prepare, raises, write_corpus

SAMPLE = "Hello, wörld! Ünïcode ✓ and  double  spaces,\ttabs\nand a new line. 123 + 456 = 579?"


@pytest.mark.parametrize("kind", ["byte", "char", "bpe", "word"])
def test_tokenizers_round_trip_and_save(tmp_path, kind):
    path = tmp_path / "t.txt"
    path.write_text("\n".join([SAMPLE.replace("\n", " ")] * 5 + DOCS), encoding="utf-8")
    p = prepare("data.path=text", f"data.data_files={path}", f"tokenizer.kind={kind}", "tokenizer.vocab_size=300")
    tok = p.tokenizer
    for text in DOCS[:5] + [SAMPLE.replace("\n", " ")]:
        ids = tok.encode(text)
        assert all(0 <= i < tok.vocab_size for i in ids) and tok.eot_id not in ids
        if kind == "word":  # up to <unk>, with whitespace normalised
            words = [w if tok.encode(w)[0] != tok.unk_id else "<unk>" for w in text.split()]
            assert tok.decode(ids) == " ".join(words)
        else:
            assert tok.decode(ids) == text
    assert p.vocab_size == tok.vocab_size <= 300
    saved = tmp_path / "saved"
    saved.mkdir()
    tok.save(saved)
    assert all(f.name in ("tokenizer.json", "tiedlm_tokenizer.json") for f in saved.iterdir())
    back = data.load_tokenizer(saved)
    assert (back.kind, back.vocab_size, back.eot_id, back.unk_id) == (tok.kind, tok.vocab_size, tok.eot_id, tok.unk_id)
    assert back.encode(SAMPLE) == tok.encode(SAMPLE)


def test_word_tokenizer_vocabulary_and_oov(tmp_path):
    path = tmp_path / "w.txt"
    path.write_text("\n".join(["a a a a b b b c c d <unk>"] * 30 + ["zzz yyy"] * 3), encoding="utf-8")
    p = prepare("data.path=text", f"data.data_files={path}", "tokenizer.kind=word", "tokenizer.vocab_size=5",
                "data.validation_fraction=0.1", "data.test_fraction=0.0")
    tok = p.tokenizer
    assert tok.vocab_size == 5 and tok.unk_id == 0 and tok.eot_id == 1  # <unk>, <eot>, a, b, c
    assert tok.encode("a b c d <unk> zzz") == [2, 3, 4, 0, 0, 0]
    train = p.splits["train"]
    n_words = train.n_words - train.n_docs  # the separators count as words too (PTB <eos>)
    unk = int(np.count_nonzero(np.asarray(train.tokens) == tok.unk_id))
    assert train.oov_rate == pytest.approx(unk / n_words)


def test_tokenizer_is_trained_on_train_only(tmp_path):
    (tmp_path / "train.txt").write_text("\n".join(["alpha beta"] * 20), encoding="utf-8")
    (tmp_path / "valid.txt").write_text("\n".join(["gamma delta"] * 20), encoding="utf-8")
    files = json.dumps({"train": str(tmp_path / "train.txt"), "validation": str(tmp_path / "valid.txt")})
    p = prepare("data.path=text", f"data.data_files={files}", "tokenizer.kind=word", "data.test_fraction=0")
    assert p.vocab_size == 4  # <unk> <eot> alpha beta
    assert p.splits["validation"].oov_rate == 1.0


def test_bpe_vocab_is_the_real_size_padded_for_the_model(tmp_path):
    p = prepare("data.path=text", f"data.data_files={write_corpus(tmp_path)}", "tokenizer.kind=bpe",
                "tokenizer.vocab_size=100000", "tokenizer.pad_to_multiple=64")
    assert 257 < p.vocab_size < 100000  # a small corpus runs out of merges
    assert p.model_vocab_size % 64 == 0 and 0 <= p.model_vocab_size - p.vocab_size < 64
    assert p.train_counts.shape == (p.model_vocab_size,) and p.train_counts.dtype == np.int64
    assert p.train_counts.sum() == len(p.splits["train"].tokens)
    assert p.train_counts[p.tokenizer.eot_id] == p.splits["train"].n_docs
    assert p.info["tokenizer"]["padding"] == p.model_vocab_size - p.vocab_size


def _pretrained_file(tmp_path, specials=("<|endoftext|>",)):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=list(specials),
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(DOCS, trainer)
    path = tmp_path / "tok.json"
    tok.save(str(path))
    return path


def test_pretrained_tokenizer_and_its_errors(tmp_path):
    text_file = write_corpus(tmp_path)
    path = _pretrained_file(tmp_path, specials=("<s>", "</s>"))
    p = prepare("data.path=text", f"data.data_files={text_file}", "tokenizer.kind=pretrained", f"tokenizer.path={path}")
    tok = p.tokenizer
    assert tok.kind == "pretrained" and tok.eot_id == 1  # found "</s>"
    assert tok.decode(tok.encode(DOCS[3])) == DOCS[3]
    assert texts_of_pretrained(p) == sorted(DOCS)

    with raises(ConfigError, match=r"tokenizer.path .*missing.json does not exist"):
        prepare("data.path=builtin:pydoc", "tokenizer.kind=pretrained", f"tokenizer.path={tmp_path / 'missing.json'}")
    bad = tmp_path / "bad.json"
    bad.write_text("{not json", encoding="utf-8")
    with raises(ConfigError, match="cannot read tokenizer.path"):
        prepare("data.path=builtin:pydoc", "tokenizer.kind=pretrained", f"tokenizer.path={bad}")
    (tmp_path / "other").mkdir()
    no_eot = _pretrained_file(tmp_path / "other", specials=("<pad>",))
    with raises(ConfigError, match="no end-of-text token.*tokenizer.eot_token"):
        prepare("data.path=builtin:pydoc", "tokenizer.kind=pretrained", f"tokenizer.path={no_eot}")
    p = prepare("data.path=text", f"data.data_files={text_file}", "tokenizer.kind=pretrained",
                f"tokenizer.path={no_eot}", "tokenizer.eot_token=<pad>")
    assert p.tokenizer.eot_id == 0


def texts_of_pretrained(p):
    eot = p.tokenizer.decode([p.tokenizer.eot_id])
    docs = []
    for s in p.splits.values():
        docs += p.tokenizer.decode(np.asarray(s.tokens)).split(eot)[:-1]
    return sorted(docs)


def test_a_folder_without_a_tokenizer_says_to_prepare_again(tmp_path):
    with raises(DataError, match="holds no tiedlm tokenizer"):
        data.load_tokenizer(tmp_path)


def test_vocab_size_too_small_for_the_kind():
    with raises(ConfigError, match=r"too small for tokenizer.kind=byte: it needs at least 257"):
        cfg_for("tokenizer.kind=byte", "tokenizer.vocab_size=256")
    with raises(ConfigError, match=r"tokenizer.kind=bpe: it needs at least 257"):
        cfg_for("tokenizer.kind=bpe", "tokenizer.vocab_size=100")
    cfg_for("tokenizer.kind=word", "tokenizer.vocab_size=3")


def test_add_tokens_beyond_what_the_text_has_says_how_many_were_added(tmp_path, capfd):
    """tokenizer.add_tokens: N takes the N most frequent pieces the tokenizer splits; a text with
    fewer gives fewer, and the tokenizer's making says so in one warning line with the number added
    (it was silent), once: the runs that read it from the token cache do not say it again."""
    import torch

    from tiedlm.data.tokenizers import fewer_added
    from tiedlm.train.preflight import preflight

    text_file = write_corpus(tmp_path)
    path = _pretrained_file(tmp_path)
    sets = ("data.path=text", f"data.data_files={text_file}", "tokenizer.kind=pretrained", f"tokenizer.path={path}")
    capfd.readouterr()
    p = prepare(*sets, "tokenizer.add_tokens=100000")
    made = capfd.readouterr().err
    added = len(p.tokenizer.added)
    assert 0 < added < 100_000
    said = fewer_added(cfg_for(*sets, "tokenizer.add_tokens=100000").tokenizer, p.tokenizer)
    assert said.startswith(f"tokenizer.add_tokens: 100,000 added {added:,} new tokens, every piece of the training "
                           "text") and said.endswith(f"set tokenizer.add_tokens: {added} to ask for what there is")
    assert fewer_added(cfg_for(*sets, f"tokenizer.add_tokens={added}").tokenizer, p.tokenizer) is None
    assert made.count(f"warning: {said}\n") == 1
    preflight(cfg_for(*sets, "tokenizer.add_tokens=100000", "model.n_embd=16", "model.n_head=2", "model.n_layer=1"),
              tmp_path / "run", torch.device("cpu"), fresh=True, progress=False)
    assert "add_tokens" not in capfd.readouterr().err  # the run reads the tokenizer made above
