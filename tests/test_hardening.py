"""Every config key against hostile values, through `tiedlm train --set key=value` as a user would
type it: a value that is not valid is refused by config validation with exit 2 and one line,
before data preparation and before anything is created; a value that is valid loads."""

import pytest
import yaml
from typer.testing import CliRunner

from tiedlm.cli import app
from tiedlm.config import ALL_KEYS, apply_overrides, load_config

from .conftest import TINY

runner = CliRunner()

# What a user types after `--set key=`, read as YAML like every override. `1e15` is a string to
# PyYAML (no dot) and becomes an integer for integer keys; `nan`/`inf` become floats for float keys.
KINDS = {
    "string": "abc",
    "mapping": "{a: 1}",
    "list": "[1, 2]",
    "bool": "true",
    "negative": "-1",
    "zero": "0",
    "huge": "1e15",
    "nan": "nan",
    "inf": "inf",
    "-inf": "-inf",
}

LEAF_KEYS = [k for k in ALL_KEYS if not any(other.startswith(k + ".") for other in ALL_KEYS)]

# Numbers written as text are strings (a split or config name may be `2019`), so every string key
# takes the number-like kinds as text; a mapping, a list or a bool is still refused.
_AS_TEXT = ("string", "negative", "zero", "huge", "nan", "inf", "-inf")

# The (key, kind) pairs that are legitimately valid on top of the tiny config. Each must load; they
# are not trained (a huge budget would train for days). Checked by hand once: the zero and huge
# values that are not budgets train the tiny model to the end.
VALID = {
    "name": ("string", "zero", "huge", "nan", "inf"),  # text names; "-1" and "-inf" start with '-'
    "seed": ("zero", "huge"),  # any seed below 2**64
    "data.path": _AS_TEXT,  # a path or hub id (does it exist? data preparation says, exit 1)
    "data.name": _AS_TEXT,
    "data.revision": _AS_TEXT,
    "data.text_column": _AS_TEXT,
    "data.train_split": _AS_TEXT,
    "data.validation_split": _AS_TEXT,
    "data.test_split": _AS_TEXT,
    "data.data_files": ("string", "huge", "nan", "inf", "-inf"),  # paths: only YAML strings, not -1 or 0
    "data.validation_fraction": ("zero",),  # no validation carved (the data has its own split)
    "data.test_fraction": ("zero",),
    "data.split_seed": ("zero", "huge"),
    "data.carve": (),  # random | contiguous: no hostile value is one
    "data.test_from": (),  # train | validation: no hostile value is one
    "data.max_train_tokens": ("huge",),  # a cap: more than there is keeps everything
    "data.max_eval_tokens": ("huge",),
    "data.synthetic.seed": ("zero", "huge"),
    "tokenizer.vocab_size": ("huge",),  # a cap: the model gets the tokenizer's real size
    "tokenizer.path": _AS_TEXT,  # only read for kind=pretrained
    "tokenizer.eot_token": _AS_TEXT,
    "tokenizer.max_train_bytes": ("huge",),  # a cap on the text that trains the tokenizer
    "model.dropout": ("zero",),
    "model.bias": ("bool",),
    "model.tie_embeddings": ("bool",),
    "model.lm_head_bias": ("bool",),
    "model.untie_rank": ("zero",),  # rank 0: exactly tied (a rank needs model.tie_mode: lowrank)
    "model.tie_strength": ("zero",),  # 0: no strength, the default (a strength needs model.tie_mode: soft or pull)
    "train.compile": ("bool",),
    "train.decay_embeddings": ("bool",),
    "train.threads": ("zero",),  # 0 keeps torch's default
    "train.max_tokens": ("huge",),  # budgets: long, not wrong
    "train.max_steps": ("huge",),
    "train.min_lr": ("zero",),
    "train.min_lr_ratio": ("zero",),  # the decay ends at 0; min_lr stays at its default, so no conflict
    "train.warmup_steps": ("zero", "huge"),  # no warmup; warmup past the end of training
    "train.warmup": ("zero",),  # a fraction of the steps: 0 is no warm-up
    "train.weight_decay": ("zero",),
    "train.beta1": ("zero",),
    "train.beta2": ("zero",),
    "train.grad_clip": ("zero", "huge"),  # 0 disables clipping; a huge bound never clips
    "train.eval_every": ("zero", "huge"),  # 0 disables; huge: only the final evaluation
    "train.checkpoint_every": ("zero", "huge"),  # 0: only the final checkpoint
    "train.log_every": ("huge",),
    "train.eval_tokens": ("huge",),  # a cap on the periodic validation slice
    "train.max_skipped": ("zero", "huge"),
    "train.keep_best": ("bool",),
    "train.early_stop_patience": ("zero", "huge"),  # 0 never stops; huge: never in practice
    "train.early_stop_min_delta": ("zero",),  # the default; any other value needs a patience
    "train.log_to": (),  # a list of known loggers ([tensorboard]): no hostile value is one
}

# Valid to the config, but a model or batch that no machine holds: the memory estimate in the
# training preflight (model.check_fits) refuses them (exit 2) before any folder is created. (A huge
# train.batch_size, train.grad_accum or model.block_size is refused by config validation before it:
# their product, the tokens per optimizer step, is capped by checks.TOKENS_PER_STEP_LIMIT.)
NEEDS_MEMORY_ESTIMATE = {
    ("model.n_layer", "huge"), ("model.n_embd", "huge"), ("eval.batch_size", "huge"),
}


def _cases():
    valid, refused = [], []
    for key in LEAF_KEYS:
        for kind in KINDS:
            if kind in VALID.get(key, ()):
                valid.append((key, kind))
            else:
                refused.append((key, kind))
    return valid, refused


VALID_CASES, REFUSED_CASES = _cases()


@pytest.fixture(scope="module")
def tiny_config(tmp_path_factory):
    path = tmp_path_factory.mktemp("config") / "tiny.yaml"
    path.write_text(yaml.safe_dump(apply_overrides({}, TINY)))
    return path


@pytest.fixture
def no_model(monkeypatch):
    """Building a model means the value got past every check: fail at once, never hang."""
    import tiedlm.model.blocks

    def refuse(*args, **kwargs):
        raise AssertionError("the model was built: the value should have been refused before")

    monkeypatch.setattr(tiedlm.model.blocks, "GPT", refuse)


def test_the_lists_name_real_keys_and_kinds():
    assert set(VALID) <= set(LEAF_KEYS)
    assert all(set(kinds) <= set(KINDS) for kinds in VALID.values())
    assert {k for k, _ in NEEDS_MEMORY_ESTIMATE} <= set(LEAF_KEYS)
    assert len(LEAF_KEYS) > 50 and "model" not in LEAF_KEYS and "data.synthetic.zipf" in LEAF_KEYS


@pytest.mark.parametrize("key, kind", REFUSED_CASES)
def test_an_invalid_value_is_one_line_exit_2_and_creates_nothing(key, kind, tiny_config, tmp_path, monkeypatch,
                                                                 no_model):
    import tiedlm.data

    if (key, kind) not in NEEDS_MEMORY_ESTIMATE:  # config validation must refuse it before the data
        def refuse(*args, **kwargs):
            raise AssertionError("data preparation was reached: config validation let the value through")

        monkeypatch.setattr(tiedlm.data, "prepare_data", refuse)
    out = tmp_path / "runs"
    r = runner.invoke(app, ["train", "--config", str(tiny_config), "--set", f"{key}={KINDS[kind]}",
                            "--out", str(out), "--quiet"])
    lines = r.stderr.strip().splitlines()
    assert r.exit_code == 2, f"{key}={KINDS[kind]}: exit {r.exit_code}: {r.output} {r.exception!r}"
    assert len(lines) == 1 and lines[0].startswith("tiedlm: error:"), r.stderr
    assert "Traceback" not in r.output
    assert not out.exists()


@pytest.mark.parametrize("key, kind", VALID_CASES)
def test_a_valid_value_loads(key, kind, tiny_config):
    builder = ["data.path=text"] if key == "data.data_files" else []  # files are read by builders, not builtin:
    load_config(tiny_config, [*builder, f"{key}={KINDS[kind]}"])
