"""scripts/bench_counted.py: the work a step's FLOP count counts, recorded from a real training step
and replayed alone. The recorded matmuls' FLOPs are torch's own account of what the step ran, so
they cross-check tiedlm.model.counting.flops_per_token to the FLOP."""

import subprocess
import sys

import pytest
import torch

from tests.conftest import ROOT, script_module

pytestmark = pytest.mark.bench  # runs scripts/bench*.py: opt-in, python -m pytest -m bench
from tiedlm.model.counting import flops_per_token

counted = script_module("bench_counted")
models = script_module("bench_models")

SHAPES = [("gpt2", 2, 2, 32, 16, 4, 300), ("gpt2 one chunk row", 1, 4, 48, 8, 3, 700),
          ("llama", 2, 4, 64, 32, 2, 500, "llama")]


def recorded_step(shape, tied: bool):
    L, H, d, T, B, V = models.dims(shape)
    model, opt = models.tiedlm_model(shape, tied, torch.device("cpu"))
    x = torch.randint(0, V, (B, T + 1), generator=torch.Generator().manual_seed(0))
    return counted.record(models.step_fn("tiedlm", model, opt, x, None))


@pytest.mark.parametrize("tied", [True, False])
@pytest.mark.parametrize("shape", SHAPES, ids=[s[0] for s in SHAPES])
def test_the_matmuls_a_step_runs_are_the_flops_the_count_gives_them(shape, tied):
    """Every matmul of a training step (forward, backward through the fused loss, the weight
    gradients), as torch dispatched it, sums to flops_per_token's train FLOPs less attention's
    (which run in fused kernels and are counted as full T x T products): to the FLOP."""
    L, H, d, T, B, V = models.dims(shape)
    calls = recorded_step(shape, tied)
    per_token = flops_per_token(models.model_config(shape, tied), V)
    attention = 3 * L * 2 * 2 * T * d  # q@k^T and att@v per layer, forward and backward
    assert sum(counted.matmul_flops(f, a) for f, a, _ in calls) == B * T * (per_token["train"] - attention)
    kernels = [f.overloadpacket.__name__ for f, _, _ in calls if "scaled_dot_product" in f.overloadpacket.__name__]
    assert len(kernels) == 2 * L and sum(k.endswith("_backward") for k in kernels) == L


def layout(call):
    func, args, kwargs = call

    def one(x):
        return (x.shape, x.stride, x.dtype) if isinstance(x, counted.Spec) else x

    return func, [one(a) for a in args], {k: one(v) for k, v in kwargs.items() if v is not None}


@pytest.mark.parametrize("warm", [False, True])
def test_a_replay_runs_the_recorded_calls_on_tensors_of_their_layouts(warm):
    calls = recorded_step(SHAPES[0], True)
    replay = counted.Replay(calls, warm=warm)
    assert [layout(c) for c in counted.record(replay)] == [layout(c) for c in calls]
    assert replay.flops == sum(counted.matmul_flops(f, a) for f, a, _ in calls) > 0
    tensors = [x for _, a, k in replay.calls for x in [*a, *k.values()] if isinstance(x, torch.Tensor)]
    distinct = len({id(x) for x in tensors})
    if warm:  # shared across calls, never within one
        assert distinct < len(tensors) / 2
        for _, a, k in replay.calls:
            mine = [id(x) for x in [*a, *k.values()] if isinstance(x, torch.Tensor)]
            assert len(mine) == len(set(mine))
    else:
        assert distinct == len(tensors)


def test_counted_times_times_the_step_both_replays_and_the_matmul_in_turn():
    model, opt = models.tiedlm_model(SHAPES[0], True, torch.device("cpu"))
    step = models.step_fn("tiedlm", model, opt, torch.randint(0, 300, (4, 17)), None)
    ran = []
    a = torch.randn(64, 64)
    times = counted.counted_times(step, 3, matmul=(lambda: ran.append(a @ a), 2 * 64**3))
    assert len(ran) == 1 + 3  # a warm-up, then once a round
    assert times["calls"] == len(recorded_step(SHAPES[0], True)) and times["matmul_flops"] > 0
    assert all(times[k] > 0 for k in ("step_s", "counted_s", "counted_warm_s", "matmul_flops_per_s"))


def test_every_matmul_overload_counts_its_own_m_k_n():
    m, k, n = 3, 5, 7
    a, b, bias, out = torch.randn(m, k), torch.randn(k, n), torch.randn(n), torch.empty(m, n)
    acc = torch.zeros(m, n)
    ba, bb = torch.randn(2, m, k), torch.randn(2, k, n)
    calls = counted.record(lambda: (torch.mm(a, b, out=out), acc.addmm_(a, b), torch.addmm(bias, a, b), a @ b,
                                    torch.bmm(ba, bb), torch.baddbmm(torch.zeros(2, m, n), ba, bb),
                                    torch.zeros(2, m, n).baddbmm_(ba, bb)))
    assert [f.overloadpacket.__name__ for f, _, _ in calls] == ["mm", "addmm_", "addmm", "mm", "bmm", "baddbmm",
                                                                "baddbmm_"]
    assert [counted.matmul_flops(f, args) for f, args, _ in calls] == [2 * m * k * n] * 4 + [2 * 2 * m * k * n] * 3


def test_the_bench_s_counted_table_has_a_row_per_shape_from_a_fresh_process():
    out = subprocess.run([sys.executable, str(ROOT / "scripts" / "bench.py"), "--counted", "--quick"],
                         capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-2000:]
    rows = [line.split("|")[1:-1] for line in out.stdout.splitlines() if line.startswith("| tiny")]
    assert [r[0].strip() for r in rows] == ["tiny", "tiny llama"]
    for row in rows:
        step = float(row[1].strip().removesuffix(" ms"))
        cold, warm = (float(v) for v in row[2].strip().removesuffix(" ms").split(" / "))
        assert step > 0 and cold > 0 and warm > 0
        assert abs(float(row[3].strip().rstrip("%")) - 100 * cold / step) <= 1  # to 0.01 ms, then to 1%
        low, high = (float(v.strip().rstrip("%")) for v in row[6].split("–"))
        assert low > 0 and high > 0
