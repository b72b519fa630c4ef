#!/usr/bin/env python3
"""tiedlm's speed on this machine, beside Hugging Face transformers' GPT2LMHeadModel (and, for the
llama shapes, LlamaForCausalLM) of the same dimensions, tied and untied; against the machine's own
fp32 matmul rate measured in the same run.

    python scripts/bench.py                  # docs/studies/benchmarks.md's tables, and bench.json beside this script
    python scripts/bench.py --quick          # tiny shapes, one step each (what the test runs)
    python scripts/bench.py --device cuda --dtype bf16
    python scripts/bench.py --steps 2 --rounds 3 --no-extra   # the shapes' tables alone, shorter
    python scripts/bench.py --shapes "base.yaml,llama base,llama wide vocab" --no-extra   # some shapes
    python scripts/bench.py --counted --rounds 9   # how far each step's share of the matmul rate can go
    python scripts/bench.py --chunks      # the fused loss's chunk size, by the training step (base, wide vocab)
    python scripts/bench.py --under-load --rounds 3   # each OpenMP policy quiet and beside a competing process
    python scripts/bench.py --pool-ceiling            # one step on every core vs two one-core workers at once
    python scripts/bench.py --allocator --rounds 8    # the step with glibc's malloc as it comes and as tiedlm sets it

Training throughput is a full step (forward, backward, clipping, AdamW) on random tokens after
warm-up steps. The six models of a shape (tiedlm tied and untied with its fused cross-entropy,
the same with the plain loss - logits and F.cross_entropy, plain_loss in bench_models.py - and
transformers tied and untied) are timed in turn, A B C D E F A B ..., so that the machine's
noise falls on all of them alike; the tables give the median over rounds and the spread.
The llama shapes are tiedlm's `model.arch: llama` (grouped-query attention with n_head / 2
key/value heads, SwiGLU of tiedlm's default width, rotary embeddings, RMSNorm, no biases) beside
LlamaForCausalLM with the same numbers and SDPA attention; both sides' parameter counts are
asserted equal (bench_models.py holds the models and their steps).
Evaluation (evaluate.score_tokens) is timed the same way, fused and plain in turn (the plain one
through a module that gives only logits, which score_tokens scores by F.cross_entropy). FLOP/s use
tiedlm.model.counting.flops_per_token (the head counted whether tied or not), so tied and untied models
of a shape do the same work; a shape's "% of matmul rate" is against the 2048³ matmul timed once a
round in the same turns as its models (the rate the run starts with drifts over its minutes). Each
shape is timed in a fresh process of its own (shape_entry), so that no row depends on the heap the
shapes timed before it left behind, and each model's page faults a step (getrusage's minor faults over
its own timed steps) stand beside its rate. Under each shape's table, the line "counted work alone" is the
tied step's matmuls and attention kernels replayed alone (bench_counted.py), timed in turn with the
step: the share of the matmul rate the step would reach were everything else in it free.
The bench's process sets glibc's malloc as the tiedlm command does (device.keep_freed_memory: freed
memory kept for the next step) for every model it times, so both sides run on the same allocator;
`TIEDLM_KEEP_FREED=0` times them all with malloc as it comes, where the others' fresh logits each
step cost them a third or more (docs/studies/benchmarks.md).
Peak memory is measured in a fresh process per case (its peak resident set, VmHWM, on a CPU,
torch.cuda.max_memory_allocated on CUDA).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench_models, bench_load (also when imported by path)

import bench_counted  # noqa: E402
from bench_models import (  # noqa: E402,F401  (re-exported: bench_load and the tests use bench.step_fn ...)
    CHUNK_LOGITS_BYTES,
    archhf_model,
    bench_device,
    child_result,
    dims,
    hf_model,
    logits_only,
    matmul_turn,
    model_config,
    plain_loss,
    step_flops,
    step_fn,
    sync,
    tiedlm_model,
)

ROOT = Path(__file__).resolve().parents[1]
SHAPES = [  # (name, n_layer, n_head, n_embd, block_size, batch_size, vocab[, arch]: gpt2 unless named)
    ("base.yaml", 2, 4, 128, 64, 32, 4096),
    ("wide vocab", 2, 4, 128, 64, 32, 16384),
    ("deeper", 6, 6, 384, 128, 8, 4096),
    ("reference", 4, 4, 256, 256, 16, 8192),
    ("llama base", 2, 4, 128, 64, 32, 4096, "llama"),  # base.yaml's numbers, n_kv_head 2, SwiGLU 384
    ("llama wide vocab", 2, 4, 128, 64, 32, 16384, "llama"),
]
QUICK_SHAPES = [("tiny", 1, 2, 32, 16, 4, 300), ("tiny llama", 1, 2, 32, 16, 4, 300, "llama")]


def matmul_rate(device, dtype, n=2048, reps=5) -> float:
    """FLOP/s of an n³ matmul: the best of three timings, the machine's ceiling for this run."""
    import torch

    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    a @ b
    best = 0.0
    for _ in range(3):
        sync(device)
        t = time.perf_counter()
        for _ in range(reps):
            a @ b
        sync(device)
        best = max(best, 2 * n**3 * reps / (time.perf_counter() - t))
    return best


def minor_faults() -> int:
    """This process's page faults served without I/O so far (0 where getrusage is missing): a
    block mapped afresh faults in, and the kernel zeroes, every page of it."""
    try:
        import resource
    except ImportError:  # pragma: no cover - not a POSIX system
        return 0
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def train_rates(shape, device, dtype: str, steps: int, rounds: int, warmup: int, matmul_n: int | None = None,
                matmul_rates: list | None = None, faults: dict | None = None) -> dict:
    """tokens/s of each implementation and tying, timed in turn over rounds. With matmul_n and
    matmul_rates, the n³ matmul (matmul_turn) takes a turn in each round too, and its FLOP/s are
    appended to matmul_rates: the shape's ceiling, measured beside its models. With faults, each
    implementation's page faults a step over its timed steps go there, by the same labels (the
    models take turns, so the process's count between a turn's first and last step is theirs)."""
    import torch

    from tiedlm.device import autocast_ctx

    L, H, d, T, B, V = dims(shape)
    amp = autocast_ctx(device, dtype)
    x = torch.randint(0, V, (B, T + 1), device=device, generator=None)
    steps_of = {}
    for kind, build in (("tiedlm", tiedlm_model), ("plain", tiedlm_model), ("transformers", hf_model),
                        ("archhf", archhf_model)):
        for tied in (True, False):
            built = build(shape, tied, device)
            if built is not None:
                steps_of[(kind, tied)] = step_fn("tiedlm" if kind == "archhf" else kind, *built, x, amp)
    for step in steps_of.values():
        for _ in range(warmup):
            step()
    times: dict = {k: [] for k in steps_of}
    faulted: dict = {k: 0 for k in steps_of}
    matmul = matmul_turn(device, dtype, matmul_n) if matmul_n and matmul_rates is not None else None
    if matmul:
        matmul[0]()
    for _ in range(rounds):
        for key, step in steps_of.items():
            sync(device)
            f, t = minor_faults(), time.perf_counter()
            for _ in range(steps):
                step()
            sync(device)
            times[key].append(B * T * steps / (time.perf_counter() - t))
            faulted[key] += minor_faults() - f
        if matmul:
            sync(device)
            t = time.perf_counter()
            matmul[0]()
            sync(device)
            matmul_rates.append(matmul[1] / (time.perf_counter() - t))
    label = {k: f"{LABELS[k[0]]} {'tied' if k[1] else 'untied'}" for k in steps_of}
    if faults is not None:
        faults.update({label[k]: n / (rounds * steps) for k, n in faulted.items()})
    return {label[k]: v for k, v in times.items()}


LABELS = {"tiedlm": "tiedlm", "plain": "tiedlm plain loss", "transformers": "transformers",
          "archhf": "arch: hf"}


def eval_rates(shape, device, dtype: str, batches: int, rounds: int) -> dict:
    """tokens/s of tiedlm's evaluation (evaluate.score_tokens: inference mode, batches of windows),
    with the fused per-token loss and with the plain one (logits_only), in turn."""
    import numpy as np

    from tiedlm.device import autocast_ctx
    from tiedlm.evaluate import score_tokens

    L, H, d, T, B, V = dims(shape)
    model, _ = tiedlm_model(shape, True, device)
    scored = {"fused": model, "plain": logits_only(model)}
    tokens = np.random.default_rng(0).integers(0, V, size=T * B * batches + 1)
    rates: dict = {"fused": [], "plain": []}
    for r in range(rounds + 1):  # the first round warms up
        for kind in rates:
            part = tokens if r else tokens[: T * B + 1]
            sync(device)
            t = time.perf_counter()
            score_tokens(scored[kind], part, T, T, B, device, autocast_ctx(device, dtype))
            sync(device)
            if r:
                rates[kind].append((len(part) - 1) / (time.perf_counter() - t))
    return rates


# ------------------------------------------------------------------------- in a fresh process


def child_memory(spec: dict) -> None:
    """--child: one model's training steps in this fresh process; print its peak memory (bytes)."""
    import torch

    from tiedlm.device import autocast_ctx, peak_memory

    device = bench_device(spec["device"])
    shape = tuple(spec["shape"])
    model, opt = tiedlm_model(shape, spec["tied"], device)
    x = torch.randint(0, shape[6], (shape[5], shape[4] + 1), device=device)
    step = step_fn(spec.get("loss", "tiedlm"), model, opt, x, autocast_ctx(device, spec["dtype"]),
                   None if spec.get("chunked", True) else 1 << 62)
    for _ in range(2):
        step()
    if device.type == "cuda":
        print(peak_memory(device)[0])
    else:  # VmHWM: this process image's peak RSS (ru_maxrss would carry the parent's peak across exec)
        status = Path("/proc/self/status").read_text()
        print(int(next(line.split()[1] for line in status.splitlines() if line.startswith("VmHWM:"))) * 1024)


def measure_memory(spec: dict) -> int:
    out = subprocess.run([sys.executable, __file__, "--child", json.dumps(spec)], capture_output=True, text=True,
                         check=True)
    return int(out.stdout.strip().splitlines()[-1])


def cold_seconds(args: list[str], repeats: int) -> float:
    """Median wall time of a fresh `tiedlm ...` process."""
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        subprocess.run([sys.executable, "-m", "tiedlm", *args], capture_output=True, check=True, cwd=ROOT)
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def real_run_rate(steps: int) -> float:
    """tokens/s that a real `tiedlm train` of base.yaml reports (report.json), periodic evaluation
    and checkpoints included at the config's intervals."""
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run([sys.executable, "-m", "tiedlm", "train", "-c", str(ROOT / "configs/base.yaml"), "--set",
                        f"train.max_steps={steps}", "--out", tmp, "--name", "r", "-q"], capture_output=True,
                       check=True, cwd=ROOT)
        return json.loads((Path(tmp) / "r" / "report.json").read_text())["tokens_per_s"]


def data_times() -> list[tuple[str, float, float]]:
    """Cold (empty cache) and warm (cache hit) prepare_data times, in seconds."""
    from tiedlm.config import load_config
    from tiedlm.data import prepare_data

    root = ROOT
    cases = [("builtin:synthetic (base.yaml, 2.4M words, word)", str(root / "configs/base.yaml"), [])]
    shk = root.parent / "shared/data/tinyshakespeare/input.txt"
    if shk.exists():
        cases.append(("Tiny Shakespeare (1.1 MB, bpe 4096)", str(root / "configs/shakespeare-bpe.yaml"),
                      [f"data.data_files={shk}"]))
    out = []
    for label, path, over in cases:
        with tempfile.TemporaryDirectory() as cache:
            os.environ["TIEDLM_CACHE"] = cache
            cfg = load_config(path, over)
            t = time.perf_counter()
            prepare_data(cfg, progress=False)
            cold = time.perf_counter() - t
            t = time.perf_counter()
            prepare_data(cfg, progress=False)
            out.append((label, cold, time.perf_counter() - t))
    return out


# ------------------------------------------------------------------------- the tables


def summary(values: list[float]) -> dict:
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "n": len(values)}


def chosen_shapes(args) -> list[tuple]:
    """The shapes --shapes names (comma-separated; all of them by default), the quick ones with --quick."""
    shapes = QUICK_SHAPES if args.quick else SHAPES
    if not args.shapes:
        return shapes
    names = [n.strip() for n in args.shapes.split(",") if n.strip()]
    known = {s[0]: s for s in shapes}
    unknown = [n for n in names if n not in known]
    if unknown:
        from tiedlm.errors import ConfigError

        raise ConfigError(f"unknown shape(s) {unknown} in --shapes — name some of {list(known)}")
    return [known[n] for n in names]


def transformers_version() -> str | None:
    """The installed transformers' version, read from its metadata (no import), or None."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("transformers")
    except PackageNotFoundError:
        return None


def shape_entry(shape, device, dtype: str, args, n: int) -> dict | None:
    """One shape's training and evaluation rates, timed in a fresh process (child_shape). A process
    that timed other shapes first has a heap grown by them, from which malloc serves the blocks
    above its mmap threshold (the plain loss's and transformers' logits) without mapping fresh
    pages; in the run's own process those would fault in every step, as they do in a training
    process that holds one model. A fresh process per shape makes each row independent of the
    shapes timed before it. None, with a line on stderr, where the child failed (a CUDA
    out-of-memory at one shape, say): the bench goes on with the other shapes. On CUDA the
    children need a GPU that more than one process may use (not EXCLUSIVE_PROCESS), and the page
    faults they count are the host's."""
    spec = {"what": "shape", "device": str(device), "dtype": dtype, "shape": list(shape), "steps": args.steps,
            "rounds": args.rounds, "warmup": args.warmup, "eval_batches": args.eval_batches,
            "matmul_n": n}
    return child_result(spec, f"{shape[0]}: its timing process gave no result")


def child_shape(spec: dict) -> None:
    """--child for shape_entry: print the shape's entry as JSON."""
    from tiedlm.model.counting import flops_per_token

    device, dtype, shape = bench_device(spec["device"]), spec["dtype"], tuple(spec["shape"])
    name, V = shape[0], dims(shape)[5]
    in_turns: list = []
    faults: dict = {}
    rates = train_rates(shape, device, dtype, spec["steps"], spec["rounds"], spec["warmup"], spec["matmul_n"],
                        in_turns, faults)
    rate = statistics.median(in_turns)  # the shape's own ceiling: the run's first one drifts over minutes
    fpt = flops_per_token(model_config(shape), V)["train"]
    ev = eval_rates(shape, device, dtype, spec["eval_batches"], spec["rounds"])
    cfg = model_config(shape)
    entry = {"name": name, "arch": cfg.arch, "shape": list(dims(shape)), "n_kv_head": cfg.kv_heads,
             "mlp_size": cfg.mlp_size, "train_flops_per_token": fpt, "matmul_flops_in_turns": rate,
             "train": {k: summary(v) for k, v in rates.items()}, "faults_per_step": faults,
             "eval_tokens_per_s": statistics.median(ev["fused"]),
             "eval_plain_tokens_per_s": statistics.median(ev["plain"])}
    entry["eval_over_train"] = entry["eval_tokens_per_s"] / entry["train"]["tiedlm tied"]["median"]
    entry["eval_plain_over_train_plain"] = (entry["eval_plain_tokens_per_s"]
                                           / entry["train"]["tiedlm plain loss tied"]["median"])
    for tying in ("tied", "untied"):
        ours, plain, theirs = (rates.get(f"{k} {tying}") for k in ("tiedlm", "tiedlm plain loss", "transformers"))
        if theirs:
            entry[f"ratio_{tying}"] = statistics.median(a / b for a, b in zip(ours, theirs))
            entry[f"ratio_plain_{tying}"] = statistics.median(a / b for a, b in zip(plain, theirs))
        entry[f"fused_over_plain_{tying}"] = statistics.median(a / b for a, b in zip(ours, plain))
        archhf = rates.get(f"arch: hf {tying}")
        if archhf:  # tiedlm's own block against the family's under the same loop and loss
            entry[f"native_over_archhf_{tying}"] = statistics.median(a / b for a, b in zip(ours, archhf))
        entry[f"mfu_{tying}"] = statistics.median(ours) * fpt / rate
        entry[f"mfu_plain_{tying}"] = statistics.median(plain) * fpt / rate
    entry["pid"] = os.getpid()  # the process that timed it (the run's own is result["pid"])
    print(json.dumps(entry))


def run(args, shapes: list[tuple]) -> dict:
    import torch

    from tiedlm.device import resolve_dtype

    device = bench_device(args.device)
    dtype = resolve_dtype(args.dtype, device)
    n = 256 if args.quick else 2048
    ceiling = matmul_rate(device, torch.bfloat16 if dtype == "bf16" else torch.float32, n=n)
    result = {"device": str(device), "dtype": dtype, "threads": torch.get_num_threads(), "torch": torch.__version__,
              "transformers": transformers_version(), "matmul_flops": ceiling, "pid": os.getpid(),
              "settings": {k: getattr(args, k) for k in ("steps", "rounds", "warmup", "eval_batches", "real_steps")},
              "shapes": [], "failed_shapes": []}
    for shape in shapes:
        entry = shape_entry(shape, device, dtype, args, n)
        if entry is None:
            result["failed_shapes"].append(shape[0])
            continue
        entry.update(bench_counted.counted_entry(shape, device, dtype, max(1, args.rounds * args.steps),
                                                 step_flops(shape), n))
        result["shapes"].append(entry)
        print_shape(entry)
    if not args.quick and not args.no_extra:
        extra(result, device, dtype, args)
    return result


def extra(result: dict, device, dtype: str, args) -> None:
    wide, gpt2 = ("GPT-2 width", 1, 12, 768, 64, 4, 50257), ("GPT-2 vocabulary", 2, 4, 128, 512, 8, 50257)
    mem = {}
    for label, shape, tied, loss, chunked in (
            ("V=50,257, d=768, 1 layer, B=4, T=64: tied", wide, True, "tiedlm", True),
            ("V=50,257, d=768, 1 layer, B=4, T=64: untied", wide, False, "tiedlm", True),
            ("V=50,257, d=128, B=8, T=512: plain loss", gpt2, True, "plain", False),
            ("V=50,257, d=128, B=8, T=512: plain loss, chunked (checkpointed)", gpt2, True, "plain", True),
            ("V=50,257, d=128, B=8, T=512: fused loss", gpt2, True, "tiedlm", True)):
        mem[label] = measure_memory({"what": "memory", "device": str(device), "dtype": dtype, "shape": list(shape),
                                     "tied": tied, "loss": loss, "chunked": chunked})
    result["peak_memory_bytes"] = mem
    result["cold_seconds"] = {"tiedlm --help": cold_seconds(["--help"], 5),
                              "tiedlm params --config configs/base.yaml": cold_seconds(
                                  ["params", "--config", "configs/base.yaml"], 5)}
    if device.type == "cpu":
        result["real_train_tokens_per_s"] = real_run_rate(args.real_steps)
    print("\n| peak memory of two training steps (fresh process) | MiB |")
    print("| --- | ---: |")
    for k, v in mem.items():
        print(f"| {k} | {v / 2**20:,.0f} |")
    print("\n| cold command | seconds (median of 5) |")
    print("| --- | ---: |")
    for k, v in result["cold_seconds"].items():
        print(f"| `{k}` | {v:.2f} |")
    result["data"] = [{"data": label, "cold_s": cold, "warm_s": warm} for label, cold, warm in data_times()]
    print("\n| data | cold prepare (s) | warm, cache hit (s) |")
    print("| --- | ---: | ---: |")
    for d in result["data"]:
        print(f"| {d['data']} | {d['cold_s']:.2f} | {d['warm_s']:.3f} |")
    base = next((e for e in result["shapes"] if e["name"] == "base.yaml"), None)
    if "real_train_tokens_per_s" in result and base:
        b = base["train"]["tiedlm tied"]["median"]
        print(f"\nreal `tiedlm train` of base.yaml ({args.real_steps} steps): "
              f"{result['real_train_tokens_per_s']:,.0f} tok/s, {result['real_train_tokens_per_s'] / b:.0%} of the bench")


def chunk_sizes(args) -> None:
    """The fused loss's chunk size by measurement: the training step of the base shape and of the
    wide vocabulary at several CHUNK_BYTES, timed in turn (medians over rounds)."""
    import torch

    import tiedlm.model.loss as loss
    from tiedlm.device import autocast_ctx, resolve_dtype

    device = bench_device(args.device)
    dtype = resolve_dtype(args.dtype, device)
    sizes = [2**19, 2**20, 2**21, 2**22, 2**23, 2**24, 2**26]
    default, min_rows = loss.CHUNK_BYTES, loss.MIN_ROWS
    for shape in SHAPES[:2] if not args.quick else QUICK_SHAPES:
        L, H, d, T, B, V = dims(shape)
        x = torch.randint(0, V, (B, T + 1), device=device)
        step = step_fn("tiedlm", *tiedlm_model(shape, True, device), x, autocast_ctx(device, dtype))
        times: dict = {s: [] for s in sizes}
        try:
            loss.MIN_ROWS = 1  # the bytes alone
            for r in range(args.rounds + 1):
                for size in sizes:
                    loss.CHUNK_BYTES = size
                    sync(device)
                    t = time.perf_counter()
                    for _ in range(args.steps if r else args.warmup):
                        step()
                    sync(device)
                    if r:
                        times[size].append(B * T * args.steps / (time.perf_counter() - t))
        finally:
            loss.CHUNK_BYTES, loss.MIN_ROWS = default, min_rows
        print(f"\n{shape[0]} (V={V:,}): training tokens/s by the fused loss's chunk (rows = bytes / 4V; the "
              f"default is {loss.chunk_rows(V)} rows: {default / 2**20:g} MiB and at least {min_rows})")
        print("| chunk of fp32 logits | rows | tokens/s (median) | min – max |")
        print("| ---: | ---: | ---: | ---: |")
        for size, v in times.items():
            print(f"| {size / 2**20:g} MiB | {loss.chunk_rows(V, size)} | {statistics.median(v):,.0f} | "
                  f"{min(v):,.0f} – {max(v):,.0f} |")


def load_table(args) -> None:
    """--under-load (the policies' table), --pool-ceiling (what two one-thread workers can buy) or
    --allocator (glibc's malloc as it comes or as the command sets it), the matmul rate measured
    first, in the same run."""
    import torch

    import bench_load

    ceiling = matmul_rate(torch.device("cpu"), torch.float32)
    if args.pool_ceiling:
        result = bench_load.pool_ceiling(rounds=args.rounds, steps=args.steps, warmup=args.warmup)
    elif args.allocator:
        result = bench_load.allocator(rounds=args.rounds, steps=args.steps, warmup=args.warmup)
    else:
        result = bench_load.under_load(rounds=args.rounds, steps=args.steps, warmup=args.warmup)
    result.update(matmul_flops=ceiling, torch=torch.__version__, cores=os.cpu_count())
    show = (bench_load.print_pool if args.pool_ceiling else bench_load.print_allocator if args.allocator
            else bench_load.print_table)
    show(result, ceiling)
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
        print(f"\nwrote {args.json}")


def main_job_table(args) -> None:
    """--main-job: the main job with --jobs 1 and --jobs auto, back to back, quiet and under load."""
    import torch

    import bench_main_job

    loads = [int(n) for n in args.main_job_loads.split(",")]
    result = bench_main_job.main_job(args.main_job_config, args.main_job_seeds, loads,
                                     lambda: matmul_rate(torch.device("cpu"), torch.float32),
                                     args.main_job_auto_first)
    result["torch"] = torch.__version__
    bench_main_job.print_main_job(result)
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
        print(f"\nwrote {args.json}")


def print_shape(e: dict) -> None:
    L, H, d, T, B, V = e["shape"]
    block = f" ({e['arch']}: {e['n_kv_head']} key/value heads, MLP {e['mlp_size']})" if e.get("arch") == "llama" else ""
    print(f"\n{e['name']}{block}: L={L} H={H} d={d} T={T} B={B} V={V:,}; "
          f"evaluation {e['eval_tokens_per_s']:,.0f} tok/s "
          f"({e['eval_over_train']:.2f}× training), plain loss {e['eval_plain_tokens_per_s']:,.0f} tok/s "
          f"({e['eval_plain_over_train_plain']:.2f}× its training); the matmul in the same turns "
          f"{e['matmul_flops_in_turns'] / 1e9:,.0f} GFLOP/s")
    print("| implementation | tokens/s (median) | min – max | % of matmul rate | tiedlm / transformers "
          "| fused / plain | page faults a step |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    for k, s in e["train"].items():
        tying, plain = k.split()[-1], "plain" in k
        key = f"ratio_plain_{tying}" if plain else f"ratio_{tying}"
        ratio = f"{e[key]:.2f}×" if k.startswith("tiedlm") and key in e else ""
        mfu = f"{100 * e[f'mfu_plain_{tying}' if plain else f'mfu_{tying}']:.0f}%" if k.startswith("tiedlm") else ""
        gain = f"{e[f'fused_over_plain_{tying}']:.2f}×" if k.startswith("tiedlm") and not plain else ""
        faults = f"{e['faults_per_step'][k]:,.0f}" if k in e.get("faults_per_step", {}) else ""
        print(f"| {k} | {s['median']:,.0f} | {s['min']:,.0f} – {s['max']:,.0f} | {mfu} | {ratio} | {gain} | {faults} |")
    native = [f"{e[f'native_over_archhf_{t}']:.2f}× {t}" for t in ("tied", "untied") if f"native_over_archhf_{t}" in e]
    if native:
        print(f"tiedlm's own block / arch: hf (transformers' blocks under tiedlm's loop and fused loss): "
              f"{', '.join(native)}")
    if "counted" not in e:
        return
    c = e["counted"]
    print(f"counted work alone (tied; {c['calls']} matmul and attention calls replayed): "
          f"{1e3 * c['counted_s']:.1f} (cold) / {1e3 * c['counted_warm_s']:.1f} (warm) of the step's "
          f"{1e3 * c['step_s']:.1f} ms; the step at {e['share_same_run_tied']:.0%} of the matmul rate timed in the "
          f"same turns ({c['matmul_flops_per_s'] / 1e9:,.0f} GFLOP/s), "
          f"{e['share_bound_tied']:.0%} – {e['share_bound_warm_tied']:.0%} were the rest free")


class BenchError(Exception):
    """A bench run that ended without all it was asked for: one line, exit 1."""


def main() -> None:
    """Runs the chosen mode; an expected failure (a device this machine lacks, an unknown shape) is
    one line on stderr and exit 1, not a traceback."""
    from tiedlm.errors import TiedlmError

    try:
        bench_main()
    except (TiedlmError, BenchError) as e:
        sys.exit(f"bench: error: {e}")


def bench_main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="auto")
    ap.add_argument("--dtype", default="auto")
    ap.add_argument("--steps", type=int, default=5, help="steps per timing")
    ap.add_argument("--rounds", type=int, default=5, help="timings of each model, interleaved")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--real-steps", type=int, default=300)
    ap.add_argument("--eval-batches", type=int, default=20, help="batches per evaluation timing")
    ap.add_argument("--quick", action="store_true", help="tiny shapes, one step: a smoke test")
    ap.add_argument("--shapes", default="", help="comma-separated names of the shapes to time, in that order "
                    f"(default: all: {', '.join(s[0] for s in SHAPES)})")
    ap.add_argument("--no-extra", action="store_true", help="the shapes' tables only (no memory, cold commands, data)")
    ap.add_argument("--chunks", action="store_true", help="time the base shape's training step at several chunk "
                    "sizes of the fused loss (tiedlm.model.loss.CHUNK_BYTES), in turn, and stop")
    ap.add_argument("--counted", action="store_true", help="each shape's tied step beside its matmuls and "
                    "attention replayed alone (scripts/bench_counted.py): the share of the matmul rate it would "
                    "reach were the rest free, and stop")
    ap.add_argument("--under-load", action="store_true", help="the main job's step quiet and beside a competing "
                    "2-thread process, for each OpenMP wait policy (scripts/bench_load.py), and stop")
    ap.add_argument("--pool-ceiling", action="store_true", help="the main job's step on every core alone, and on "
                    "one core each in a process per core at once: the best --jobs auto can do (scripts/bench_load.py)")
    ap.add_argument("--allocator", action="store_true", help="the main job's step on one thread and on every "
                    "core, with glibc's malloc as it comes and as the tiedlm command sets it (keeping freed memory)")
    ap.add_argument("--main-job", action="store_true", help="the main job's wall time with --jobs 1 and --jobs auto, "
                    "back to back, for each load of --main-job-loads (scripts/bench_main_job.py), and stop")
    ap.add_argument("--main-job-loads", default="0,1", help="comma-separated threads of the competing process for "
                    "each pair of --main-job: 0 is quiet (default: 0,1)")
    ap.add_argument("--main-job-config", type=Path, default=ROOT / "configs" / "shakespeare.yaml")
    ap.add_argument("--main-job-seeds", type=int, default=3)
    ap.add_argument("--main-job-auto-first", action="store_true", help="each pair's --jobs auto before its --jobs 1")
    ap.add_argument("--json", type=Path, default=None, help="where to write the results (default: bench.json "
                    "beside this script; --quick writes none unless asked)")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args()
    from tiedlm.device import keep_freed_memory

    keep_freed_memory()  # glibc's malloc keeps freed memory, as in the tiedlm command's process
    if args.child:
        spec = json.loads(args.child)
        children = {"counted": bench_counted.child_counted, "shape": child_shape, "memory": child_memory}
        return children[spec["what"]](spec)
    if args.quick:
        args.steps, args.rounds, args.warmup, args.eval_batches = 1, 1, 1, 2
    shapes = chosen_shapes(args)  # an unknown name is refused here, before torch loads
    if args.under_load or args.pool_ceiling or args.allocator:
        return load_table(args)  # each policy in a process of its own, with its own environment
    from tiedlm.device import set_thread_env

    set_thread_env()  # before torch loads: the threads' wait and MKL's mode the tiedlm command runs with
    if args.main_job:
        return main_job_table(args)
    if args.chunks:
        return chunk_sizes(args)
    if args.counted:
        return bench_counted.counted_table(args, shapes)
    result = run(args, shapes)
    path = args.json or (None if args.quick else Path(__file__).with_name("bench.json"))
    if path:
        path.write_text(json.dumps(result, indent=2) + "\n")
        print(f"\nwrote {path}")
    if result["failed_shapes"]:
        raise BenchError(f"no result for {result['failed_shapes']} (their errors are above); the other shapes' are "
                         "in the tables" + (f" and {path}" if path else ""))


if __name__ == "__main__":
    main()
