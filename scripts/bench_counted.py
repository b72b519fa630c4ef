"""How far a training step's share of the matmul rate can go: the work that its FLOP count counts
(tiedlm.model.counting.flops_per_token: every matmul, and attention's scores and weighted sum), recorded
from one real step and replayed alone.

`record(step)` runs the step once under a dispatch mode that writes down each call of a counted
operator: the matmuls (mm, addmm, addmm_, bmm, baddbmm, baddbmm_, in any overload, `out=` ones
included) and the fused attention kernels (scaled_dot_product_*, forward and backward), with the
shape, strides, dtype and device of every tensor argument. Other matmul kernels (addmv, addbmm,
_addmm_activation) are not recorded; the step does not call them on the CPU, which the test that
the recorded FLOPs equal the count's checks. `Replay(calls)` makes tensors of those layouts once,
and calling it runs the same calls in the same order, nothing else. Timed in turn with the step,
that gives the counted work's time; the step's FLOPs over that time, against the n³ matmul rate
timed in the same turns, is the share the step would reach were everything else (GELU, norms, the
log-softmax, the optimizer, Python) free.

It is an estimate with a known lean either way, so it is made twice. "Cold": every call has tensors
of its own, last touched a whole replay before, where in the step most inputs were just written by
the op before; that leans slow, and the share it gives low. "Warm": calls share one tensor per
layout (distinct within a call), so the replay's operands are far fewer and mostly in cache; that
leans fast, and the share high. The step's ceiling lies between, as far as the random inputs allow
(attention's and the matmuls' work does not depend on the values).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench_models, also when imported by path

from bench_models import (  # noqa: E402
    bench_device,
    child_result,
    dims,
    matmul_turn,
    step_flops,
    step_fn,
    sync,
    tiedlm_model,
)

MATMULS = ("mm", "addmm", "addmm_", "bmm", "baddbmm", "baddbmm_")


def _counted(func) -> bool:
    name = func.overloadpacket.__name__
    return name in MATMULS or "scaled_dot_product" in name


def matmul_flops(func, args) -> int:
    """2·m·k·n (times the batch for bmm) of a recorded matmul call; 0 for attention's kernels."""
    name = func.overloadpacket.__name__
    if name not in MATMULS:
        return 0
    a, b = (args[1], args[2]) if name.startswith(("addmm", "baddbmm")) else (args[0], args[1])
    *batch, m, k = a.shape
    n = b.shape[-1]
    return 2 * m * k * n * (batch[0] if batch else 1)


class Spec:
    """A tensor argument as recorded: what it takes to make one of the same layout."""

    def __init__(self, t):
        self.shape, self.stride, self.dtype, self.device = tuple(t.shape), tuple(t.stride()), t.dtype, t.device

    def make(self):
        import torch

        t = torch.empty_strided(self.shape, self.stride, dtype=self.dtype, device=self.device)
        return t.normal_() if t.dtype.is_floating_point else t.zero_()


def record(step) -> list:
    """[(func, args, kwargs)] of the counted calls that one run of step() makes, tensors as Spec."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_map

    def spec(x):
        return Spec(x) if isinstance(x, torch.Tensor) else x

    class Recorder(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.calls = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            if _counted(func):
                self.calls.append((func, tree_map(spec, args), tree_map(spec, kwargs)))
            return func(*args, **kwargs)

    recorder = Recorder()
    with recorder:
        step()
    return recorder.calls


class Replay:
    """The recorded calls on tensors of their layouts, made once; calling it runs them in order.
    warm=False: each call's tensors its own; warm=True: one tensor per layout, shared across calls
    (a call's own arguments stay distinct, as an out= tensor may not alias an input)."""

    def __init__(self, calls: list, warm: bool = False):
        from torch.utils._pytree import tree_flatten, tree_unflatten

        shared: dict = {}
        self.calls = []
        for func, args, kwargs in calls:
            leaves, tree = tree_flatten((args, kwargs))
            seen: dict = {}
            made = []
            for x in leaves:
                if not isinstance(x, Spec):
                    made.append(x)
                    continue
                layout = (x.shape, x.stride, x.dtype, str(x.device))
                key = (layout, seen.get(layout, 0))
                seen[layout] = key[1] + 1
                if not warm:
                    made.append(x.make())
                else:
                    made.append(shared[key] if key in shared else shared.setdefault(key, x.make()))
            a, k = tree_unflatten(made, tree)
            self.calls.append((func, a, k))
        self.flops = sum(matmul_flops(f, a) for f, a, _ in self.calls)

    def __call__(self) -> None:
        for func, args, kwargs in self.calls:
            func(*args, **kwargs)


def counted_times(step, rounds: int, sync=lambda: None, matmul=None) -> dict:
    """Median seconds of step() and of its counted calls replayed alone, cold and warm (Replay),
    timed in turn over rounds (after one warm-up of each), and the recorded matmuls' FLOPs. With
    matmul=(fn, flops), fn is timed in the same turns and its median FLOP/s returned as
    matmul_flops_per_s: a ceiling measured beside the step, not minutes before it."""
    import statistics
    import time

    calls = record(step)
    cold, warm = Replay(calls), Replay(calls, warm=True)
    timed = {"step": step, "counted": cold, "counted_warm": warm}
    if matmul is not None:
        timed["matmul"] = matmul[0]
    for fn in timed.values():
        fn()
    times: dict = {key: [] for key in timed}
    for _ in range(rounds):
        for key, fn in timed.items():
            sync()
            t = time.perf_counter()
            fn()
            sync()
            times[key].append(time.perf_counter() - t)
    out = {f"{key}_s": statistics.median(times[key]) for key in ("step", "counted", "counted_warm")}
    out.update(calls=len(cold.calls), matmul_flops=cold.flops)
    if matmul is not None:
        out["matmul_flops_per_s"] = statistics.median(matmul[1] / t for t in times["matmul"])
    return out


def counted_entry(shape, device, dtype: str, steps: int, step_flops: float, matmul_n: int) -> dict:
    """The tied step beside its counted work replayed alone, cold and warm, and the n³ matmul, in
    turn (counted_times), in a fresh process: the replay's tensors, all alive at once, would grow
    this process's heap, and malloc would then serve the next shapes' large blocks (the plain loss's
    and transformers' logits) from it instead of mapping fresh pages, which changes their times.
    Their times, the recorded matmuls' FLOPs, the share of the matmul rate the step reached in these
    turns and the shares it would reach were the rest of it free (cold: low, warm: high). {} with a
    line on stderr where the child failed, so that a full bench goes on without the line."""
    spec = {"what": "counted", "device": str(device), "dtype": dtype, "shape": list(shape), "steps": steps,
            "matmul_n": matmul_n}
    c = child_result(spec, f"{shape[0]}: the counted work could not be replayed")
    if c is None:
        return {}
    rate = c["matmul_flops_per_s"]
    return {"counted": c, "counted_share_of_step": c["counted_s"] / c["step_s"],
            "share_same_run_tied": step_flops / c["step_s"] / rate,
            "share_bound_tied": step_flops / c["counted_s"] / rate,
            "share_bound_warm_tied": step_flops / c["counted_warm_s"] / rate}


def child_counted(spec: dict) -> None:
    """--child for counted_entry: print the counted times of the shape's tied step as JSON."""
    import torch

    from tiedlm.device import autocast_ctx

    device = bench_device(spec["device"])
    shape = tuple(spec["shape"])
    _, _, _, T, B, V = dims(shape)
    x = torch.randint(0, V, (B, T + 1), device=device)
    step = step_fn("tiedlm", *tiedlm_model(shape, True, device), x, autocast_ctx(device, spec["dtype"]))
    step()
    matmul = matmul_turn(device, spec["dtype"], spec["matmul_n"])
    print(json.dumps({**counted_times(step, spec["steps"], lambda: sync(device), matmul), "pid": os.getpid()}))


def counted_table(args, shapes) -> None:
    """--counted: each chosen shape's counted_entry alone, as one table."""
    import torch

    from tiedlm.device import resolve_dtype

    device = bench_device(args.device)
    dtype = resolve_dtype(args.dtype, device)
    n, rounds = 256 if args.quick else 2048, max(1, args.rounds * args.steps)
    print(f"{torch.get_num_threads()} threads; each shape's tied step, its matmuls and attention replayed alone "
          f"(cold, warm), and the {n}³ matmul, in turn, {rounds} times")
    print("| shape | step | counted work alone, cold / warm | of the step | matmul GFLOP/s | % of matmul rate "
          "| were the rest free, cold – warm |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    for shape in shapes:
        e = counted_entry(shape, device, dtype, rounds, step_flops(shape), n)
        if not e:
            continue
        c = e["counted"]
        print(f"| {shape[0]} | {1e3 * c['step_s']:,.2f} ms | {1e3 * c['counted_s']:,.2f} / "
              f"{1e3 * c['counted_warm_s']:,.2f} ms | {e['counted_share_of_step']:.0%} "
              f"| {c['matmul_flops_per_s'] / 1e9:,.0f} | {e['share_same_run_tied']:.0%} "
              f"| {e['share_bound_tied']:.0%} – {e['share_bound_warm_tied']:.0%} |")
