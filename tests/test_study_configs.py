"""The shipped study files load and validate: the tying map (hub and local files), its base
configs, and the rank dial; a tuned sweep's record (tuning.json) is refused when tiedlm did not
write it, and ignored by compare when it is damaged."""

from pathlib import Path

import pytest

from tiedlm.config import load_config
from tiedlm.errors import ConfigError
from tiedlm.experiment.sweep import expand, load_grid

CONFIGS = Path(__file__).resolve().parents[1] / "configs"


@pytest.mark.parametrize("name,path", [("study-tying-map.yaml", "wikitext"), ("study-tying-map-local.yaml", "text")])
def test_the_tying_map_study_loads_and_validates(name, path):
    grid = load_grid(CONFIGS / name)
    assert grid.grid == {"model.n_embd": [64, 128, 256], "data.train_fraction": [0.125, 0.25, 0.5, 1.0],
                         "model.tie_embeddings": [True, False]}
    assert grid.tune.axes == {"train.lr": [1e-3, 3e-3, 1e-2]} and grid.seeds == [0, 1, 2]
    grid.tune = None  # expand() lists the grid points (a tuned sweep decides its runs as it goes)
    runs = expand(grid)
    assert len(runs) == 3 * 4 * 2 * 3
    for r in runs:
        cfg = r.cfg  # resolved and validated
        assert cfg.data.path == path and cfg.train.keep_best and cfg.data.train_fraction in (0.125, 0.25, 0.5, 1.0)
        assert cfg.tokenizer.kind == "bpe" and cfg.train.min_lr_ratio == 0.1
    hub = load_config(CONFIGS / "wikitext2-map.yaml")
    assert (hub.data.path, hub.data.name) == ("wikitext", "wikitext-2-raw-v1")
    local = load_config(CONFIGS / "wikitext2-map-local.yaml")
    assert local.data.test_from == "validation" and local.data.carve == "contiguous"
    assert local.data.data_files["train"].endswith("wikitext-2-small/valid.txt")


def test_the_vocabulary_map_and_its_matched_rows_load_and_validate():
    grid = load_grid(CONFIGS / "study-vocab-map.yaml")
    assert grid.tune.axes == {"train.lr": [1e-3, 3e-3, 1e-2], "model.dropout": [0.0, 0.2]} and grid.seeds == [0, 1, 2]
    grid.tune = None
    runs = expand(grid)
    assert len(runs) == 4 * 3 * 2 * 3
    tokenizers = sorted({(r.cfg.tokenizer.kind, r.cfg.tokenizer.vocab_size) for r in runs})
    assert tokenizers == [("bpe", 512), ("bpe", 2048), ("bpe", 8192), ("word", 10000)]
    assert {r.cfg.data.train_fraction for r in runs} == {0.125, 0.5, 1.0}
    assert all(r.cfg.data.path == "text" and r.cfg.train.keep_best and r.cfg.model.n_embd == 128 for r in runs)
    match = load_config(CONFIGS / "study-vocab-match.yaml")
    assert (match.tokenizer.kind, match.tokenizer.vocab_size, match.data.train_fraction) == ("word", 10000, 1.0)
    from tiedlm.experiment.tuning_spec import read_tune_block

    assert read_tune_block(CONFIGS / "study-vocab-match.yaml").axes == {"train.lr": [1e-3, 3e-3, 1e-2],
                                                                        "model.dropout": [0.0, 0.2]}


def test_the_rank_dial_loads_with_each_mode():
    grid = load_grid(CONFIGS / "rank-dial.yaml")
    grid.tune = None
    modes = sorted({(r.cfg.model.tie_mode, r.cfg.model.untie_rank, r.cfg.model.tie_embeddings) for r in expand(grid)},
                   key=str)
    assert modes == sorted([(None, 0, True), ("lowrank", 8, True), ("lowrank", 32, True), ("lowrank", 128, True),
                            ("projection", 0, True), (None, 0, False)], key=str)


def test_a_foreign_tuning_record_is_refused_before_training_and_a_damaged_one_ignored(tmp_path):
    from tiedlm.compare.tuned import read_record
    from tiedlm.experiment.tuning import check_record_target

    (tmp_path / "runs").mkdir()
    (tmp_path / "runs" / "tuning.json").write_text('{"format": 1, "keys": ["train.lr"], "chosen": ["a"]}')
    with pytest.raises(ConfigError, match="tuning.json was not written by tiedlm"):
        check_record_target(tmp_path / "runs")
    record = read_record(tmp_path / "runs", [tmp_path / "runs" / "a"])  # not tiedlm's: compare does not use it,
    assert not record.usable and "was not written by tiedlm" in record.ignored  # and says why
