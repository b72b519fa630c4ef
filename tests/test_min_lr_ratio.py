"""train.min_lr_ratio: the cosine decay ends at lr x ratio, so the schedule keeps its shape when lr
changes; one of min_lr / min_lr_ratio; older configs keep their hash."""

import math

import pytest

from tiedlm.config import effective_min_lr, from_dict, load_config, to_dict
from tiedlm.config.identity import ADDED_KEYS, config_hash
from tiedlm.errors import ConfigError
from tiedlm.train.step import lr_at

from .conftest import ROOT, TINY

BUDGET = ["train.max_steps=100", "train.warmup_steps=10"]


def schedule(*overrides, total=100):
    t = load_config(None, BUDGET + list(overrides)).train
    return [lr_at(step, total, t) for step in range(total + 1)]


def test_the_schedule_ends_at_lr_times_the_ratio():
    t = load_config(None, BUDGET + ["train.lr=0.002", "train.min_lr_ratio=0.1"]).train
    assert effective_min_lr(t) == pytest.approx(0.0002)
    # independent arithmetic: warmup (s + 1) / 10 x lr; then 0.0002 + 0.0009 x (1 + cos(pi x (s - 10) / 90))
    assert lr_at(0, 100, t) == pytest.approx(0.0002)
    assert lr_at(9, 100, t) == pytest.approx(0.002)
    assert lr_at(10, 100, t) == pytest.approx(0.002)  # the peak
    assert lr_at(55, 100, t) == pytest.approx(0.0011)  # half way down the cosine: (0.002 + 0.0002) / 2
    assert lr_at(40, 100, t) == pytest.approx(0.0002 + 0.0009 * (1 + math.cos(math.pi / 3)))
    assert lr_at(100, 100, t) == pytest.approx(0.0002)  # the end
    assert lr_at(500, 100, t) == pytest.approx(0.0002)  # and after it
    assert load_config(None, BUDGET + ["train.min_lr_ratio=0"]).train.min_lr_ratio == 0.0
    assert schedule("train.min_lr_ratio=0")[-1] == pytest.approx(0.0)
    assert schedule("train.min_lr_ratio=1")[10:] == pytest.approx([1e-3] * 91)  # constant after warmup


def test_without_the_ratio_min_lr_is_absolute_as_before():
    t = load_config(None, BUDGET + ["train.lr=0.002", "train.min_lr=0.0005"]).train
    assert t.min_lr_ratio is None and effective_min_lr(t) == 0.0005
    assert lr_at(100, 100, t) == pytest.approx(0.0005)
    assert lr_at(55, 100, t) == pytest.approx((0.002 + 0.0005) / 2)


def test_schedules_with_one_ratio_are_proportional_to_lr():
    a = schedule("train.lr=0.001", "train.min_lr_ratio=0.05")
    b = schedule("train.lr=0.004", "train.min_lr_ratio=0.05")
    assert [y / x for x, y in zip(a, b)] == pytest.approx([4.0] * len(a))
    # with an absolute min_lr the shape changes with lr: what the ratio is for
    c = schedule("train.lr=0.001", "train.min_lr=0.0001")
    d = schedule("train.lr=0.004", "train.min_lr=0.0001")
    assert d[-1] / c[-1] == pytest.approx(1.0) and d[10] / c[10] == pytest.approx(4.0)


@pytest.mark.parametrize("overrides, message", [
    (["train.min_lr=0.0003", "train.min_lr_ratio=0.1"],
     "train.min_lr (0.0003) and train.min_lr_ratio (0.1) both set where the cosine decay ends — give one of them "
     "(min_lr_ratio: a fraction of train.lr; min_lr: an absolute rate)"),
    (["train.min_lr=0", "train.min_lr_ratio=0.1"],
     "train.min_lr (0) and train.min_lr_ratio (0.1) both set where the cosine decay ends — give one of them "
     "(min_lr_ratio: a fraction of train.lr; min_lr: an absolute rate)"),
    (["train.min_lr_ratio=1.5"], "train.min_lr_ratio must be a fraction in [0, 1], got 1.5"),
    (["train.min_lr_ratio=-0.1"], "train.min_lr_ratio must be a fraction in [0, 1], got -0.1"),
    (["train.min_lr_ratio=nan"], "train.min_lr_ratio must be a finite number, got nan — nan and infinities are "
                                 "not allowed"),
    (["train.min_lr_ratio=abc"], "train.min_lr_ratio must be a number or null, got 'abc'"),
])
def test_refusals(overrides, message):
    with pytest.raises(ConfigError) as info:
        load_config(None, BUDGET + overrides)
    assert str(info.value) == message


def test_the_ratio_replaces_the_absolute_check():
    """min_lr (at its default, 1e-4) is not used with a ratio, so an lr below it is fine."""
    with pytest.raises(ConfigError, match="train.min_lr must be between 0 and train.lr"):
        load_config(None, BUDGET + ["train.lr=5e-5"])
    t = load_config(None, BUDGET + ["train.lr=5e-5", "train.min_lr_ratio=0.1"]).train
    assert effective_min_lr(t) == pytest.approx(5e-6)


# config_hash of these configs as tiedlm computed them before train.min_lr_ratio, data.carve and
# data.test_from existed (runs written then must keep their variant, resume and group with new ones)
HASHES_BEFORE = {"tiny": "ca3d71ffa96095dd", "configs/base.yaml": "cc27554e7d343c37",
                 "configs/shakespeare-bpe.yaml": "2a31a65f4618da50"}


@pytest.mark.parametrize("name", list(HASHES_BEFORE))
def test_older_configs_keep_their_hash(name):
    cfg = load_config(None, TINY) if name == "tiny" else load_config(ROOT / name)
    assert config_hash(cfg) == HASHES_BEFORE[name]
    old = to_dict(cfg)  # a config.yaml written before the keys existed
    del old["train"]["min_lr_ratio"], old["data"]["carve"], old["data"]["test_from"]
    assert config_hash(from_dict(old)) == HASHES_BEFORE[name]
    assert ADDED_KEYS["train.min_lr_ratio"] is None
    ratio = load_config(None, TINY + ["train.min_lr_ratio=0.1"])
    assert config_hash(ratio) != HASHES_BEFORE["tiny"]
