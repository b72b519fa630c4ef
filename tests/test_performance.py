"""The fast paths compute what the plain ones do (correctness only: timings belong in
scripts/bench.py): the bench's plain loss (bench.plain_loss, timed against the fused loss, which is
tests/test_fused_loss.py's) gives the plain loss and gradients chunked as whole, tied and untied,
and never holds a whole batch's logits; evaluation in inference mode scores what a plain forward
does; the counts need no torch; the bench itself runs (--quick) so that it cannot rot."""

import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from torch.nn import functional as F

from tests.conftest import script_module
from tiedlm.config import ModelConfig
from tiedlm.model.blocks import GPT

ROOT = Path(__file__).resolve().parents[1]


def bench_module():
    """scripts/bench.py as a module (it runs nothing on import)."""
    return script_module("bench")


plain_loss = bench_module().plain_loss


def model_and_batch(tied: bool, V: int = 500):
    torch.manual_seed(0)
    model = GPT(ModelConfig(n_layer=2, n_head=2, n_embd=32, block_size=16, tie_embeddings=tied), V)
    x = torch.randint(0, V, (4, 17), generator=torch.Generator().manual_seed(1))
    return model, x[:, :-1], x[:, 1:]


def grads(model, loss) -> dict:
    model.zero_grad(set_to_none=True)
    loss.backward()
    return {n: p.grad.clone() for n, p in model.named_parameters()}


@pytest.mark.parametrize("tied", [True, False])
def test_chunked_cross_entropy_equals_the_plain_loss_and_gradients(tied):
    model, x, y = model_and_batch(tied)
    plain = plain_loss(model, x, y)  # 64 tokens x 500 x 4 bytes: far below the chunking threshold
    reference = F.cross_entropy(model(x).view(-1, 500), y.reshape(-1))
    assert plain.item() == reference.item()
    g_plain = grads(model, plain)
    chunked = plain_loss(model, x, y, chunk_bytes=7 * 500 * 4)  # 7 tokens a chunk: 10, the last short
    assert chunked.item() == pytest.approx(plain.item(), rel=1e-6)
    g_chunked = grads(model, chunked)
    assert g_plain.keys() == g_chunked.keys()
    for name in g_plain:
        assert torch.allclose(g_plain[name], g_chunked[name], rtol=1e-5, atol=1e-7), name


def test_chunked_loss_never_holds_a_whole_batchs_logits():
    model, x, y = model_and_batch(True)
    rows = []
    linear = F.linear

    def counting(h, weight, bias=None):  # the head is the F.linear whose output has V = 500 columns
        out = linear(h, weight, bias)
        if out.shape[-1] == 500:
            rows.append(out.numel() // 500)
        return out

    F.linear = counting
    try:
        plain_loss(model, x, y, chunk_bytes=7 * 500 * 4).backward()  # backward recomputes each chunk
    finally:
        F.linear = linear
    assert max(rows) == 7 and sum(rows) == 2 * 64  # forward and the recomputation, 7 tokens at a time


def test_evaluation_in_inference_mode_scores_what_a_plain_forward_does():
    from tiedlm.evaluate import score_tokens

    model, _, _ = model_and_batch(False)
    tokens = np.random.default_rng(0).integers(0, 500, size=16 * 5 + 1)
    targets, nll = score_tokens(model, tokens, 16, 16, 2, torch.device("cpu"))
    x = torch.from_numpy(tokens[:-1].reshape(5, 16).astype(np.int64))
    y = torch.from_numpy(tokens[1:].reshape(5, 16).astype(np.int64))
    with torch.no_grad():
        plain = F.cross_entropy(model.eval()(x).reshape(-1, 500), y.reshape(-1), reduction="none")
    assert np.allclose(nll, plain.double().numpy(), rtol=1e-6, atol=1e-7)
    assert math.isclose(nll.mean(), plain.mean().item(), rel_tol=1e-6)


def test_the_counts_import_no_torch():
    code = ("import sys; from tiedlm.model.counting import count_params_config, flops_per_token; "
            "from tiedlm.config import ModelConfig; count_params_config(ModelConfig(), 50257); "
            "print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    assert out.stdout.strip() == "False"


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA (fused AdamW is used on CUDA only)")
def test_adamw_is_fused_on_cuda():  # pragma: no cover - no GPU on the CI machine
    from tiedlm.config import TrainConfig
    from tiedlm.train.step import build_optimizer

    model = GPT(ModelConfig(n_layer=1, n_head=2, n_embd=32, block_size=16), 100).cuda()
    assert build_optimizer(model, TrainConfig(max_steps=1)).defaults.get("fused") is True


def test_adamw_on_the_cpu_keeps_the_default_implementation():
    from tiedlm.config import TrainConfig
    from tiedlm.train.step import build_optimizer

    model, _, _ = model_and_batch(True)
    assert not build_optimizer(model, TrainConfig(max_steps=1)).defaults.get("fused")


def _adam_steps(optimizer, model, x, y, n=4) -> None:
    for _ in range(n):
        optimizer.zero_grad(set_to_none=True)
        F.cross_entropy(model(x).flatten(0, 1), y.flatten()).backward()
        optimizer.step()


@pytest.mark.parametrize("tied", [True, False])
def test_tiedlm_s_adamw_steps_loads_and_saves_as_torch_s_to_the_bit(tied):
    """build_optimizer's AdamW is torch's, over the groups it builds (a tied matrix once): the same
    weights and moments to the bit over steps as torch.optim.AdamW over those groups, a state dict
    either one loads, and untie_at's split."""
    from tiedlm.config import TrainConfig
    from tiedlm.train.step import build_optimizer, untie_with_optimizer

    tcfg = TrainConfig(max_steps=1, lr=1e-2, weight_decay=0.1)
    (ours_model, x, y), (theirs_model, _, _) = model_and_batch(tied), model_and_batch(tied)
    ours = build_optimizer(ours_model, tcfg)
    assert type(ours) is torch.optim.AdamW
    params = dict(theirs_model.named_parameters())
    theirs = torch.optim.AdamW([{**g, "params": [params[n] for n in names]}  # the same groups, in order
                                for g, names in zip(ours.param_groups, _group_names(ours, ours_model))])
    _adam_steps(ours, ours_model, x, y)
    _adam_steps(theirs, theirs_model, x, y)
    if tied:  # untie_at: W_out takes a copy of E's state, then both go on
        untie_with_optimizer(ours_model, ours)
        untie_with_optimizer(theirs_model, theirs)
        _adam_steps(ours, ours_model, x, y, 2)
        _adam_steps(theirs, theirs_model, x, y, 2)
    a, b = ours.state_dict(), theirs.state_dict()
    assert a["param_groups"] == b["param_groups"] and a["state"].keys() == b["state"].keys()
    for k in a["state"]:
        assert all(torch.equal(a["state"][k][m], b["state"][k][m]) for m in ("step", "exp_avg", "exp_avg_sq"))
    assert all(torch.equal(p, q) for p, q in zip(ours_model.parameters(), theirs_model.parameters()))
    ours.load_state_dict(b)  # and back: one more step each lands on the same bits
    theirs.load_state_dict(a)
    _adam_steps(ours, ours_model, x, y, 1)
    _adam_steps(theirs, theirs_model, x, y, 1)
    assert all(torch.equal(p, q) for p, q in zip(ours_model.parameters(), theirs_model.parameters()))


def _group_names(optimizer, model) -> list:
    name = {id(p): n for n, p in model.named_parameters()}
    return [[name[id(p)] for p in g["params"]] for g in optimizer.param_groups]


@pytest.mark.bench
def test_the_bench_on_a_device_this_machine_lacks_says_so_in_one_line_naming_its_own_option():
    # cuda:99 is missing on a CPU machine and on any GPU machine alike; the modes that take --device
    # (the tables, --counted, --chunks) resolve it through bench_models.bench_device, and main()
    # turns its error into this line
    out = subprocess.run([sys.executable, str(ROOT / "scripts" / "bench.py"), "--quick", "--device", "cuda:99"],
                         capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert out.returncode == 1
    assert "Traceback" not in out.stderr and len(out.stderr.strip().splitlines()) == 1, out.stderr
    assert out.stderr.startswith("bench: error: --device is cuda:99 ")
    assert "--set train.device" not in out.stderr  # the fix is the bench's own option, not the CLI's


@pytest.mark.bench
def test_bench_quick_runs_and_reports_every_implementation(tmp_path):
    cmd = [sys.executable, str(ROOT / "scripts" / "bench.py"), "--quick", "--json", str(tmp_path / "b.json")]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-2000:]
    rows = [line for line in out.stdout.splitlines() if line.startswith(("| tiedlm", "| transf", "| arch: hf"))]
    want = ["tiedlm tied", "tiedlm untied", "tiedlm plain loss tied", "tiedlm plain loss untied"]
    archhf = []
    try:
        import transformers  # noqa: F401

        want += ["transformers tied", "transformers untied"]
        archhf = ["arch: hf tied", "arch: hf untied"]  # transformers' blocks under tiedlm's loop and tie layer
    except ImportError:
        pass
    # the tiny GPT-2 shape, then the tiny llama one
    assert [r.split("|")[1].strip() for r in rows] == want + archhf + want + archhf
    if archhf:
        assert "tiedlm's own block / arch: hf" in out.stdout
    assert "tiny llama (llama: 1 key/value heads" in out.stdout
    assert all(float(r.split("|")[2].replace(",", "")) > 0 for r in rows)
    heads = [line for line in out.stdout.splitlines() if line.startswith("tiny")]
    assert len(heads) == 2 and all(float(h.split("same turns ")[1].split()[0].replace(",", "")) > 0 for h in heads)
    bounds = [line for line in out.stdout.splitlines() if line.startswith("counted work alone (tied; ")]
    assert len(bounds) == 2 and all("were the rest free" in line for line in bounds)
    assert all(int(line.split("; ")[1].split()[0]) > 0 for line in bounds)  # calls replayed
    result = json.loads((tmp_path / "b.json").read_text())
    timers = [e["pid"] for e in result["shapes"]] + [e["counted"]["pid"] for e in result["shapes"]]
    assert len(set(timers)) == 4 and result["pid"] not in timers  # each shape and its counted line: a fresh process
    tables = [rows[:len(want + archhf)], rows[len(want + archhf):]]  # the GPT-2 shape's rows, then the llama one's
    for e, shape_rows in zip(result["shapes"], tables):  # page faults a step, by the rates' labels, in the last column
        table = [r.split("|") for r in shape_rows]
        assert list(e["faults_per_step"]) == list(e["train"]) == [r[1].strip() for r in table]
        assert [f"{v:,.0f}" for v in e["faults_per_step"].values()] == [r[7].strip() for r in table]
    assert result["settings"]["steps"] == 1 and result["failed_shapes"] == []


@pytest.mark.bench
def test_the_bench_counts_the_page_faults_of_memory_mapped_afresh():
    import mmap

    bench, pages = bench_module(), 4096
    block = mmap.mmap(-1, pages * mmap.PAGESIZE)  # mapped, not yet touched: no page is in memory
    if hasattr(mmap, "MADV_NOHUGEPAGE"):
        block.madvise(mmap.MADV_NOHUGEPAGE)  # one fault a small page, whatever the system's huge-page setting
    before = bench.minor_faults()
    for i in range(pages):
        block[i * mmap.PAGESIZE] = 1
    assert bench.minor_faults() - before >= pages


@pytest.mark.bench
def test_each_implementation_s_page_faults_are_its_own(monkeypatch):
    """The models take turns; the faults between a turn's first and last step go to that model's label."""
    import mmap

    bench, pages = bench_module(), 256
    kept = []

    def step_fn(kind, model, opt, x, amp):
        def touch_fresh_pages():
            block = mmap.mmap(-1, pages * mmap.PAGESIZE)
            if hasattr(mmap, "MADV_NOHUGEPAGE"):
                block.madvise(mmap.MADV_NOHUGEPAGE)
            for i in range(pages):
                block[i * mmap.PAGESIZE] = 1
            kept.append(block)  # never unmapped and reused: each step's pages are new

        return touch_fresh_pages if (kind, model) == ("plain", "untied") else (lambda: None)

    monkeypatch.setattr(bench, "tiedlm_model", lambda shape, tied, device: ("tied" if tied else "untied", None))
    monkeypatch.setattr(bench, "hf_model", lambda shape, tied, device: ("tied" if tied else "untied", None))
    monkeypatch.setattr(bench, "archhf_model", lambda shape, tied, device: None)  # transformers' blocks: not timed here
    monkeypatch.setattr(bench, "step_fn", step_fn)
    faults: dict = {}
    rates = bench.train_rates(bench.QUICK_SHAPES[0], torch.device("cpu"), "fp32", 2, 3, 1, faults=faults)
    assert set(faults) == set(rates) and len(rates) == 6
    assert faults["tiedlm plain loss untied"] >= pages
    assert all(v < pages / 4 for k, v in faults.items() if k != "tiedlm plain loss untied"), faults


@pytest.mark.bench
def test_a_shape_whose_timing_process_fails_is_left_out_with_a_line_and_the_bench_goes_on(monkeypatch, capsys):
    bench = bench_module()
    args = type("Args", (), {"steps": 1, "rounds": 1, "warmup": 1, "eval_batches": 2})()
    for code, stdout in ((1, ""), (0, ""), (0, "not json\n")):
        done = subprocess.CompletedProcess([], code, stdout=stdout, stderr="child: boom\n")
        monkeypatch.setattr(bench.subprocess, "run", lambda *a, **k: done)
        assert bench.shape_entry(bench.QUICK_SHAPES[0], torch.device("cpu"), "fp32", args, 64) is None
        err = capsys.readouterr().err.splitlines()
        assert err[0] == "child: boom" and err[1].startswith("tiny: its timing process gave no result (")


@pytest.mark.bench
def test_an_unknown_shape_is_one_line_before_anything_is_timed():
    out = subprocess.run([sys.executable, str(ROOT / "scripts" / "bench.py"), "--shapes", "base.yaml,nope"],
                         capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert out.returncode == 1 and out.stdout == ""
    assert out.stderr.strip().splitlines() == [
        "bench: error: unknown shape(s) ['nope'] in --shapes — name some of " + str([s[0] for s in bench_module().SHAPES])]


@pytest.mark.bench
def test_the_main_job_bench_can_run_auto_first_and_reports_jobs_1_first(tmp_path, monkeypatch):
    script_module("bench_load")
    main_job = script_module("bench_main_job")
    ran = []

    def fake(config, seeds, jobs, out):
        ran.append(jobs)
        return {"jobs": jobs, "seconds": {"1": 10.0, "auto": 8.0}[jobs], "verdict": "v"}

    monkeypatch.setattr(main_job, "run_command", fake)
    monkeypatch.setattr(main_job, "same_runs", lambda a, b: (3, 3))
    for auto_first, order in ((True, ["auto", "1"]), (False, ["1", "auto"])):
        ran.clear()
        result = main_job.pair(Path("c.yaml"), 1, 0, tmp_path, auto_first=auto_first)
        assert ran == order == result["order"]
        assert [r["jobs"] for r in result["runs"]] == ["1", "auto"] and result["ratio"] == pytest.approx(0.8)


@pytest.mark.bench
def test_the_main_job_bench_times_both_commands_and_tells_the_same_runs_from_changed_ones(tiny_yaml, tmp_path):
    """scripts/bench.py --main-job on a tiny config: both commands run into folders of their own,
    their runs are found the same to the bit, and one changed byte of a weights file is found."""
    script_module("bench_load")  # bench_main_job imports it by name, as bench.py's folder is on its path
    main_job = script_module("bench_main_job")
    result = main_job.pair(tiny_yaml, 1, 0, tmp_path)
    assert [r["jobs"] for r in result["runs"]] == ["1", "auto"] and all(r["seconds"] > 0 for r in result["runs"])
    assert (result["same_to_the_bit"], result["runs_compared"], result["same_verdict"]) == (2, 2, True)
    assert "lower perplexity than" in result["runs"][0]["verdict"]
    weights = sorted((tmp_path / "load0" / "jobs-auto").rglob("*.safetensors"))[0]
    data = bytearray(weights.read_bytes())
    data[-1] ^= 1  # the last bit of the last tensor
    weights.write_bytes(bytes(data))
    assert main_job.same_runs(tmp_path / "load0" / "jobs-1", tmp_path / "load0" / "jobs-auto") == (1, 2)
    (tmp_path / "empty").mkdir()
    with pytest.raises(RuntimeError, match="no finished runs"):  # never "0 of 0"
        main_job.same_runs(tmp_path / "load0" / "jobs-1", tmp_path / "empty")
