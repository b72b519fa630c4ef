"""Two commands writing a comparison or an analysis into one folder take turns (runs.FolderLock):
the second waits, saying for whom, and never writes beside the first; two `compare --config` on one
--out both end with a comparison of the whole set."""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from tiedlm.config import apply_overrides, load_config
from tiedlm.errors import ConfigError
from tiedlm.runs import OUTPUT_LOCK, FolderLock
from tiedlm.train import train_run

from .conftest import ROOT, TINY, comparison_dir
from .test_compare import make_pair

HOLD_S = 1.5
# Another process holding the folder, as a compare or an analysis writing there does.
HOLDER = ("import sys, time\nfrom tiedlm.runs import FolderLock\nwith FolderLock(sys.argv[1]):\n"
          "    print('held', flush=True)\n    time.sleep(float(sys.argv[2]))\n")


def hold(folder: Path, seconds: float = HOLD_S) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-c", HOLDER, str(folder), str(seconds)], stdout=subprocess.PIPE,
                            text=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.stdout.readline().strip() == "held"
    return proc


def test_compare_waits_for_another_writer_of_its_folder(tmp_path, capsys):
    from tiedlm.compare import compare_runs

    make_pair(tmp_path / "runs", [60.0, 61.0], [58.0, 59.0])
    out = tmp_path / "cmp"
    holder = hold(out)
    t0 = time.monotonic()
    compare_runs(runs_dir=tmp_path / "runs", out=out)
    waited = time.monotonic() - t0
    assert holder.wait(10) == 0
    err = capsys.readouterr().err
    assert f"in use by process {holder.pid}" in err and "waiting" in err, err
    assert waited > HOLD_S / 2
    assert (out / "comparison.md").exists() and not (out / OUTPUT_LOCK).exists()


def test_analyze_waits_for_another_writer_of_its_folder(tmp_path, capsys):
    from tiedlm.analyze import ANALYSIS_JSON, analyze_run

    run = train_run(load_config(None, TINY), out=tmp_path, name="r", progress=False)
    holder = hold(run)
    capsys.readouterr()
    t0 = time.monotonic()
    analyze_run(run)
    assert time.monotonic() - t0 > HOLD_S / 2 and holder.wait(10) == 0
    err = capsys.readouterr().err
    assert f"in use by process {holder.pid}" in err, err
    assert json.loads((run / ANALYSIS_JSON).read_text())["run"] == "r" and not (run / OUTPUT_LOCK).exists()


def test_the_lock_is_taken_again_by_its_holder_and_leaves_no_folder_it_made(tmp_path):
    out = tmp_path / "a" / "b"
    with FolderLock(out):
        with FolderLock(out):  # compare --config holding its folder, then writing the comparison there
            assert (out / OUTPUT_LOCK).exists()
        assert (out / OUTPUT_LOCK).exists()
    assert not (tmp_path / "a").exists()  # nothing written: the folders it made are gone
    (tmp_path / "file").write_text("x")
    with pytest.raises(ConfigError, match="is a file"):
        FolderLock(tmp_path / "file" / "out").acquire()


def test_a_refused_compare_config_leaves_no_empty_folder(tmp_path):
    from tiedlm.experiment import compare_config

    with pytest.raises(ConfigError):
        compare_config(tmp_path / "missing.yaml", runs_dir=tmp_path / "runs", progress=False)
    assert not (tmp_path / "runs").exists()


def test_a_wait_is_interrupted_by_ctrl_c(tmp_path, monkeypatch):
    """Waiting is a sleep: Ctrl-C stops it, and nothing is taken or written."""
    from tiedlm import runs

    out = tmp_path / "cmp"
    holder = hold(out, 30)
    try:
        def interrupt(_):
            raise KeyboardInterrupt

        monkeypatch.setattr(time, "sleep", interrupt)
        with pytest.raises(KeyboardInterrupt):
            FolderLock(out).acquire()
    finally:
        monkeypatch.undo()
        holder.kill()
        holder.wait()
    assert not runs.locks._held_folders


def test_two_compare_config_on_one_out_both_compare_every_run(tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text(yaml.safe_dump(apply_overrides({}, TINY + ["train.max_steps=150", "train.eval_every=50",
                                                             "train.checkpoint_every=50", "train.log_every=10"])))
    cmd = [sys.executable, "-m", "tiedlm", "compare", "--config", str(cfg), "--seeds", "2",
           "--out", str(tmp_path / "runs"), "-q"]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    first = subprocess.Popen(cmd, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    metrics = tmp_path / "runs" / "tiny-tied-s0" / "metrics.jsonl"
    deadline = time.monotonic() + 120
    while not (metrics.exists() and metrics.stat().st_size > 0):  # the first is training its first run
        assert first.poll() is None and time.monotonic() < deadline, first.communicate()
        time.sleep(0.05)
    second = subprocess.Popen(cmd, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    outs = [p.communicate(timeout=300) for p in (first, second)]
    assert first.returncode == 0 and second.returncode == 0, outs
    assert f"in use by process {first.pid}" in outs[1][1] and "waiting" in outs[1][1], outs[1][1]
    assert "failed" not in outs[0][1] + outs[1][1], outs
    data = json.loads((comparison_dir(tmp_path / "runs") / "comparison.json").read_text())
    assert sorted(r["name"] for r in data["runs"]) == sorted(f"tiny-{v}-s{s}" for v in ("tied", "untied")
                                                             for s in (0, 1))
    assert not data.get("train_failures")


def test_compare_config_refuses_a_bad_config_without_waiting_for_its_folder(tmp_path, capsys):
    """The config is read and checked before the comparison folder's lock is taken: a refusal comes
    at once, not after another command writing there has finished."""
    from tiedlm.errors import ConfigError
    from tiedlm.experiment import compare_config

    out = tmp_path / "cmp"
    holder = hold(out, seconds=30)
    try:
        t0 = time.monotonic()
        with pytest.raises(ConfigError, match="model.n_embd"):
            compare_config(ROOT / "configs" / "tied.yaml", [*TINY, "model.n_embd=-4"], out=out,
                           runs_dir=tmp_path / "runs", progress=False)
        assert time.monotonic() - t0 < 20
        assert "waiting" not in capsys.readouterr().err
    finally:
        holder.kill()
        holder.wait(10)
