"""The run folder against what a hostile world does to it: a lost LATEST pointer, files left by a
killed writer, a full disk or a file-size limit, memory that cannot hold the model, a reader that
closes the pipe, SIGTERM while the data are prepared. Where the user meets the failure through the
command line, it is driven through the command line (a real subprocess for limits and signals)."""

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from safetensors.torch import load_file
from typer.testing import CliRunner

from tiedlm.runs import checkpoints
from tiedlm import runs
from tiedlm.cli import app
from tiedlm.config import apply_overrides
from tiedlm.errors import ConfigError, Interrupted, RunError
from tiedlm.train import train_run

from .conftest import TINY


def invoke(*args):
    return CliRunner().invoke(app, [str(a) for a in args])


def one_line(stderr: str) -> str:
    """The one error line (progress lines such as `step 4/12 val loss ...` may come before it)."""
    lines = [line for line in stderr.splitlines() if line.startswith("tiedlm: error:")]
    assert len(lines) == 1 and "Traceback" not in stderr, stderr
    return lines[0]


def interrupted_run(tiny, tmp_path, step=4):
    with pytest.raises(Interrupted):
        train_run(tiny(), out=tmp_path, progress=False, stop_after_step=step)
    return tmp_path / "tiny-s0"


def child(tmp_path: Path, prelude: str, *args: str, **popen) -> subprocess.Popen:
    """`tiedlm ARGS` in a fresh interpreter that first runs `prelude` (a limit, a slow stage)."""
    code = f"import sys\n{prelude}\nfrom tiedlm.cli import app\nsys.exit(app(prog_name='tiedlm'))\n"
    popen.setdefault("stdout", subprocess.PIPE)
    popen.setdefault("stderr", subprocess.PIPE)
    return subprocess.Popen([sys.executable, "-c", code, *args], text=True,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"}, **popen)


def tiny_file(tmp_path: Path, *extra: str) -> Path:
    path = tmp_path / "tiny.yaml"
    path.write_text(yaml.safe_dump(apply_overrides({}, TINY + list(extra))))
    return path


# ---------------------------------------------------------------- LATEST lost or dangling


def test_missing_latest_resumes_from_the_newest_verified_checkpoint(tiny, tmp_path):
    ref = train_run(tiny(), out=tmp_path / "ref", progress=False)
    run = interrupted_run(tiny, tmp_path)
    (run / "checkpoints" / "LATEST").unlink()
    r = invoke("train", "--config", tiny_file(tmp_path), "--out", tmp_path, "--quiet")
    assert r.exit_code == 0, r.output
    assert "LATEST is missing: using step-0000004, the newest checkpoint that verifies" in r.stderr
    report = json.loads((run / "report.json").read_text())
    assert report["status"] == "finished" and report["resumed_at_steps"] == [4]
    a = load_file(str(checkpoints.latest_checkpoint(ref) / checkpoints.MODEL_FILE))
    b = load_file(str(checkpoints.latest_checkpoint(run) / checkpoints.MODEL_FILE))
    assert all((a[k] == b[k]).all() for k in a)  # the same result as never interrupted


def test_newest_of_several_checkpoints_is_chosen_and_a_damaged_one_skipped(tmp_path):
    import torch

    for step in (4, 8, 12):
        checkpoints.save_checkpoint(tmp_path, step, {"w": torch.full((2,), float(step))}, {"tied": True},
                             {"step": step}, keep_previous=True)
    (tmp_path / "checkpoints" / "LATEST").unlink()
    newest = tmp_path / "checkpoints" / "step-0000012"
    (newest / checkpoints.MODEL_FILE).write_bytes(b"truncated")
    path, note = checkpoints.resolve_checkpoint(tmp_path)
    assert path.name == "step-0000008" and "newest checkpoint that verifies" in note
    (tmp_path / "checkpoints" / "LATEST").write_text("step-0000099\n")  # dangling: same recovery
    assert checkpoints.resolve_checkpoint(tmp_path)[0].name == "step-0000008"


def test_checkpoints_that_cannot_be_resolved_are_refused_never_wiped(tiny, tmp_path):
    run = interrupted_run(tiny, tmp_path)
    (run / "checkpoints" / "LATEST").unlink()
    ckpt = run / "checkpoints" / "step-0000004"
    (ckpt / checkpoints.STATE_FILE).write_bytes(b"damaged")
    before = {p.relative_to(run): p.read_bytes() for p in run.rglob("*") if p.is_file() and p.name != runs.LOCK}
    r = invoke("train", "--config", tiny_file(tmp_path), "--out", tmp_path, "--quiet")
    assert r.exit_code == 1
    line = one_line(r.stderr)
    assert "LATEST is missing" in line and "step-0000004" in line and "--overwrite" in line
    after = {p.relative_to(run): p.read_bytes() for p in run.rglob("*") if p.is_file() and p.name != runs.LOCK}
    assert after == before  # nothing deleted, nothing rewritten


def test_files_left_by_a_killed_writer_are_cleaned_on_resume(tiny, tmp_path):
    run = interrupted_run(tiny, tmp_path)
    strays = [run / ".report.json.abc123.tmp", run / "checkpoints" / ".LATEST.xyz.tmp"]
    for stray in strays:
        stray.write_text("half")
    (run / "checkpoints" / ".tmp-step-0000008-dead").mkdir()
    train_run(tiny(), out=tmp_path, progress=False)
    assert not any(p.exists() for p in strays)
    assert [p.name for p in (run / "checkpoints").iterdir()] == ["LATEST", "step-0000012"] or \
        sorted(p.name for p in (run / "checkpoints").iterdir()) == ["LATEST", "step-0000012"]


# ---------------------------------------------------------------- full disk, file-size limit


@pytest.mark.parametrize("exc, says", [
    (OSError(28, "No space left on device"), "No space left on device while writing"),
    (RuntimeError("[enforce fail at inline_container.cc:603] . unexpected pos 4864 vs 4752"),
     "RuntimeError: [enforce fail"),
    (OSError(27, "File too large"), "File too large while writing"),
])
def test_every_kind_of_write_failure_is_one_line_with_the_resume_advice(exc, says):
    err = runs.write_failure(exc, "runs/x/checkpoints/step-0000008")
    assert isinstance(err, RunError) and says in str(err)
    assert "\n" not in str(err) and str(err).endswith("run the same command to resume from the last checkpoint")


def test_file_size_limit_while_checkpointing_is_one_line_and_resumable(tmp_path):
    resource = pytest.importorskip("resource")
    if not hasattr(signal, "SIGXFSZ") or not hasattr(resource, "RLIMIT_FSIZE"):
        pytest.skip("no file-size limit on this platform")
    cfg = tiny_file(tmp_path)
    # Small files (config, report, token cache of 6,000 tokens) fit under 24 kB; the first
    # checkpoint's optimizer state (~60 kB) does not, and fails with EFBIG as a full disk would.
    limit = ("import resource, signal\nsignal.signal(signal.SIGXFSZ, signal.SIG_IGN)\n"
             "resource.setrlimit(resource.RLIMIT_FSIZE, (24000, 24000))")
    args = ["train", "--config", str(cfg), "--out", str(tmp_path / "runs"), "--quiet"]
    proc = child(tmp_path, limit, *args)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 1, err
    line = one_line(err)
    assert "while writing" in line and "run the same command to resume" in line
    run = tmp_path / "runs" / "tiny-s0"
    assert json.loads((run / "report.json").read_text())["status"] == "failed"
    leftovers = [p for p in run.rglob("*") if p.name.startswith(".tmp-") or p.name.endswith(".tmp")]
    assert leftovers == []
    proc = child(tmp_path, "", *args)  # the same command, with room, finishes the run
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    assert json.loads((run / "report.json").read_text())["status"] == "finished"


# ---------------------------------------------------------------- memory


def test_absurd_sizes_are_refused_at_once_with_the_estimate(tiny_yaml, tmp_path):
    r = invoke("train", "--config", tiny_yaml, "--out", tmp_path / "runs", "--set", "model.n_layer=100000000000")
    assert r.exit_code == 2
    line = one_line(r.stderr)
    assert "need at least" in line and "more than the" in line and "lower model.n_layer" in line
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())
    r = invoke("params", "--config", tiny_yaml, "--set", "model.n_layer=1000000", "--json")
    assert r.exit_code == 0
    counted = json.loads(r.stdout)["untied"]["total"]
    assert counted > 1000000 * 12 * 16 * 16  # the arithmetic count, not a model built layer by layer


@pytest.mark.parametrize("key", ["model.intermediate_size", "model.multiple_of"])
def test_the_memory_refusal_names_the_mlp_width_that_made_the_model_too_big(tiny_yaml, tmp_path, key):
    r = invoke("train", "--config", tiny_yaml, "--out", tmp_path / "runs", "--set", "model.arch=llama",
               "--set", "model.bias=false", "--set", f"{key}=100000000000")
    assert r.exit_code == 2 and "Traceback" not in r.output
    line = one_line(r.stderr)
    assert "need at least" in line and line.endswith(
        "— lower model.n_layer, model.n_embd, model.intermediate_size (or model.multiple_of), model.block_size, "
        "tokenizer.vocab_size or train.batch_size")



def test_memory_estimate_is_a_lower_bound_that_counts_what_training_keeps():
    from tiedlm.config import ModelConfig
    from tiedlm.model.counting import count_params_config, training_memory

    cfg = ModelConfig(n_layer=2, n_head=2, n_embd=16, block_size=16)
    m = training_memory(cfg, 100, 4)
    P = count_params_config(cfg, 100)["total"]
    assert m["params"] == P and m["state_bytes"] == 16 * P
    assert m["activation_bytes"] == 4 * 4 * 16 * (16 * 16 * 2 + 2 * 100)
    assert m["total_bytes"] == m["state_bytes"] + m["activation_bytes"]


def test_embeddings_that_cannot_fit_are_refused_after_the_data_before_any_write(tiny, tmp_path, monkeypatch):
    import torch

    import tiedlm.model.counting as counting

    # the model without its embeddings fits in 1 MiB, with them (V=62, d=16, B*T=256 logits) it does not
    monkeypatch.setattr(counting, "device_memory", lambda device: (110_000, "a test budget"))
    with pytest.raises(ConfigError, match="more than the 107.4 KiB of a test budget"):
        train_run(tiny(), out=tmp_path, progress=False)
    assert not (tmp_path / "tiny-s0").exists()
    del torch


def test_cpu_allocator_failure_is_the_out_of_memory_line(tiny, tmp_path, monkeypatch):
    from tiedlm.model.blocks import GPT

    def oom(self, idx, *args, **kwargs):  # training gives the targets too (the fused loss)
        raise RuntimeError("[enforce fail at alloc_cpu.cpp:117] data. DefaultCPUAllocator: not enough memory: "
                           "you tried to allocate 85899345920 bytes.")

    monkeypatch.setattr(GPT, "forward", oom)
    with pytest.raises(RunError, match="out of memory on this machine .CPU memory. — lower train.batch_size"):
        train_run(tiny(), out=tmp_path, progress=False)
    assert json.loads((tmp_path / "tiny-s0" / "report.json").read_text())["status"] == "failed"


# ---------------------------------------------------------------- a closed pipe, SIGTERM early


def test_closing_the_output_pipe_does_not_fail_the_run(tmp_path):
    cfg = tiny_file(tmp_path, "train.max_steps=40", "train.eval_every=2")
    # `tiedlm train ... 2>&1 | head -1`: one pipe for both streams, closed after its first line
    read, write = os.pipe()
    proc = child(tmp_path, "", "train", "--config", str(cfg), "--out", str(tmp_path / "runs"), "--quiet",
                 stdout=write, stderr=write)
    os.close(write)
    with os.fdopen(read) as pipe:
        first = pipe.readline()
    assert first  # the run said something, then lost its reader
    assert proc.wait(timeout=120) == 0
    report = json.loads((tmp_path / "runs" / "tiny-s0" / "report.json").read_text())
    assert report["status"] == "finished" and report["steps"] == 40


def test_sigterm_while_preparing_data_behaves_as_ctrl_c(tmp_path):
    slow = ("import time, tiedlm.data as d\norig = d.prepare_data\n"
            "def slow(*a, **k):\n    print('PREPARING', flush=True); time.sleep(60); return orig(*a, **k)\n"
            "d.prepare_data = slow")
    proc = child(tmp_path, slow, "train", "--config", str(tiny_file(tmp_path)), "--out", str(tmp_path / "runs"),
                 "--quiet")
    assert proc.stdout.readline().strip() == "PREPARING"
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 143
    assert "SIGTERM" in one_line(err) and "nothing of the run was written" in err
    assert not (tmp_path / "runs" / "tiny-s0").exists()


def test_the_same_weights_write_the_same_bytes_in_any_process(tmp_path):
    """safetensors orders a file's metadata by a hash map that changes between saves: two runs with
    the same weights wrote files (and manifest SHA-256s) that differed. tiedlm's files follow from
    the tensors and the metadata alone, load as safetensors with both intact, and are the same in
    another process."""
    import hashlib

    import torch
    from safetensors import safe_open

    tensors = {"transformer.wte.weight": torch.arange(12.0).view(3, 4), "b": torch.ones(5, dtype=torch.float64)}
    meta = {"tied": "True", "vocab_size": "3", "tiedlm_version": "0.1.0"}
    paths = [tmp_path / f"{i}.safetensors" for i in range(6)]
    for i, path in enumerate(paths):  # the metadata given in other orders, too
        checkpoints.write_safetensors(path, tensors, dict(sorted(meta.items(), reverse=bool(i % 2))))
    digests = {hashlib.sha256(p.read_bytes()).hexdigest() for p in paths}
    assert len(digests) == 1
    loaded = load_file(str(paths[0]))
    assert loaded.keys() == tensors.keys() and all(torch.equal(loaded[k], tensors[k]) for k in tensors)
    with safe_open(str(paths[0]), "pt") as f:
        assert f.metadata() == meta
    assert int.from_bytes(paths[0].read_bytes()[:8], "little") % 8 == 0  # the data stays 8-byte aligned
    code = ("import sys, torch, hashlib; from pathlib import Path; from tiedlm.runs import checkpoints; "
            "t = {'transformer.wte.weight': torch.arange(12.0).view(3, 4), 'b': torch.ones(5, dtype=torch.float64)}; "
            "checkpoints.write_safetensors(Path(sys.argv[1]), t, "
            "{'tiedlm_version': '0.1.0', 'vocab_size': '3', 'tied': 'True'}); "
            "print(hashlib.sha256(Path(sys.argv[1]).read_bytes()).hexdigest())")
    other = subprocess.run([sys.executable, "-c", code, str(tmp_path / "other.safetensors")], capture_output=True,
                           text=True, timeout=120)
    assert other.returncode == 0, other.stderr
    assert {other.stdout.strip()} == digests
