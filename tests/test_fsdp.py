"""train.parallel: fsdp — two CPU processes (gloo) under one torchrun launch (tests/fsdp_ranks.py):
GPT-2 tied (stopped at step 10 and resumed), and transformers' Qwen2 (arch: hf) untied and lowrank,
each against one process with the same global batch; their sharded checkpoints, an export of the
sharded run against one process's; a model built on the meta device, drawn shard by shard; a tie
sharded apart, refused. Then the refusals and the dry-run plan, without a launch.

Tolerance: each rank's loss is its half of the batch and FSDP averages the two halves' gradients
(reduce-scatter) where one process means over the whole batch: float32 rounding apart. Measured:
1e-10 to 3e-9 relative on the final validation loss after 20 steps; the tests allow 1e-6. The
resume is bit for bit (==): the same world size reads each rank's own shards back.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from tiedlm import runs
from tiedlm.runs import checkpoints
from .conftest import comparison_dir

TINY = {"name": "f",
        "data": {"path": "builtin:synthetic", "synthetic": {"vocab_size": 300, "n_classes": 12, "train_tokens": 20000,
                                                            "validation_tokens": 3000, "test_tokens": 3000}},
        "tokenizer": {"vocab_size": 512}, "model": {"n_layer": 2, "n_head": 2, "n_embd": 32, "block_size": 32},
        "train": {"batch_size": 8, "max_steps": 20, "eval_every": 10, "lr": 3.0e-3, "warmup_steps": 5,
                  "device": "cpu", "checkpoint_every": 10, "parallel": "fsdp"}}
HF = {"arch": "hf", "hf_config": "qwen2", "n_kv_head": 1}
RUNS = {"gpt2-stop": {}, "hf-untied": {**HF, "tie_embeddings": False},
        "hf-lowrank": {**HF, "tie_mode": "lowrank", "untie_rank": 4}}
UNSTOPPED = {"gpt2": {}}  # gpt2-stop's twin, never stopped: the resume's reference
TOL = 1e-6


def write_config(folder: Path, stem: str, model: dict, **train) -> Path:
    data = json.loads(json.dumps(TINY))
    data["model"].update(model)
    data["train"].update(train)
    path = folder / f"{stem}.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def report(run_dir: Path) -> dict:
    return json.loads((run_dir / runs.REPORT).read_text())


@pytest.fixture(scope="module")
def sharded(tmp_path_factory):
    """The one launch: every run in RUNS on two processes, and the hand-made checks."""
    pytest.importorskip("transformers")
    tmp = tmp_path_factory.mktemp("fsdp")
    configs = [write_config(tmp, stem, model) for stem, model in {**RUNS, **UNSTOPPED}.items()]
    env = {**os.environ, "TIEDLM_CACHE": str(tmp / "cache"), "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
           str(Path(__file__).parent / "fsdp_ranks.py"), str(tmp / "two"), *map(str, configs)]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=240, env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    return tmp


def one_process(tmp: Path, stem: str, monkeypatch) -> dict:
    """The same config in this one process (train.parallel is operational: the same variant)."""
    from tiedlm.config import load_config
    from tiedlm.train import train_run

    monkeypatch.setenv("TIEDLM_CACHE", str(tmp / "cache"))
    (tmp / "one").mkdir(exist_ok=True)
    cfg = load_config(write_config(tmp / "one", stem, RUNS[stem], parallel="ddp"))
    return report(train_run(cfg, tmp / "one" / stem, progress=False))


@pytest.mark.parametrize("stem", list(RUNS))
def test_two_sharded_processes_end_where_one_does(sharded, stem, monkeypatch):
    two = report(sharded / "two" / stem / "f-s0")
    one = one_process(sharded, stem, monkeypatch)
    assert two["status"] == "finished" and two["world_size"] == 2 and two["config_hash"] == one["config_hash"]
    assert two["steps"] == one["steps"] == 20 and two["params"] == one["params"]  # counted alike, whole
    assert two["flops_per_token"] == one["flops_per_token"] and two["ledger"] == one["ledger"]
    for split in ("validation", "test"):
        assert two["final"][split]["tokens"] == one["final"][split]["tokens"]
        assert two["final"][split]["loss"] == pytest.approx(one["final"][split]["loss"], rel=TOL)
    shards = two["fsdp"]
    assert shards["units"] == 3 and shards["params"] == two["params"]["total"]  # two blocks and the root
    assert shards["local_params"] < shards["params"] and shards["state_bytes_per_rank"] == 16 * shards["local_params"]
    ckpt = checkpoints.latest_checkpoint(sharded / "two" / stem / "f-s0")
    manifest = checkpoints.verify_checkpoint(ckpt)
    assert manifest["sharded"] and manifest["world_size"] == 2 and manifest["tied"] == (stem != "hf-untied")
    assert sorted(f for f in manifest["files"] if f.endswith(".distcp")) == ["shards/__0_0.distcp",
                                                                              "shards/__1_0.distcp"]
    tensors, _, _ = checkpoints.load_checkpoint(ckpt, with_state=False)  # gathered whole, in this process
    assert any(k.endswith("lm_head.weight") for k in tensors) == (stem == "hf-untied")  # a tied matrix once


def test_a_sharded_run_resumes_bit_for_bit_and_exports_as_one_process_does(sharded, monkeypatch):
    from safetensors.torch import load_file

    from tiedlm.export import export_run

    two = report(sharded / "two" / "gpt2-stop" / "f-s0")
    unstopped = report(sharded / "two" / "gpt2" / "f-s0")
    assert two["resumed_at_steps"] == [10] and "resumed_at_steps" not in unstopped
    for split in ("validation", "test"):
        assert two["final"][split]["loss"] == unstopped["final"][split]["loss"]  # to the bit
    one_process(sharded, "gpt2-stop", monkeypatch)
    export_run(sharded / "two" / "gpt2-stop" / "f-s0", sharded / "hf-two")
    export_run(sharded / "one" / "gpt2-stop" / "f-s0", sharded / "hf-one")
    names = sorted(p.name for p in (sharded / "hf-two").iterdir())
    assert names == sorted(p.name for p in (sharded / "hf-one").iterdir())
    a, b = (load_file(str(sharded / f / "model.safetensors")) for f in ("hf-two", "hf-one"))
    assert sorted(a) == sorted(b) and all((a[k] - b[k]).abs().max() < 1e-4 for k in a)
    config = json.loads((sharded / "hf-two" / "config.json").read_text())
    assert config["tie_word_embeddings"] is True


def test_meta_init_draws_each_shard_with_the_family_s_scheme_and_a_tie_sharded_apart_is_refused(sharded):
    checks = [json.loads((sharded / "two" / f"checks-{r}.json").read_text()) for r in (0, 1)]
    assert checks[0] == checks[1]  # one model, seen alike from both ranks
    c = checks[0]
    assert c["tied"] and c["units"] == 3 and c["ln_ones"] and c["halves_differ"]  # each rank drew its own rows
    assert c["e_std"] == pytest.approx(0.02, rel=0.1)  # GPT-2's normal(0, 0.02)
    assert c["proj_std"] == pytest.approx(0.02 / 2, rel=0.15)  # residual projections at 0.02/√(2·2)
    assert "expected the model to be tied" in c["apart_refused"]


def test_fsdp_without_torchrun_is_refused_in_one_line_with_a_fix_that_works(tmp_path, monkeypatch):
    from tiedlm.cli import app

    monkeypatch.setenv("TIEDLM_CACHE", str(tmp_path / "cache"))
    for key in ("WORLD_SIZE", "RANK", "LOCAL_RANK", "TORCHELASTIC_RUN_ID"):
        monkeypatch.delenv(key, raising=False)
    cfg = write_config(tmp_path, "f", {}, max_steps=6, warmup_steps=2, eval_every=0)
    args = ["train", "-c", str(cfg), "--out", str(tmp_path / "runs"), "-q"]
    r = CliRunner().invoke(app, args)
    assert r.exit_code == 2 and "launch with torchrun" in r.output and "Traceback" not in r.output
    fix = r.output.split("or set ")[-1].split()[0]  # train.parallel=ddp
    assert CliRunner().invoke(app, [*args, "--set", fix]).exit_code == 0
    r = CliRunner().invoke(app, [*args, "--set", "train.parallel=fsdpp"])
    assert r.exit_code == 2 and "train.parallel must be one of ddp, fsdp" in r.output


def test_dry_run_plans_memory_per_process_without_building_weights(tmp_path):
    from tiedlm.cli import app

    r = CliRunner().invoke(app, ["train", "-c", "configs/llama-3.2-1b.yaml", "--dry-run",
                                 "--set", "train.parallel=fsdp"])
    assert r.exit_code == 0, r.output
    assert "1,235,814,400 parameters" in r.output  # the published count, on the meta device
    rows = {line.split()[0]: line.split() for line in r.output.splitlines() if line.strip()[:1].isdigit()}
    assert set(rows) == {"1", "2", "4", "8"}
    # sharded state: 16 bytes a parameter over the ranks (18.4 GiB at 1, 2.3 GiB at 8)
    assert rows["1"][3:5] == ["18.4", "GiB"] and rows["8"][3:5] == ["2.3", "GiB"]


def test_a_sweep_emits_each_sharded_run_as_one_torchrun_job(tmp_path):
    from tiedlm.experiment.sweep import load_grid, slurm_script

    grid = tmp_path / "grid.yaml"
    grid.write_text(yaml.safe_dump({"config": str(write_config(tmp_path, "f", {})), "seeds": 2,
                                    "grid": {"model.tie_embeddings": [True, False]}, "out": str(tmp_path / "runs")}))
    script = slurm_script(load_grid(grid), {"gpus_per_task": "8"})
    tasks = [line for line in script.splitlines() if line.startswith("  ") and ") " in line and "*)" not in line]
    assert len(tasks) == 4 and all("torchrun --standalone --nproc_per_node=gpu -m tiedlm train" in t for t in tasks)
    assert "#SBATCH --gpus-per-task=8" in script


def test_compare_config_launches_each_sharded_run_as_one_torchrun_job(tmp_path, monkeypatch):
    """compare --config on a train.parallel: fsdp config: each run one torchrun job of
    train.processes processes (--jobs leaves them one after another), judged as any other."""
    from tiedlm.cli import app

    monkeypatch.setenv("TIEDLM_CACHE", str(tmp_path / "cache"))
    cfg = write_config(tmp_path, "f", {}, max_steps=6, warmup_steps=2, eval_every=0, checkpoint_every=0, processes=2)
    r = CliRunner().invoke(app, ["compare", "-c", str(cfg), "--out", str(tmp_path / "runs"), "--jobs", "2"])
    assert r.exit_code == 0, r.output
    assert "launching torchrun with 2 processes" in r.output and "one after another" in r.output
    found = {p.name: report(p) for p in (tmp_path / "runs").iterdir() if (p / runs.REPORT).is_file()}
    assert len(found) == 2 and all(rep["status"] == "finished" and rep["world_size"] == 2 for rep in found.values())
    assert {rep["config"]["model"]["tie_embeddings"] for rep in found.values()} == {True, False}
    comparison = json.loads((comparison_dir(tmp_path / "runs") / "comparison.json").read_text())
    assert [v["n_seeds"] for v in comparison["variants"]] == [1, 1]
