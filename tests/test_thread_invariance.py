"""A run's result does not depend on its CPU thread count: the same weights and metrics, bit for bit,
on one thread, on two, and with `train.threads: auto` switching between them every step. That is
what lets the count follow the machine's load mid-run (tiedlm.threads). The shapes are the smallest
at which the two causes showed (a weight gradient's matmul that MKL splits along its 2,048 rows,
LayerNorm's per-thread sums): the control test shows the same runs differing without MKL's mode."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests import cpu_probe
from tiedlm import threads

ROOT = Path(__file__).resolve().parents[1]

# 32 sequences of 64 tokens a micro-batch: 2,048 rows in each weight gradient's matmul
SHAPE = ["model.n_embd=32", "model.n_head=2", "model.block_size=64", "train.batch_size=32", "train.max_steps=4",
         "train.eval_every=2", "train.checkpoint_every=0", "data.synthetic.train_tokens=20000"]
MODELS = {
    "gpt2 tied, dropout": ["model.tie_embeddings=true", "model.dropout=0.1"],
    "llama untied, grouped-query": ["model.arch=llama", "model.tie_embeddings=false", "model.n_kv_head=1",
                                    "model.bias=false"],
}


def _weights(run: Path) -> dict:
    from safetensors.torch import load_file

    latest = (run / "checkpoints" / "LATEST").read_text().strip()
    return load_file(run / "checkpoints" / latest / "model.safetensors")


def _metrics(run: Path) -> list:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()
            if json.loads(line).get("kind") in ("train", "eval")]


def _same(a: Path, b: Path) -> bool:
    import torch

    wa, wb = _weights(a), _weights(b)
    strip = [{k: v for k, v in m.items() if k not in ("time", "tokens_per_s", "seconds")} for m in _metrics(a)]
    strip_b = [{k: v for k, v in m.items() if k not in ("time", "tokens_per_s", "seconds")} for m in _metrics(b)]
    return wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa) and strip == strip_b


@pytest.fixture
def switching(monkeypatch):
    """train.threads: auto whose governor looks at every tick and flips between 1 and 2 threads."""
    flips = iter(range(10**6))
    monkeypatch.setattr(threads, "INTERVAL_S", 0.0)
    monkeypatch.setattr(threads, "FIRST_S", 0.0)
    monkeypatch.setattr(threads, "ACTIVE", 0.0)  # a loaded machine may hold this process back in a window
    monkeypatch.setattr(threads, "choose", lambda cores, others, ceiling: 1 + next(flips) % 2)
    monkeypatch.setattr(threads, "usable_cpus", lambda: [0, 1])


@pytest.mark.parametrize("model", list(MODELS))
def test_one_thread_two_threads_and_switching_end_the_same(model, tiny, tmp_path, switching):
    import torch

    from tiedlm.train import train_run

    assert threads.invariant()  # the conftest set MKL's mode before torch loaded, as the CLI does
    before = torch.get_num_threads()
    torch.set_num_threads(2)  # the ceiling the switching run may use, whatever this machine has
    try:
        runs = {n: train_run(tiny(*SHAPE, *MODELS[model], f"train.threads={n}"), tmp_path, name=f"t{n}",
                             progress=False) for n in ("1", "2", "auto")}
    finally:
        torch.set_num_threads(before)
    report = json.loads((runs["auto"] / "report.json").read_text())
    assert report["threads"]["adaptive"] and set(report["threads"]["seconds"]) == {"1", "2"}  # it did switch
    assert json.loads((runs["1"] / "report.json").read_text())["threads"] == {"adaptive": False, "threads": 1}
    assert _same(runs["1"], runs["2"])
    assert _same(runs["1"], runs["auto"])


CONTROL = """
import json, sys, torch
sys.path.insert(0, sys.argv[1])
from tests.conftest import TINY
from tiedlm.config import load_config
from tiedlm.train import train_run
from pathlib import Path
shape, out = json.loads(sys.argv[2]), Path(sys.argv[3])
for n in (1, 2):
    torch.set_num_threads(n)
    train_run(load_config(None, TINY + shape + [f"train.threads={n}"]), out, name=f"t{n}", progress=False)
"""


def test_without_mkl_s_mode_the_thread_count_changes_the_weights(tmp_path):
    """The control: the same two runs in a process that never had MKL_CBWR differ, so the test above
    could fail (and the mode is what makes it pass). Where they are the same and this CPU's MKL gives
    the same bits on one thread and on two without the mode even for a plain matmul
    (tests/cpu_probe.py), the machine cannot show the difference: skipped, saying so."""
    env = {k: v for k, v in os.environ.items() if k != "MKL_CBWR"}
    env["GOMP_SPINCOUNT"] = "10000"
    shape = SHAPE + MODELS["gpt2 tied, dropout"]
    out = subprocess.run([sys.executable, "-c", CONTROL, str(ROOT), json.dumps(shape), str(tmp_path)],
                         capture_output=True, text=True, env=env, cwd=ROOT, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    if _same(tmp_path / "t1", tmp_path / "t2") and not cpu_probe.shows_thread_differences():
        pytest.skip(cpu_probe.skip_reason())
    assert not _same(tmp_path / "t1", tmp_path / "t2")
