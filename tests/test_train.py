"""Training end to end on tiny configs: the run folder, its rules, exact resume, divergence."""

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from tiedlm.runs import checkpoints
from tiedlm import runs
from tiedlm.errors import ConfigError, ConfigMismatchError, DivergedError, Interrupted, RunError
from tiedlm.train import train_run
from tiedlm.config import budget_steps
from tiedlm.train.step import lr_at, untie_step

RUN_FILES = {"config.yaml", "metrics.jsonl", "report.json", "report.md", "tokenizer", "checkpoints"}


def weights(run_dir: Path) -> dict:
    return load_file(str(checkpoints.latest_checkpoint(run_dir) / checkpoints.MODEL_FILE))


def metric_rows(run_dir: Path) -> list:
    """The deterministic part of metrics.jsonl (timings excluded)."""
    return [(r["kind"], r["step"], r.get("split"), r.get("loss"), r.get("grad_norm"))
            for r in runs.read_metrics(run_dir)]


def snapshot(folder: Path) -> dict:
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in folder.rglob("*")
            if p.is_file() and p.name != runs.LOCK}


def test_run_folder_has_every_file_and_an_honest_report(tiny, tmp_path):
    run = train_run(tiny(), out=tmp_path, progress=False)
    assert run == tmp_path / "tiny-s0"
    assert RUN_FILES <= {p.name for p in run.iterdir()}
    assert not (run / runs.LOCK).exists()
    r = json.loads((run / "report.json").read_text())
    assert r["status"] == "finished" and r["steps"] == 12
    assert r["tokens_seen"] == 12 * 4 * 16
    p = r["params"]
    assert p["tied"] and p["lm_head"] == 0 and p["saved_by_tying"] == p["wte"] == p["model_vocab_size"] * 16
    for split in ("validation", "test"):
        f = r["final"][split]
        assert f["perplexity"] == pytest.approx(torch.tensor(f["loss"]).exp().item(), rel=1e-6)
        # top 10%, next 40%, rest 50%, unseen, and <unk> (the word tokenizer's own bucket)
        assert f["bits_per_byte"] > 0 and [b["name"] for b in f["buckets"]][-2:] == ["unseen", "<unk>"]
        assert len(f["buckets"]) == 5 and sum(b["tokens"] for b in f["buckets"]) == f["tokens"]
        assert sum(b["tokens"] for b in f["mass_buckets"]) == f["tokens"]
    assert r["floor"]["perplexity_per_word"] > 1
    md = (run / "report.md").read_text()
    assert "saved by tying" in md and "floor" in md.lower() and "bits/byte" in md
    kinds = {m["kind"] for m in runs.read_metrics(run)}
    assert {"train", "eval", "final"} <= kinds
    # the tied checkpoint stores one V x d matrix
    w = weights(run)
    assert "lm_head.weight" not in w and "transformer.wte.weight" in w


def test_untied_run_stores_two_matrices(tiny, tmp_path):
    run = train_run(tiny("model.tie_embeddings=false"), out=tmp_path, progress=False)
    w = weights(run)
    assert w["lm_head.weight"].shape == w["transformer.wte.weight"].shape
    r = json.loads((run / "report.json").read_text())
    assert r["params"]["lm_head"] == r["params"]["wte"] and r["params"]["saved_by_tying"] == 0


def test_finished_run_is_left_alone(tiny, tmp_path, capsys):
    run = train_run(tiny(), out=tmp_path, progress=False)
    before = snapshot(run)
    assert train_run(tiny(), out=tmp_path, progress=False) == run
    assert "nothing to do" in capsys.readouterr().err
    assert snapshot(run) == before


def test_different_config_is_refused_with_the_keys(tiny, tmp_path):
    run = train_run(tiny(), out=tmp_path, progress=False)
    before = snapshot(run)
    with pytest.raises(ConfigMismatchError) as info:
        train_run(tiny("model.n_embd=32", "train.lr=0.002"), out=tmp_path, progress=False)
    assert "model.n_embd" in str(info.value) and "train.lr" in str(info.value)
    assert info.value.keys == ["model.n_embd", "train.lr"] and info.value.exit_code == 2
    assert snapshot(run) == before
    train_run(tiny("model.n_embd=32"), out=tmp_path, overwrite=True, progress=False)
    assert json.loads((run / "report.json").read_text())["config"]["model"]["n_embd"] == 32


@pytest.mark.parametrize("stop", [2, 4, 6, 7, 12], ids=lambda s: f"stop{s}")
def test_interrupt_and_resume_is_bit_identical(tiny, tmp_path, stop):
    """Stops before the first checkpoint (2), at one (4), right after untie_at (6), between
    checkpoints (7) and at the last step (12); dropout > 0 so that RNG state matters."""
    cfg = tiny("model.untie_at=0.5", "model.dropout=0.1")
    assert untie_step(cfg, budget_steps(cfg)) == 6
    ref = train_run(cfg, out=tmp_path / "a", progress=False)
    with pytest.raises(Interrupted) as info:
        train_run(cfg, out=tmp_path / "b", progress=False, stop_after_step=stop)
    assert info.value.exit_code == 130
    run = tmp_path / "b" / "tiny-s0"
    assert json.loads((run / "report.json").read_text())["status"] == "interrupted"
    assert train_run(cfg, out=tmp_path / "b", progress=False) == run
    wa, wb = weights(ref), weights(run)
    assert wa.keys() == wb.keys() and "lm_head.weight" in wb  # untied by the end
    for k in wa:
        assert torch.equal(wa[k], wb[k]), k
    assert metric_rows(ref) == metric_rows(run)
    steps = [r["step"] for r in runs.read_metrics(run) if r["kind"] == "train"]
    assert steps == list(range(1, 13))  # no duplicated or missing steps
    fa = json.loads((ref / "report.json").read_text())["final"]
    fb = json.loads((run / "report.json").read_text())["final"]
    assert fa == fb


def test_untie_at_gives_equal_then_diverging_matrices(tiny, tmp_path):
    cfg = tiny("model.untie_at=0.5")
    with pytest.raises(Interrupted):
        train_run(cfg, out=tmp_path, progress=False, stop_after_step=6)
    run = tmp_path / "tiny-s0"
    w = weights(run)
    assert torch.equal(w["lm_head.weight"], w["transformer.wte.weight"])  # just split: identical
    train_run(cfg, out=tmp_path, progress=False)
    w = weights(run)
    assert not torch.equal(w["lm_head.weight"], w["transformer.wte.weight"])
    r = json.loads((run / "report.json").read_text())
    assert r["untied_at_step"] == 6
    assert r["params_after_untie"]["lm_head"] == r["params"]["wte"]
    assert [m["step"] for m in runs.read_metrics(run) if m["kind"] == "untie"] == [6]


def test_untie_copies_the_adamw_state():
    from tiedlm.config import ModelConfig, TrainConfig
    from tiedlm.model.blocks import GPT
    from tiedlm.train.step import build_optimizer, untie_with_optimizer

    m = GPT(ModelConfig(n_layer=1, n_head=1, n_embd=8, block_size=4, tie_embeddings=True), 11)
    opt = build_optimizer(m, TrainConfig(max_steps=1))
    m(torch.randint(0, 11, (2, 4))).sum().backward()
    opt.step()
    untie_with_optimizer(m, opt)
    a, b = opt.state[m.transformer.wte.weight], opt.state[m.lm_head.weight]
    for key in ("exp_avg", "exp_avg_sq", "step"):
        assert torch.equal(a[key], b[key]) and a[key] is not b[key]
    # and the optimizer order equals that of a model built untied (what resume relies on)
    u = GPT(ModelConfig(n_layer=1, n_head=1, n_embd=8, block_size=4, tie_embeddings=False), 11)
    names = {id(p): n for n, p in list(m.named_parameters()) + list(u.named_parameters())}
    order = lambda o: [[names[id(p)] for p in g["params"]] for g in o.param_groups]  # noqa: E731
    assert order(opt) == order(build_optimizer(u, TrainConfig(max_steps=1)))


def test_tied_parameter_appears_once_in_the_optimizer(tiny):
    from tiedlm.model.blocks import GPT
    from tiedlm.train.step import build_optimizer

    cfg = tiny()
    m = GPT(cfg.model, 50)
    opt = build_optimizer(m, cfg.train)
    ids = [id(p) for g in opt.param_groups for p in g["params"]]
    assert len(ids) == len(set(ids)) == len(list(m.parameters()))
    assert sum(p.numel() for g in opt.param_groups for p in g["params"]) == sum(p.numel() for p in m.parameters())


@pytest.mark.parametrize("decay", [True, False])
def test_weight_decay_groups(tiny, decay):
    from tiedlm.model.blocks import GPT
    from tiedlm.train.step import build_optimizer

    cfg = tiny(f"train.decay_embeddings={str(decay).lower()}", "model.tie_embeddings=false")
    m = GPT(cfg.model, 50)
    opt = build_optimizer(m, cfg.train)
    decayed = {id(p) for p in opt.param_groups[0]["params"]}
    assert (id(m.transformer.wte.weight) in decayed) == decay
    assert (id(m.lm_head.weight) in decayed) == decay
    assert id(m.transformer.h[0].attn.c_attn.weight) in decayed
    assert id(m.transformer.h[0].ln_1.weight) not in decayed


def test_lr_schedule():
    from tiedlm.config import TrainConfig

    t = TrainConfig(max_steps=100, lr=1.0, min_lr=0.1, warmup_steps=10)
    assert lr_at(0, 100, t) == pytest.approx(0.1)
    assert lr_at(9, 100, t) == pytest.approx(1.0)
    assert lr_at(55, 100, t) == pytest.approx(0.55)  # half way through the cosine
    assert lr_at(100, 100, t) == pytest.approx(0.1)


def _poison_forward(monkeypatch, bad_calls, value=float("nan")):
    """Make the model's training forward return a non-finite loss (it is given the targets) on the
    calls in bad_calls."""
    from tiedlm.model.blocks import GPT

    real = GPT.forward
    calls = {"n": 0}

    def forward(self, idx, *args, **kwargs):
        out = real(self, idx, *args, **kwargs)
        if self.training:
            calls["n"] += 1
            if calls["n"] in bad_calls:
                return out * value
        return out

    monkeypatch.setattr(GPT, "forward", forward)


def test_nan_loss_stops_as_diverged_keeping_the_last_checkpoint(tiny, tmp_path, monkeypatch):
    _poison_forward(monkeypatch, range(6, 100))  # step 6 on goes bad; the checkpoint at step 4 exists
    with pytest.raises(DivergedError) as info:
        train_run(tiny(), out=tmp_path, progress=False)
    assert info.value.exit_code == 1 and "step 6" in str(info.value) and "step-0000004" in str(info.value)
    run = tmp_path / "tiny-s0"
    r = json.loads((run / "report.json").read_text())
    assert r["status"] == "diverged" and r["diverged_at_step"] == 6
    assert checkpoints.latest_checkpoint(run).name == "step-0000004"
    checkpoints.verify_checkpoint(checkpoints.latest_checkpoint(run))


def test_max_skipped_skips_bounded_non_finite_steps(tiny, tmp_path, monkeypatch):
    _poison_forward(monkeypatch, {5}, float("inf"))
    run = train_run(tiny("train.max_skipped=1"), out=tmp_path, progress=False)
    r = json.loads((run / "report.json").read_text())
    assert r["status"] == "finished" and r["skipped_steps"] == 1
    assert [m["step"] for m in runs.read_metrics(run) if m["kind"] == "skipped"] == [5]


def _interrupted_run(tiny, tmp_path) -> Path:
    with pytest.raises(Interrupted):
        train_run(tiny(), out=tmp_path, progress=False, stop_after_step=5)
    return tmp_path / "tiny-s0"


@pytest.mark.parametrize("damage", ["truncate", "flip"])
def test_damaged_checkpoint_is_refused_and_left_alone(tiny, tmp_path, damage):
    run = _interrupted_run(tiny, tmp_path)
    f = checkpoints.latest_checkpoint(run) / checkpoints.MODEL_FILE
    data = bytearray(f.read_bytes())
    if damage == "truncate":
        data = data[:-1]
    else:
        data[len(data) // 2] ^= 0xFF
    f.write_bytes(bytes(data))
    before = snapshot(run)
    with pytest.raises(RunError, match="SHA-256"):
        train_run(tiny(), out=tmp_path, progress=False)
    assert snapshot(run) == before


def test_corrupt_report_and_newer_format_are_refused(tiny, tmp_path):
    run = _interrupted_run(tiny, tmp_path)
    good = (run / "report.json").read_text()
    (run / "report.json").write_text(good[: len(good) // 2])
    before = snapshot(run)
    with pytest.raises(RunError, match="not valid JSON"):
        train_run(tiny(), out=tmp_path, progress=False)
    assert snapshot(run) == before
    newer = json.loads(good)
    newer["format"] = runs.FORMAT + 1
    (run / "report.json").write_text(json.dumps(newer))
    with pytest.raises(RunError, match="newer tiedlm"):
        train_run(tiny(), out=tmp_path, progress=False)


def test_held_lock_is_refused_with_the_pid(tiny, tmp_path):
    import os

    run = tmp_path / "tiny-s0"
    with runs.RunLock(run):
        with pytest.raises(RunError, match=f"in use by process {os.getpid()}"):
            train_run(tiny(), out=tmp_path, progress=False)
    train_run(tiny(), out=tmp_path, progress=False)  # free again


def test_lock_left_by_a_dead_process_is_taken_over(tiny, tmp_path, capsys):
    import socket

    run = tmp_path / "tiny-s0"
    run.mkdir(parents=True)
    (run / runs.LOCK).write_text(json.dumps({"pid": 2**22 + 12345, "host": socket.gethostname()}))
    train_run(tiny(), out=tmp_path, progress=False)
    assert "took over the lock" in capsys.readouterr().err
    assert json.loads((run / "report.json").read_text())["status"] == "finished"


@pytest.mark.parametrize("name", ["../escape", "/abs/path", "a/b", "..", ".hidden", "-x", " lead", "a\nb", "x" * 201])
def test_path_escaping_run_names_are_refused(tiny, tmp_path, name):
    with pytest.raises(ConfigError, match="run name .* use letters, digits") as info:
        train_run(tiny(), out=tmp_path / "runs", name=name, progress=False)
    assert info.value.exit_code == 2
    assert not (tmp_path / "escape").exists() and not (tmp_path / "runs").exists()


def test_foreign_folder_is_not_clobbered(tiny, tmp_path):
    run = tmp_path / "tiny-s0"
    run.mkdir()
    (run / "notes.txt").write_text("mine")
    with pytest.raises(RunError, match="not a tiedlm run"):
        train_run(tiny(), out=tmp_path, progress=False)
    assert (run / "notes.txt").read_text() == "mine"


def test_failed_overwrite_leaves_the_finished_run_alone(tiny, tmp_path):
    from tiedlm.errors import ConfigError

    run = train_run(tiny(), out=tmp_path, progress=False)
    before = snapshot(run)
    if torch.cuda.is_available():
        pytest.skip("needs a machine without CUDA")
    with pytest.raises(ConfigError, match="no CUDA device"):
        train_run(tiny("train.device=cuda"), out=tmp_path, overwrite=True, progress=False)
    assert snapshot(run) == before


def test_eval_split_missing_from_the_data_is_refused_before_anything_is_written(tiny, tmp_path):
    text = tmp_path / "t.txt"
    text.write_text("".join(f"line {i} of a small text file with words\n" for i in range(400)))
    cfg = tiny("data.path=text", f"data.data_files={text}", "data.test_fraction=0")
    with pytest.raises(Exception, match="eval.splits names 'test'") as info:
        train_run(cfg, out=tmp_path / "runs", progress=False)
    assert info.value.exit_code == 2
    assert not (tmp_path / "runs" / "tiny-s0").exists()


def test_resume_refuses_when_the_data_changed(tiny, tmp_path):
    text = tmp_path / "t.txt"
    text.write_text("".join(f"line {i % 50} of a small text file with words\n" for i in range(600)))
    cfg = tiny("data.path=text", f"data.data_files={text}")
    with pytest.raises(Interrupted):
        train_run(cfg, out=tmp_path / "runs", progress=False, stop_after_step=5)
    run = tmp_path / "runs" / "tiny-s0"
    before = snapshot(run)
    text.write_text(text.read_text() + "a new line with new words entirely\n")
    with pytest.raises(RunError, match="changed since the run started"):
        train_run(cfg, out=tmp_path / "runs", progress=False)
    assert snapshot(run) == before


def test_trim_metrics_drops_final_records(tmp_path):
    runs.append_metrics(tmp_path, [{"kind": "train", "step": 1}, {"kind": "train", "step": 2},
                                   {"kind": "final", "step": 2, "split": "validation"},
                                   {"kind": "train", "step": 3}])
    with open(tmp_path / runs.METRICS, "a") as f:
        f.write('{"kind": "train", "st')  # a line torn by a kill
    runs.trim_metrics(tmp_path, 2)
    assert [(r["kind"], r["step"]) for r in runs.read_metrics(tmp_path)] == [("train", 1), ("train", 2)]


def test_run_files_are_readable_by_others(tiny, tmp_path):
    import stat

    run = train_run(tiny(), out=tmp_path, progress=False)
    for name in ("report.json", "report.md", "config.yaml"):
        assert stat.S_IMODE((run / name).stat().st_mode) & 0o044, name  # not mkstemp's 0600


def test_untie_at_needs_two_steps(tiny, tmp_path):
    from tiedlm.errors import ConfigError

    with pytest.raises(ConfigError, match="at least 2 training steps"):
        train_run(tiny("model.untie_at=0.5", "train.max_steps=1"), out=tmp_path, progress=False)
    assert not any(tmp_path.iterdir())


def test_checkpoint_saved_twice_at_one_step_keeps_a_valid_latest(tmp_path):
    for _ in range(2):
        checkpoints.save_checkpoint(tmp_path, 4, {"w": torch.zeros(2)}, {"tied": True}, {"step": 4})
    latest = checkpoints.latest_checkpoint(tmp_path)
    assert latest.name == "step-0000004-1"
    checkpoints.verify_checkpoint(latest)
    assert [p.name for p in (tmp_path / "checkpoints").iterdir() if p.is_dir()] == ["step-0000004-1"]


def test_full_disk_during_a_checkpoint_keeps_the_previous_one(tiny, tmp_path, monkeypatch):
    import errno

    real = checkpoints.save_checkpoint
    calls = {"n": 0}

    def failing(run_dir, step, *a, **k):
        calls["n"] += 1
        if calls["n"] == 2:  # the checkpoint at step 8
            raise OSError(errno.ENOSPC, "No space left on device", str(run_dir))
        return real(run_dir, step, *a, **k)

    monkeypatch.setattr(checkpoints, "save_checkpoint", failing)
    with pytest.raises(RunError, match="No space left on device.*free some disk space"):
        train_run(tiny(), out=tmp_path, progress=False)
    run = tmp_path / "tiny-s0"
    r = json.loads((run / "report.json").read_text())
    assert r["status"] == "failed" and "No space left" in r["error"]
    assert checkpoints.latest_checkpoint(run).name == "step-0000004"
    monkeypatch.setattr(checkpoints, "save_checkpoint", real)
    train_run(tiny(), out=tmp_path, progress=False)  # the same command resumes
    r = json.loads((run / "report.json").read_text())
    assert r["status"] == "finished" and r["resumed_at_steps"] == [4]


def test_out_of_memory_is_a_one_line_error(tiny, tmp_path, monkeypatch):
    from tiedlm.model.blocks import GPT

    def oom(self, idx, *args, **kwargs):  # training gives the targets too (the fused loss)
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 GiB")

    monkeypatch.setattr(GPT, "forward", oom)
    with pytest.raises(RunError, match="out of memory on the device — lower train.batch_size"):
        train_run(tiny(), out=tmp_path, progress=False)
    r = json.loads((tmp_path / "tiny-s0" / "report.json").read_text())
    assert r["status"] == "failed"


def test_resume_accepts_other_operational_settings(tiny, tmp_path):
    with pytest.raises(Interrupted):
        train_run(tiny("train.threads=1"), out=tmp_path, progress=False, stop_after_step=5)
    run = train_run(tiny("train.threads=2", "train.checkpoint_every=3", "train.log_every=2"), out=tmp_path,
                    progress=False)
    r = json.loads((run / "report.json").read_text())
    assert r["status"] == "finished" and r["resumed_at_steps"] == [5]
    assert r["config"]["train"]["threads"] == 2  # the folder records the settings it finished with
    with pytest.raises(ConfigMismatchError, match="train.lr"):
        train_run(tiny("train.lr=0.5"), out=tmp_path, progress=False)


def test_the_finished_line_says_how_many_epochs_the_budget_was(tiny, tmp_path, monkeypatch, capsys):
    """On one's own data the budget in tokens says little; the epochs of the training split do."""
    import json as _json

    from tiedlm.train import train_run

    monkeypatch.setenv("TIEDLM_CACHE", str(tmp_path / "cache"))
    run = train_run(tiny(), out=tmp_path / "runs", progress=False)
    report = _json.loads((run / "report.json").read_text())
    from tiedlm.data import prepare_data

    train = len(prepare_data(tiny(), progress=False).splits["train"].tokens)
    line = next(x for x in capsys.readouterr().err.splitlines() if x.startswith("finished "))
    assert f"({report['tokens_seen'] / train:.1f} epochs of its {train:,} training tokens): validation ppl" in line
