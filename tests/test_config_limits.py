"""What a config read refuses before it can crash or hang: YAML nested too deeply (flow, block or
through aliases), a base: chain too deep or too wide, a path that is not a regular file (a named
pipe, a device, a folder, a loop of links) or is too large; and model.tie_mode lowrank without its
rank. Each is a ConfigError of one line."""

import os
import signal

import pytest

from tiedlm.config import layers, yamlsafe
from tiedlm import runs
from tiedlm.config import load_config
from tiedlm.errors import ConfigError, DamagedRunError
from tiedlm.config.yamlsafe import YAML_DEPTH_LIMIT, load_yaml, read_yaml_text


@pytest.fixture
def deadline():
    """A read that blocks (a named pipe opened for reading waits for a writer) fails the test
    after a few seconds instead of hanging the suite."""
    def expire(*_):
        raise TimeoutError("the read blocked")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.alarm(10)
    yield
    signal.alarm(0)
    signal.signal(signal.SIGALRM, previous)


def _one_line(exc_info) -> str:
    msg = str(exc_info.value)
    assert "\n" not in msg and msg
    return msg


# --------------------------------------------------------------------------------------------
# Nesting depth


def _alias_chain(n: int) -> str:
    """n anchors, each a list holding an alias of the one before: nested n deep, composed flat."""
    return "\n".join(["a0: &a0 [1]"] + [f"a{i}: &a{i} [*a{i - 1}]" for i in range(1, n)]) + "\n"


@pytest.mark.parametrize("text", [
    "[" * 20_000 + "]" * 20_000,
    "a: " + "{b: " * 20_000 + "1" + "}" * 20_000,
    "".join(" " * i + f"k{i}:\n" for i in range(3_000)) + " " * 3_000 + "1\n",  # block mappings
    "- " * 3_000 + "1\n",  # block sequences
    "? " + "[" * 5_000 + "]" * 5_000 + "\n: 1\n",  # a key
    _alias_chain(5_000),  # deep through aliases, each anchor composed at depth 2
    _alias_chain(5_000) + "? *a4999\n: 1\n",  # and that as a key, which PyYAML builds by recursion
], ids=["flow-lists", "flow-maps", "block-maps", "block-lists", "key", "aliases", "alias-key"])
def test_yaml_nested_too_deeply_is_refused_in_one_line(text):
    with pytest.raises(ConfigError, match=f"nested more than {YAML_DEPTH_LIMIT} levels deep") as info:
        load_yaml(text, "c.yaml")
    assert _one_line(info).startswith("c.yaml")


def test_yaml_at_the_depth_limit_is_read():
    assert load_yaml("[" * YAML_DEPTH_LIMIT + "]" * YAML_DEPTH_LIMIT, "x") is not None
    assert load_yaml(_alias_chain(YAML_DEPTH_LIMIT - 1), "x")  # the mapping and the chain: the limit
    with pytest.raises(ConfigError, match="nested"):
        load_yaml("[" * (YAML_DEPTH_LIMIT + 1) + "]" * (YAML_DEPTH_LIMIT + 1), "x")


def test_a_deep_config_file_and_set_value_are_refused(tmp_path):
    f = tmp_path / "deep.yaml"
    f.write_text("model: " + "[" * 20_000 + "]" * 20_000 + "\n")
    with pytest.raises(ConfigError, match=r"deep.yaml line 1: the YAML is nested more than 50 levels"):
        load_config(f)
    with pytest.raises(ConfigError, match=r"--set model.n_embd line 1: the YAML is nested"):
        load_config(None, ["model.n_embd=" + "[" * 20_000])


def _chain(folder, n, bases_per_file=1):
    for i in range(n):
        bases = ", ".join([f"c{i + 1}.yaml"] * bases_per_file)
        (folder / f"c{i}.yaml").write_text(f"base: [{bases}]\n" if i < n - 1 else "train: {max_steps: 3}\n")
    return folder / "c0.yaml"


def test_a_base_chain_too_deep_is_refused(tmp_path):
    assert load_config(_chain(tmp_path, layers.BASE_DEPTH_LIMIT)).train.max_steps == 3
    limit = layers.BASE_DEPTH_LIMIT
    with pytest.raises(ConfigError, match=f"c0.yaml: its base: files nest more than {limit} deep") as info:
        load_config(_chain(tmp_path, 1_000))
    assert "merge some of them" in _one_line(info)


def test_base_files_that_name_their_base_twice_are_bounded(tmp_path):
    """Each file naming its base twice reads 2^depth files: refused at BASE_FILES_LIMIT."""
    with pytest.raises(ConfigError, match=f"more than {layers.BASE_FILES_LIMIT} files"):
        load_config(_chain(tmp_path, 12, bases_per_file=2))
    assert load_config(_chain(tmp_path, 5, bases_per_file=2)).train.max_steps == 3  # 31 files


# --------------------------------------------------------------------------------------------
# What is not a regular file, and what is too large


@pytest.mark.parametrize("kind", ["fifo", "device", "folder", "link-loop"])
def test_a_config_that_is_not_a_regular_file_is_refused_before_reading(tmp_path, deadline, kind):
    path = tmp_path / "c.yaml"
    if kind == "fifo":
        os.mkfifo(path)  # opening it for reading would wait for a writer
    elif kind == "device":
        path = "/dev/null"  # a device reads as empty here; /dev/zero and /dev/urandom never end
    elif kind == "folder":
        path.mkdir()
    else:
        os.symlink(tmp_path / "other.yaml", path)
        os.symlink(path, tmp_path / "other.yaml")
    expected = {"fifo": "is a named pipe, not a regular file", "device": "is a device, not a regular file",
                "folder": "is a folder, not a regular file", "link-loop": "cannot read config file"}[kind]
    with pytest.raises(ConfigError, match=expected) as info:
        load_config(path)
    assert _one_line(info).startswith(f"config file {path}" if kind != "link-loop" else "cannot read")


def test_a_base_that_is_not_a_regular_file_is_refused(tmp_path, deadline):
    os.mkfifo(tmp_path / "pipe.yaml")
    (tmp_path / "c.yaml").write_text("base: pipe.yaml\n")
    with pytest.raises(ConfigError, match=r"config file .*pipe.yaml is a named pipe"):
        load_config(tmp_path / "c.yaml")
    (tmp_path / "c.yaml").write_text("base: /dev/null\n")
    with pytest.raises(ConfigError, match=r"config file /dev/null is a device"):
        load_config(tmp_path / "c.yaml")


def test_a_config_too_large_is_refused_without_reading_it(tmp_path, monkeypatch):
    big = tmp_path / "big.yaml"
    with open(big, "wb") as f:  # sparse: the size is there, the bytes are not
        f.truncate(yamlsafe.YAML_BYTES_LIMIT + 1)
    with pytest.raises(ConfigError, match=f"big.yaml is larger than {yamlsafe.YAML_BYTES_LIMIT:,} bytes"):
        load_config(big)
    (tmp_path / "child.yaml").write_text("base: big.yaml\n")
    with pytest.raises(ConfigError, match="big.yaml is larger than"):
        load_config(tmp_path / "child.yaml")
    monkeypatch.setattr(yamlsafe, "YAML_BYTES_LIMIT", 64)
    small = tmp_path / "small.yaml"
    small.write_text("train: {max_steps: 3}\n" + "#" * (64 - 22))  # exactly at the limit
    assert load_config(small).train.max_steps == 3
    small.write_text(small.read_text() + "#")
    with pytest.raises(ConfigError, match="larger than 64 bytes"):
        load_config(small)


def test_a_grid_file_that_is_a_pipe_a_device_or_too_large_is_refused_before_reading(tmp_path, deadline):
    from tiedlm.experiment.sweep import load_grid

    os.mkfifo(tmp_path / "grid.yaml")
    with pytest.raises(ConfigError, match=r"grid file .*grid.yaml is a named pipe, not a regular file"):
        load_grid(tmp_path / "grid.yaml")
    with pytest.raises(ConfigError, match=r"grid file /dev/null is a device"):
        load_grid("/dev/null")
    big = tmp_path / "big.yaml"
    with open(big, "wb") as f:
        f.truncate(yamlsafe.YAML_BYTES_LIMIT + 1)
    with pytest.raises(ConfigError, match=f"grid file .*big.yaml is larger than {yamlsafe.YAML_BYTES_LIMIT:,} bytes"):
        load_grid(big)
    with pytest.raises(ConfigError, match=r"grid file .*missing.yaml does not exist — check the path"):
        load_grid(tmp_path / "missing.yaml")


def test_a_file_that_reads_larger_than_its_size_is_refused(monkeypatch):
    """/proc files report size 0: only the bytes read tell, and no more than the limit is read."""
    if not os.path.exists("/proc/self/status"):
        pytest.skip("no /proc")
    monkeypatch.setattr(yamlsafe, "YAML_BYTES_LIMIT", 16)
    with pytest.raises(ConfigError, match="larger than 16 bytes"):
        read_yaml_text("/proc/self/status", "config file")


def test_a_config_not_utf8_is_one_line(tmp_path):
    f = tmp_path / "latin.yaml"
    f.write_bytes(b"name: caf\xe9\n")
    with pytest.raises(ConfigError, match=r"latin.yaml is not UTF-8 text \(byte 0xe9 at offset 9\)"):
        load_config(f)


def test_a_run_config_that_is_a_pipe_is_a_damaged_run(tmp_path, deadline):
    run = tmp_path / "run"
    run.mkdir()
    os.mkfifo(run / runs.CONFIG)
    with pytest.raises(DamagedRunError, match="is a named pipe, not a regular file .the run folder is damaged."):
        runs.read_config(run)


# --------------------------------------------------------------------------------------------
# model.tie_mode lowrank needs its rank

BUDGET = ["train.max_steps=1"]


def test_lowrank_without_a_rank_is_refused_with_the_fix(tmp_path):
    with pytest.raises(ConfigError, match=r"model.tie_mode lowrank needs its rank — set model.untie_rank: r, "
                                          r"from 1 to model.n_embd \(128\)"):
        load_config(None, [*BUDGET, "model.tie_mode=lowrank"])
    f = tmp_path / "c.yaml"
    f.write_text("train: {max_steps: 1}\nmodel:\n  tie_mode: lowrank\n")
    with pytest.raises(ConfigError, match="needs its rank"):
        load_config(f)
    # a rank dropped by a mode set in between is not silently back at 0
    f.write_text("train: {max_steps: 1}\nmodel:\n  tie_mode: lowrank\n  untie_rank: 8\n")
    with pytest.raises(ConfigError, match="needs its rank"):
        load_config(f, ["model.tie_mode=projection", "model.tie_mode=lowrank"])


def test_lowrank_with_a_rank_written_out_is_kept_rank_zero_too(tmp_path):
    assert load_config(None, [*BUDGET, "model.tie_mode=lowrank", "model.untie_rank=8"]).model.untie_rank == 8
    assert load_config(None, [*BUDGET, "model.tie_mode=lowrank", "model.untie_rank=0"]).model.untie_rank == 0  # = tied
    (tmp_path / "base.yaml").write_text("model:\n  untie_rank: 4\n  tie_mode: lowrank\n")
    (tmp_path / "c.yaml").write_text("base: base.yaml\ntrain: {max_steps: 1}\nmodel:\n  tie_mode: lowrank\n")
    assert load_config(tmp_path / "c.yaml").model.untie_rank == 4  # the base's rank counts
