"""A training step quiet and under load, for each OpenMP policy: `python scripts/bench.py --under-load`.

torch's CPU build runs its pool on GNU OpenMP, whose threads spin while they wait for work; when
another process holds a core, the spinning burns the time the other thread needs, and a step
slows by several times. The wait behaviour is read once, when torch loads libgomp, so each policy
lives in its own process, started with its environment. All of them are started first and wait;
then, round by round, each times its steps with the competing process stopped (quiet) and
running (under load), in turn, so that the machine's drift falls on every cell alike.

The competing process is one 2-thread torch process with OpenMP's default wait doing the small
ops of a training step, like another user's job. It is started once, paused with SIGSTOP between
the loaded phases, bounded by its own deadline, and killed by pid at the end whatever happens.
"""

from __future__ import annotations

import contextlib
import json
import os
import resource
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from tiedlm.device import KEEP_FREED_ENV, MALLOC_KEYS as device_malloc_keys  # noqa: E402  (no torch)
# The main job's shape (configs/shakespeare.yaml): name, n_layer, n_head, n_embd, block, batch, V
MAIN_JOB = ("main job", 2, 4, 128, 64, 32, 2048)
OPENMP_KEYS = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "OMP_NUM_THREADS", "MKL_NUM_THREADS", "MKL_CBWR")
# malloc's settings (those device.keep_freed_memory reads), which a timer gets only from its own env
# (KEEP), never from the bench's caller
MALLOC_KEYS = (KEEP_FREED_ENV, *device_malloc_keys, "GLIBC_TUNABLES")
AUTO = "TIEDLM_BENCH_AUTO"  # a timer that steps under train.threads: auto (its governor ticking each step)
KEEP = "TIEDLM_BENCH_KEEP_FREED"  # a timer whose malloc keeps freed memory, as the tiedlm command's does
WARMUP_S = 1.5  # each phase warms up at least this long: longer than the governor takes to react


def policies() -> list[tuple[str, dict]]:
    """(label, the variables of its process): torch's own default first (the others' quiet time is
    given against it), the alternative waits, what tiedlm's CLI sets when the user set none
    (tiedlm.device.thread_env: its wait and MKL's reproducible mode) with a fixed count of every
    core and of one, and tiedlm's default, `train.threads: auto`, whose count follows the load."""
    from tiedlm.device import thread_env

    cores, ours = str(os.cpu_count() or 1), thread_env({})
    rows = [(cores, {}, ""), (cores, {"OMP_WAIT_POLICY": "PASSIVE"}, ""), (cores, {"GOMP_SPINCOUNT": "1000"}, ""),
            ("1", {}, ""), (cores, ours, ": `train.threads: 2`"), ("1", ours, ": `train.threads: 1`")]
    # every row with malloc keeping freed memory, as the command runs: the table compares waits
    out = [(label(n, wait) + note, {"OMP_NUM_THREADS": n, **wait, KEEP: "1"}) for n, wait, note in rows]
    return out + [(f"{cores} threads at most, {waits(ours)}: **`train.threads: auto`, tiedlm's default**",
                   {"OMP_NUM_THREADS": cores, **ours, AUTO: "1", KEEP: "1"})]


def waits(wait: dict) -> str:
    return ", ".join(f"`{k}={v}`" for k, v in wait.items()) or "default OpenMP wait"


def label(threads: str, wait: dict) -> str:
    return f"{threads} thread{'s' * (threads != '1')}, {waits(wait)}"


# Another small model's training, as far as OpenMP sees it: a matmul and elementwise ops of a
# few hundred microseconds each, its threads spinning between them (a 1024³ matmul instead
# keeps both cores computing, and spins too rarely to show the cliff).
COMPETITOR = """
import os, sys, time
import torch
deadline, parent = time.monotonic() + float(sys.argv[1]), os.getppid()
x, w = torch.randn(2048, 128), torch.randn(128, 512)
def work():
    h = torch.nn.functional.gelu(x @ w)
    return (h * h).sum()
work()
print("ready", flush=True)
while time.monotonic() < deadline and os.getppid() == parent:
    work()
"""


def start_competitor(seconds: float, threads: int = 2) -> subprocess.Popen:
    """The competing process on `threads` threads, ready and paused. It ends by itself after
    `seconds` or when its parent is gone, so that not even a bench killed with -9 leaves it running
    for long."""
    env = {k: v for k, v in os.environ.items() if k not in OPENMP_KEYS}
    env["OMP_NUM_THREADS"] = str(threads)
    proc = subprocess.Popen([sys.executable, "-c", COMPETITOR, str(seconds)], stdout=subprocess.PIPE,
                            text=True, env=env)
    if proc.stdout.readline().strip() != "ready":
        end(proc)
        raise RuntimeError("the competing process did not start")
    os.kill(proc.pid, signal.SIGSTOP)
    return proc


def end(proc: subprocess.Popen | None) -> None:
    """Kill a process of ours by its pid and reap it; SIGCONT first, as a stopped one is paused."""
    if proc is None or proc.poll() is not None:
        return
    for sig in (signal.SIGCONT, signal.SIGKILL):
        try:
            os.kill(proc.pid, sig)
        except ProcessLookupError:
            return
    proc.wait()


def start_timer(env: dict) -> subprocess.Popen:
    """A process timing the main job's step under `env`: it builds the model and waits for orders."""
    full = {k: v for k, v in os.environ.items() if k not in OPENMP_KEYS + MALLOC_KEYS}
    full.update(env)
    return subprocess.Popen([sys.executable, __file__, "--timer"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            text=True, env=full, cwd=ROOT)


def ask(proc: subprocess.Popen, order: dict) -> dict:
    proc.stdin.write(json.dumps(order) + "\n")
    proc.stdin.flush()
    line = proc.stdout.readline()
    if not line:
        raise RuntimeError(f"a timing process ended early (exit {proc.wait()})")
    return json.loads(line)


def timer() -> None:
    """--timer: one step builder; each order {"warmup", "steps"} is answered with the steps' times."""
    sys.path.insert(0, str(ROOT / "scripts"))
    kept = False
    if os.environ.get(KEEP) == "1":
        from tiedlm.device import keep_freed_memory

        kept = keep_freed_memory()
    import torch

    import bench

    device = torch.device("cpu")
    _, L, H, d, T, B, V = MAIN_JOB
    model, opt = bench.tiedlm_model(MAIN_JOB, True, device)
    x = torch.randint(0, V, (B, T + 1))
    step = bench.step_fn("tiedlm", model, opt, x, contextlib.nullcontext())
    from tiedlm import threads
    from tiedlm.device import cpu_threads

    with contextlib.ExitStack() as stack:
        if os.environ.get(AUTO) == "1":
            stack.enter_context(cpu_threads("auto"))
        print(json.dumps({"threads": torch.get_num_threads(), "adaptive": threads.current() is not None,
                          "keep_freed": kept}), flush=True)
        for line in sys.stdin:
            order = json.loads(line)
            start = time.perf_counter()
            for i in range(10**6):
                if i >= order["warmup"] and time.perf_counter() - start >= order.get("warmup_s", 0):
                    break
                step()
                threads.tick()
            times, counts = [], []
            before = resource.getrusage(resource.RUSAGE_SELF)
            for _ in range(order["steps"]):
                t = time.perf_counter()
                step()
                times.append(time.perf_counter() - t)
                counts.append(torch.get_num_threads())
                threads.tick()
            after = resource.getrusage(resource.RUSAGE_SELF)
            print(json.dumps({"times": times, "threads": counts, "sys_s": after.ru_stime - before.ru_stime,
                              "faults": after.ru_minflt - before.ru_minflt}), flush=True)


PHASES = ("quiet", "load", "load1")  # no competitor, the 2-thread one, the 1-thread one


def under_load(rounds: int = 3, steps: int = 5, warmup: int = 2, chosen: list | None = None) -> dict:
    """Each policy's step times quiet and beside each competitor, `rounds` x `steps` each,
    interleaved; with the thread counts the steps ran at."""
    chosen = chosen or policies()
    timers: list[subprocess.Popen] = []
    rivals: dict[str, subprocess.Popen] = {}
    try:
        for _, env in chosen:
            timers.append(start_timer(env))
        threads = [json.loads(t.stdout.readline())["threads"] for t in timers]
        seconds = 120 + rounds * len(chosen) * len(PHASES) * (WARMUP_S + steps * 2)
        rivals = {"load": start_competitor(seconds, 2), "load1": start_competitor(seconds, 1)}
        times = [{p: [] for p in PHASES} for _ in chosen]
        used = [{p: [] for p in PHASES} for _ in chosen]
        for _ in range(rounds):
            for i, proc in enumerate(timers):
                for phase in PHASES:
                    for name, rival in rivals.items():
                        os.kill(rival.pid, signal.SIGCONT if name == phase else signal.SIGSTOP)
                    got = ask(proc, {"warmup": warmup, "steps": steps, "warmup_s": WARMUP_S})
                    times[i][phase] += got["times"]
                    used[i][phase] += got["threads"]
        for rival in rivals.values():
            os.kill(rival.pid, signal.SIGSTOP)
    finally:
        for rival in rivals.values():
            end(rival)
        for proc in timers:
            end(proc)
    rows = []
    for (label, env), n, t, u in zip(chosen, threads, times, used):
        row = {"policy": label, "env": env, "threads": n, "steps": len(t["quiet"])}
        for phase in PHASES:
            row[f"{phase}_s"] = statistics.median(t[phase])
            row[f"threads_{phase}"] = statistics.median(u[phase])
        rows.append(row)
    base = rows[0]["quiet_s"]
    for row in rows:
        row["quiet_over_default"] = row["quiet_s"] / base
        row["load_over_quiet"] = row["load_s"] / row["quiet_s"]
        row["load1_over_quiet"] = row["load1_s"] / row["quiet_s"]
    return {"shape": list(MAIN_JOB[1:]), "rounds": rounds, "steps": steps, "policies": rows}


def print_table(result: dict, matmul_flops: float) -> None:
    L, H, d, T, B, V = result["shape"]
    n = result["policies"][0]["steps"]
    print(f"\nthe main job's step (L={L} d={d} T={T} B={B} V={V:,}, tied, fused loss, AdamW), median of {n} "
          f"steps, every process with malloc keeping freed memory as the tiedlm command does; the 2048³ "
          f"matmul ran at {matmul_flops / 1e9:.0f} GFLOP/s in this run")
    print("| policy | quiet | one competing 2-thread process | one competing 1-thread process |")
    print("| --- | ---: | ---: | ---: |")
    for r in result["policies"]:
        quiet = f"{r['quiet_s'] * 1e3:.0f} ms ({r['quiet_over_default'] - 1:+.0%})"
        cells = [f"{r[p + '_s'] * 1e3:.0f} ms ({r[p + '_over_quiet']:.1f}×)" for p in ("load", "load1")]
        how = ""
        if AUTO in r["env"]:
            how = " (threads: " + " / ".join(f"{r['threads_' + p]:g}" for p in PHASES) + ")"
        print(f"| {r['policy']}{how} | {quiet} | {cells[0]} | {cells[1]} |")


def pool_ceiling(rounds: int = 3, steps: int = 5, warmup: int = 2) -> dict:
    """--pool-ceiling: what `--jobs auto` can buy at the main job's shape, quiet. One process on
    every usable core (tiedlm's default wait) takes `steps` steps alone, one one-thread process takes
    its steps alone, and then n one-thread processes (the workers `--jobs auto` starts on n cores)
    take theirs at the same time, in turn round by round. A batch of runs on the pool takes at best
    `ratio` = parallel / (n · alone) of its time one after another on every core: lower is better,
    and that is before any stage waits for its last run."""
    from tiedlm.device import thread_env
    from tiedlm.experiment.parallel import available_cores

    n = available_cores()
    ours = {**thread_env({}), KEEP: "1"}  # as the tiedlm command and its --jobs workers run
    envs = [{"OMP_NUM_THREADS": str(n), **ours}] + [{"OMP_NUM_THREADS": "1", **ours}] * n
    timers: list[subprocess.Popen] = []
    try:
        for env in envs:
            timers.append(start_timer(env))
        for t in timers:
            json.loads(t.stdout.readline())
        alone, parallel, single = [], [], []
        order = {"warmup": warmup, "steps": steps}
        for _ in range(rounds):
            alone += ask(timers[0], order)["times"]
            single += ask(timers[1], order)["times"]
            for t in timers[1:]:  # every one-thread worker at once
                t.stdin.write(json.dumps(order) + "\n")
                t.stdin.flush()
            for t in timers[1:]:
                line = t.stdout.readline()
                if not line:
                    raise RuntimeError(f"a timing process ended early (exit {t.wait()})")
                parallel += json.loads(line)["times"]
    finally:
        for proc in timers:
            end(proc)
    a, p, one = (statistics.median(x) for x in (alone, parallel, single))
    return {"shape": list(MAIN_JOB[1:]), "cores": n, "alone_s": a, "one_thread_s": one, "parallel_s": p,
            "ratio": p / (n * a), "contention": p / one, "steps": len(alone)}


def allocator(rounds: int = 5, steps: int = 5, warmup: int = 3) -> dict:
    """--allocator: the main job's step quiet on one thread and on every core, each with the tiedlm
    command's settings and glibc's malloc as it comes or as the command sets it
    (device.keep_freed_memory), the four in turn round by round: wall time, and the system time and
    page faults per step."""
    from tiedlm.device import thread_env
    from tiedlm.experiment.parallel import available_cores

    cores = str(available_cores())
    cases = [(n, keep) for n in dict.fromkeys(("1", cores)) for keep in (False, True)]
    timers: list[subprocess.Popen] = []
    got = {case: {"times": [], "sys_s": 0.0, "faults": 0} for case in cases}
    try:
        for n, keep in cases:
            timers.append(start_timer({"OMP_NUM_THREADS": n, **thread_env({}), **({KEEP: "1"} if keep else {})}))
        applied = [json.loads(t.stdout.readline())["keep_freed"] for t in timers]
        for _ in range(rounds):
            for case, t in zip(cases, timers):
                answer = ask(t, {"warmup": warmup, "steps": steps})
                got[case]["times"] += answer["times"]
                got[case]["sys_s"] += answer["sys_s"]
                got[case]["faults"] += answer["faults"]
    finally:
        for proc in timers:
            end(proc)
    rows = [{"threads": int(n), "keep_freed": keep, "applied": done, "step_s": statistics.median(g["times"]),
             "sys_per_step_s": g["sys_s"] / len(g["times"]), "faults_per_step": g["faults"] / len(g["times"])}
            for ((n, keep), g), done in zip(got.items(), applied)]
    return {"shape": list(MAIN_JOB[1:]), "steps": rounds * steps, "rows": rows}


def print_allocator(result: dict, matmul_flops: float) -> None:
    print(f"\nthe main job's step, quiet, median of {result['steps']} steps (4 processes in turn); the 2048³ "
          f"matmul ran at {matmul_flops / 1e9:.0f} GFLOP/s in this run")
    print("| threads | glibc's malloc | step | system time a step | page faults a step |")
    print("| ---: | --- | ---: | ---: | ---: |")
    for r in result["rows"]:
        how = "keeps freed memory (tiedlm's command)" if r["applied"] else "as it comes"
        if r["applied"] != r["keep_freed"]:
            how += " (the setting was asked for and refused)"
        print(f"| {r['threads']} | {how} | {r['step_s'] * 1e3:.0f} ms | {r['sys_per_step_s'] * 1e3:.1f} ms "
              f"| {r['faults_per_step']:,.0f} |")


def print_pool(result: dict, matmul_flops: float) -> None:
    r = result
    print(f"\nthe main job's step, median of {r['steps']} steps; the 2048³ matmul ran at {matmul_flops / 1e9:.0f} "
          "GFLOP/s in this run")
    print(f"| one process, {r['cores']} threads | one process, 1 thread | {r['cores']} 1-thread processes at once "
          "(each; against 1 thread alone) | --jobs auto's best time / --jobs 1's |")
    print("| ---: | ---: | ---: | ---: |")
    print(f"| {r['alone_s'] * 1e3:.0f} ms | {r['one_thread_s'] * 1e3:.0f} ms | {r['parallel_s'] * 1e3:.0f} ms "
          f"({r['contention']:.2f}×) | {r['ratio']:.2f}× |")


if __name__ == "__main__" and sys.argv[1:] == ["--timer"]:
    timer()
