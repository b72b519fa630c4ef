"""--jobs: runs trained at once, each in its own process (tiedlm/parallel.py), with the same numbers
as one after another, failures passed over, and a signal stopping every job at a checkpoint."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from tiedlm.cli import app
from tiedlm.config import apply_overrides
from tiedlm.errors import ConfigError
from tiedlm.experiment.parallel import JOBS_LIMIT, parse_jobs, resolve_workers

from .conftest import TINY

ROOT = Path(__file__).resolve().parents[1]


def test_parse_jobs():
    assert parse_jobs(None) == 1 and parse_jobs("3") == 3 and parse_jobs(" Auto ") == "auto"
    for bad in ("0", "-1", "abc", "", "1.5", str(JOBS_LIMIT + 1), 0):
        with pytest.raises(ConfigError):
            parse_jobs(bad)


def test_auto_is_one_process_per_core_for_small_models(tiny, monkeypatch):
    monkeypatch.setattr("tiedlm.experiment.parallel.available_cores", lambda: 4)
    monkeypatch.setattr("tiedlm.experiment.parallel.visible_gpus", lambda cfgs: [])
    cfgs = [tiny(seed=s) for s in range(6)]
    assert resolve_workers("auto", cfgs) == 4 and resolve_workers("auto", cfgs[:2]) == 2
    assert resolve_workers("auto", [tiny("model.n_embd=1024", "model.n_layer=2")]) == 1
    assert resolve_workers(8, cfgs[:3]) == 3


def test_gpus_are_looked_for_only_where_a_driver_made_its_device_files(tiny, tmp_path, monkeypatch):
    import torch

    from tiedlm.experiment import parallel

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # torch would say two GPUs
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    cfgs = [tiny(seed=s) for s in range(2)]
    device = tmp_path / "nvidiactl"
    monkeypatch.setattr(parallel, "GPU_DEVICE_FILES", (str(device),))
    assert parallel.visible_gpus(cfgs) == []  # no driver's file: torch is not asked
    device.touch()
    assert parallel.visible_gpus(cfgs) == ["0", "1"]
    assert parallel.visible_gpus([tiny("train.device=cpu")]) == []


@pytest.mark.parametrize("args", [["compare", "--config", "{cfg}", "--jobs", "0"],
                                  ["compare", "--config", "{cfg}", "--jobs", "abc"],
                                  ["compare", "{cfg}", "--jobs", "2"],
                                  ["sweep", "{cfg}", "--jobs", "-1"],
                                  ["sweep", "{cfg}", "--dry-run", "--jobs", "2"]])
def test_jobs_refused_in_one_line(args, tiny_yaml, tmp_path):
    result = CliRunner().invoke(app, [a.replace("{cfg}", str(tiny_yaml)) for a in args] + ["--out", str(tmp_path)]
                                if args[0] == "compare" else [a.replace("{cfg}", str(tiny_yaml)) for a in args])
    assert result.exit_code == 2, result.output
    assert len(result.output.strip().splitlines()) == 1 and "--jobs" in result.output


def _tensors(run: Path) -> dict:
    from safetensors.torch import load_file

    latest = (run / "checkpoints" / "LATEST").read_text().strip()
    return load_file(run / "checkpoints" / latest / "model.safetensors")


def _metrics(run: Path) -> list:
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if k not in ("time", "tokens_per_s")} for r in rows]


def test_parallel_runs_end_as_sequential_ones(tiny_yaml, tmp_path):
    from tiedlm.experiment import compare_config

    one = compare_config(tiny_yaml, [], seeds=1, runs_dir=tmp_path / "one", progress=False, jobs=1)
    two = compare_config(tiny_yaml, [], seeds=1, runs_dir=tmp_path / "two", progress=False, jobs=2)
    assert not one.train_failures and not two.train_failures
    names = sorted(p.name for p in (tmp_path / "one").iterdir() if not p.name.startswith("compare"))
    assert names == sorted(p.name for p in (tmp_path / "two").iterdir() if not p.name.startswith("compare")) and len(names) == 2
    for name in names:
        a, b = tmp_path / "one" / name, tmp_path / "two" / name
        ra, rb = (json.loads((d / "report.json").read_text()) for d in (a, b))
        assert ra["final"] == rb["final"] and ra["config_hash"] == rb["config_hash"]
        assert _metrics(a) == _metrics(b)
        ta, tb = _tensors(a), _tensors(b)
        assert ta.keys() == tb.keys()
        assert all(ta[k].numpy().tobytes() == tb[k].numpy().tobytes() for k in ta)


def test_a_failing_run_is_reported_and_the_others_finish(tiny, tmp_path, capsys):
    from tiedlm.experiment.jobs import train_jobs

    jobs = [("good", tiny()), ("bad", tiny("train.lr=1e6", "train.weight_decay=0", "train.max_skipped=0")), ("good2", tiny(seed=1))]
    results = train_jobs(jobs, tmp_path, progress=False, parallel=2)
    assert [r.name for r in results] == ["good", "bad", "good2"]
    assert [r.status for r in results] == ["finished", "failed", "finished"]
    assert results[1].error and "tiedlm: error" not in results[1].error
    assert "bad failed:" in capsys.readouterr().err
    again = train_jobs(jobs[::2], tmp_path, progress=False, parallel=2)
    assert [r.status for r in again] == ["skipped", "skipped"]


def test_sigint_stops_every_job_at_a_checkpoint_and_the_rerun_completes(tmp_path):
    cfg = tmp_path / "long.yaml"
    cfg.write_text(yaml.safe_dump(apply_overrides({}, TINY + [
        "train.max_steps=250", "train.checkpoint_every=50", "train.eval_every=125", "train.log_every=10"])))
    cmd = [sys.executable, "-m", "tiedlm", "compare", "--config", str(cfg), "--jobs", "2",
           "--out", str(tmp_path / "runs"), "-q"]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    parent = subprocess.Popen(cmd, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    metrics = [tmp_path / "runs" / n / "metrics.jsonl" for n in ("tiny-tied-s0", "tiny-untied-s0")]
    while not all(m.exists() and m.stat().st_size > 0 for m in metrics):  # both children training
        assert parent.poll() is None and time.monotonic() < deadline, parent.communicate()
        time.sleep(0.2)
    parent.send_signal(signal.SIGINT)
    try:
        _, err = parent.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        parent.kill()
        raise
    assert parent.returncode == 130, err
    assert "tiedlm: error:" in err.strip().splitlines()[-1]
    for m in metrics:  # each child stopped at a checkpoint of its own, before the end
        run = m.parent
        assert (run / "checkpoints" / "LATEST").exists() and not (run / "report.json").exists() or \
            json.loads((run / "report.json").read_text())["status"] != "finished"
        assert not (run / ".lock").exists()
    rerun = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert rerun.returncode == 0, rerun.stderr
    for m in metrics:
        assert json.loads((m.parent / "report.json").read_text())["status"] == "finished"
