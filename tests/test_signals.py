"""Real processes killed the ways a scheduler or a user kills them: SIGINT, SIGTERM, kill -9,
two starts at once. Each step of the child is slowed to ~15 ms (by a wrapper, not by tiedlm)
so that a signal lands mid-run."""

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import yaml
from safetensors.torch import load_file

from tiedlm.runs import checkpoints
from tiedlm import runs
from tiedlm.config import apply_overrides, load_config
from tiedlm.train import train_run

from .conftest import TINY

SLOW_CLI = (
    "import sys, time, tiedlm.train as t\n"
    "orig = t.lr_at\n"
    "t.lr_at = lambda *a: (time.sleep(0.015), orig(*a))[1]\n"
    "from tiedlm.cli import app\n"
    "sys.exit(app(prog_name='tiedlm'))\n"
)
LONG = ["train.max_steps=80", "train.checkpoint_every=4", "train.eval_every=20"]


def start(tmp_path: Path, *extra: str, name: str = "run") -> subprocess.Popen:
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text(yaml.safe_dump(apply_overrides({}, TINY + LONG + list(extra))))
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    return subprocess.Popen([sys.executable, "-c", SLOW_CLI, "train", "--config", str(cfg), "--out",
                             str(tmp_path / "runs"), "--name", name, "--quiet"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)


def wait_for_checkpoint(run: Path, proc: subprocess.Popen, timeout: float = 60) -> None:
    deadline = time.time() + timeout
    while not (run / "checkpoints" / "LATEST").exists():
        if proc.poll() is not None:
            raise AssertionError(f"child ended early: {proc.communicate()}")
        if time.time() > deadline:
            proc.kill()
            raise AssertionError("no checkpoint appeared in time")
        time.sleep(0.02)


@pytest.mark.parametrize("sig, code", [(signal.SIGINT, 130), (signal.SIGTERM, 143)], ids=["SIGINT", "SIGTERM"])
def test_signal_writes_checkpoint_and_exits_with_its_code(tmp_path, sig, code):
    proc = start(tmp_path)
    run = tmp_path / "runs" / "run"
    wait_for_checkpoint(run, proc)
    proc.send_signal(sig)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == code, err
    assert "Traceback" not in err
    assert err.strip().splitlines()[-1].startswith("tiedlm: error: interrupted at step")
    r = json.loads((run / "report.json").read_text())
    assert r["status"] == "interrupted"
    ckpt = checkpoints.latest_checkpoint(run)
    checkpoints.verify_checkpoint(ckpt)
    assert int(ckpt.name.split("-")[1]) == r["interrupted_at_step"]  # written at the stop, not before
    assert not (run / runs.LOCK).exists()


def test_second_sigint_exits_at_once_leaving_the_checkpoint_intact(tmp_path):
    proc = start(tmp_path)
    run = tmp_path / "runs" / "run"
    wait_for_checkpoint(run, proc)
    proc.send_signal(signal.SIGINT)
    proc.send_signal(signal.SIGINT)
    proc.communicate(timeout=60)
    assert proc.returncode != 0
    checkpoints.verify_checkpoint(checkpoints.latest_checkpoint(run))


def test_kill_9_at_a_random_moment_resumes_to_the_same_result(tmp_path):
    cfg = load_config(None, TINY + LONG + ["model.dropout=0.1"])
    ref = train_run(cfg, out=tmp_path / "ref", name="run", progress=False)
    proc = start(tmp_path, "model.dropout=0.1")
    run = tmp_path / "runs" / "run"
    wait_for_checkpoint(run, proc)
    time.sleep(random.uniform(0.0, 0.6))
    proc.kill()
    proc.communicate(timeout=30)
    assert proc.returncode == -signal.SIGKILL
    assert (run / runs.LOCK).exists()  # left behind by the dead process
    train_run(cfg, out=tmp_path / "runs", name="run", progress=False)
    wa = load_file(str(checkpoints.latest_checkpoint(ref) / checkpoints.MODEL_FILE))
    wb = load_file(str(checkpoints.latest_checkpoint(run) / checkpoints.MODEL_FILE))
    assert all(torch.equal(wa[k], wb[k]) for k in wa) and wa.keys() == wb.keys()
    ra = json.loads((ref / "report.json").read_text())
    rb = json.loads((run / "report.json").read_text())
    assert ra["final"] == rb["final"]
    steps = [m["step"] for m in runs.read_metrics(run) if m["kind"] == "train"]
    assert steps == sorted(set(steps)) == list(range(1, 81))


def test_two_concurrent_starts_one_wins(tmp_path):
    # a budget `a` cannot finish while `b` starts, however loaded the machine: `a` is stopped below
    endless = "train.max_steps=100000"
    a = start(tmp_path, endless)
    run = tmp_path / "runs" / "run"
    wait_for_checkpoint(run, a)
    b = start(tmp_path, endless)
    out_b, err_b = b.communicate(timeout=60)
    assert b.returncode == 1
    assert f"in use by process {a.pid}" in err_b and "Traceback" not in err_b
    a.send_signal(signal.SIGTERM)
    a.communicate(timeout=60)
    assert a.returncode == 143


SLOW_FINAL_EVAL = (
    "import sys, time, tiedlm.evaluate as e\n"
    "orig = e.evaluate_split\n"
    "def slow(*a, **k):\n"
    "    if k.get('max_tokens') is None:\n"
    "        print('FINAL-EVAL', file=sys.stderr, flush=True)\n"
    "        time.sleep(1.0)\n"
    "    return orig(*a, **k)\n"
    "e.evaluate_split = slow\n"
    "from tiedlm.cli import app\n"
    "sys.exit(app(prog_name='tiedlm'))\n"
)


def test_sigterm_during_the_final_evaluation_resumes_to_finished(tmp_path):
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text(yaml.safe_dump(apply_overrides({}, TINY)))
    proc = subprocess.Popen([sys.executable, "-c", SLOW_FINAL_EVAL, "train", "--config", str(cfg), "--out",
                             str(tmp_path / "runs"), "--name", "run", "--quiet"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    line = ""
    while "FINAL-EVAL" not in line:
        line = proc.stderr.readline()
        assert line or proc.poll() is None, "child ended before the final evaluation"
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 143, err
    assert "interrupted during the final evaluation" in err
    run = tmp_path / "runs" / "run"
    assert json.loads((run / "report.json").read_text())["status"] == "interrupted"
    train_run(load_config(None, TINY), out=tmp_path / "runs", name="run", progress=False)
    r = json.loads((run / "report.json").read_text())
    assert r["status"] == "finished" and set(r["final"]) == {"validation", "test"}
    finals = [m["split"] for m in runs.read_metrics(run) if m["kind"] == "final"]
    assert finals == ["validation", "test"]  # no duplicate from the interrupted attempt
