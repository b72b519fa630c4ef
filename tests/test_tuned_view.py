"""A tuned sweep's folder compared whole: each grid point at its chosen value, on test, while its
tuning record (tuning.json) can be trusted. When the record cannot be used (deleted, corrupt,
edited, a run renamed or added), the comparison says first, on the terminal and in
comparison.md and comparison.json, that it was ignored and why, and names the split the verdict
is on (validation being the one that chose the tuned values)."""

import json
import math
import shutil
import types
from pathlib import Path

import pytest

from tests.test_compare import V, make_run
from tiedlm.compare import compare_runs
from tiedlm.compare.report import format_terminal_table
from tiedlm.config import load_config
from tiedlm.experiment.sweep import load_grid, run_sweep

IGNORED = "the tuning record was ignored"


@pytest.fixture
def swept(tmp_path, monkeypatch):
    """A tuned sweep's runs folder (n_embd 32 and 64, lr tuned, 2 seeds), trained by a stand-in
    whose validation perplexity is least at a known lr per width."""
    import tiedlm.data
    from tiedlm import runs as run_folder

    best = {32: 1e-2, 64: 3e-3}

    def train(cfg, out, name, progress=True, overwrite=False, **_):
        run_dir = Path(out) / name
        if run_folder.existing_state(run_dir, cfg) == "finished":
            return run_dir
        shutil.rmtree(run_dir, ignore_errors=True)
        val = 40 * (1 + math.log(cfg.train.lr / best[cfg.model.n_embd]) ** 2) + cfg.seed
        return make_run(Path(out), name, cfg.seed, val=val, cfg=cfg)

    monkeypatch.setattr(tiedlm.data, "prepare_data", lambda cfg, progress=True: types.SimpleNamespace(model_vocab_size=V))
    (tmp_path / "base.yaml").write_text("name: base\nmodel:\n  n_head: 2\ntrain:\n  max_steps: 10\n  warmup_steps: 1\n")
    grid = tmp_path / "grid.yaml"
    grid.write_text("config: base.yaml\ngrid:\n  model.n_embd: [32, 64]\nseeds: 2\nout: runs\n"
                    "tune:\n  train.lr: [1.0e-3, 3.0e-3, 1.0e-2]\n")
    run_sweep(load_grid(grid), progress=False, train=train)
    return tmp_path / "runs"


def _says_ignored(c, out: Path, why: str) -> None:
    assert len(c.warnings) == 1 and c.warnings[0].startswith(IGNORED) and why in c.warnings[0], c.warnings
    assert c.primary == "validation" and "use --primary test" in c.warnings[0]
    terminal = [line for line in format_terminal_table(c).splitlines() if not line.startswith("protocol: ")]
    assert terminal[0].startswith(f"warning: {IGNORED}") and why in terminal[0]
    md = (out / "comparison.md").read_text()
    assert f"**Warning:** {IGNORED}" in md and md.index("**Warning:**") < md.index("Weights compared")
    assert json.loads((out / "comparison.json").read_text())["warnings"] == c.warnings
    assert len(c.variants) > 2  # every grid point a variant of its own


def test_the_record_trusted_gives_the_chosen_points_on_test_and_no_warning(swept, tmp_path):
    c = compare_runs([swept], out=tmp_path / "cmp")
    assert c.warnings == [] and c.primary == "test"
    assert "Warning" not in (tmp_path / "cmp" / "comparison.md").read_text()


def test_a_deleted_record_is_said(swept, tmp_path):
    (swept / "tuning.json").unlink()
    c = compare_runs([swept], out=tmp_path / "cmp")
    _says_ignored(c, tmp_path / "cmp", "which a tuned sweep or compare --config wrote, is missing")


@pytest.mark.parametrize("damage", ["corrupt", "edit"])
def test_a_corrupt_or_edited_record_is_said(swept, tmp_path, damage):
    path = swept / "tuning.json"
    if damage == "corrupt":
        path.write_bytes(path.read_bytes()[:40])
    else:
        data = json.loads(path.read_text())
        data["chosen"] = data["chosen"][:1]
        path.write_text(json.dumps(data))
    c = compare_runs([swept], out=tmp_path / "cmp")
    _says_ignored(c, tmp_path / "cmp", "was not written by tiedlm, or was changed since")


def test_a_renamed_run_is_said(swept, tmp_path):
    (swept / "base-n_embd=32-lr=0.01-s1").rename(swept / "mine-s1")
    c = compare_runs([swept], out=tmp_path / "cmp")
    _says_ignored(c, tmp_path / "cmp", "1 run here the tuning did not train (mine-s1: renamed, or added since)")


def test_a_foreign_run_is_said(swept, tmp_path):
    make_run(swept, "stranger-s0", 0, val=50.0, cfg=load_config(tmp_path / "base.yaml"))
    c = compare_runs([swept], out=tmp_path / "cmp", baseline="stranger-s0")
    _says_ignored(c, tmp_path / "cmp", "(stranger-s0: renamed, or added since)")


def test_the_warning_names_test_when_test_carries_the_verdict(swept, tmp_path):
    (swept / "tuning.json").unlink()
    c = compare_runs([swept], out=tmp_path / "cmp", primary="test")
    assert c.primary == "test" and "the verdict is on test" in c.warnings[0]
    assert "use --primary test" not in c.warnings[0]
