"""The main job's wall time with `--jobs 1` and `--jobs auto`, back to back, quiet and under load:
`python scripts/bench.py --main-job`.

Each pair runs the real command (`tiedlm compare --config configs/shakespeare.yaml --seeds 3`) twice
into folders of its own, `--jobs 1` first (`--main-job-auto-first`: the other way round, to see
the machine's drift in the ratio), and checks that both wrote the same runs to the bit (and
every later pair's against the first pair's):
the tensors of every safetensors file (the kept best weights and the last checkpoint) and each
run's final metrics. Under load, the competing process of scripts/bench_load.py (a small torch job, its
threads spinning between ops, like another user's training) runs through both commands of the
pair, and is killed by pid at the end whatever happens. The 2048³ matmul rate is measured before
and after, and the 1-minute load average at each command's start and end, since the wall time
follows them.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import bench_load

ROOT = Path(__file__).resolve().parents[1]


def run_command(config: Path, seeds: int, jobs: str, out: Path) -> dict:
    """One `tiedlm compare --config` into `out`, timed from outside (imports and data included)."""
    cmd = [sys.executable, "-m", "tiedlm", "compare", "--config", str(config), "--seeds", str(seeds),
           "--jobs", jobs, "--out", str(out), "-q"]
    load = os.getloadavg()[0]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
    seconds = time.perf_counter() - t0
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({proc.returncode}): {proc.stderr.strip()[-2000:]}")
    verdict = [line for line in proc.stdout.splitlines() if "lower perplexity" in line or "higher perplexity" in line]
    if not verdict:
        raise RuntimeError(f"{' '.join(cmd)} printed no verdict line: {proc.stdout.strip()[-2000:]}")
    return {"jobs": jobs, "seconds": seconds, "load_start": load, "load_end": os.getloadavg()[0],
            "verdict": verdict[0]}


def tensors_digest(path: Path) -> str:
    """The SHA-256 of a safetensors file's tensors, by name: their bits, not the header's key order."""
    from safetensors import safe_open

    digest = hashlib.sha256()
    with safe_open(str(path), "np") as f:
        for name in sorted(f.keys()):
            digest.update(name.encode() + f.get_tensor(name).tobytes())
    return digest.hexdigest()


def fingerprint(out: Path) -> dict:
    """run name -> the digest of each safetensors file's tensors under it, and its final metrics."""
    prints = {}
    for report in sorted(out.glob("*/report.json")):
        run = report.parent
        files = {str(p.relative_to(run)): tensors_digest(p) for p in sorted(run.rglob("*.safetensors"))}
        prints[run.name] = {"files": files, "final": json.loads(report.read_text()).get("final")}
    return prints


def same_runs(a: Path, b: Path) -> tuple[int, int]:
    """(runs in both folders the same to the bit, runs in either); a folder without runs is an error,
    so that a changed layout cannot pass as "0 of 0"."""
    pa, pb = fingerprint(a), fingerprint(b)
    if not pa or not pb:
        raise RuntimeError(f"no finished runs (*/report.json) in {a if not pa else b}")
    return sum(1 for k in pa if pb.get(k) == pa[k]), len(pa.keys() | pb.keys())


def pair(config: Path, seeds: int, competitor_threads: int, root: Path, auto_first: bool = False) -> dict:
    """--jobs 1, then --jobs auto (or the other way round: auto_first), with the competitor running
    through both when asked for. The runs are reported --jobs 1 first either way."""
    proc = bench_load.start_competitor(24 * 3600, competitor_threads) if competitor_threads else None
    try:
        if proc is not None:
            os.kill(proc.pid, bench_load.signal.SIGCONT)
        cell = root / f"load{competitor_threads}"
        order = ("auto", "1") if auto_first else ("1", "auto")
        runs = sorted((run_command(config, seeds, jobs, cell / f"jobs-{jobs}") for jobs in order),
                      key=lambda r: r["jobs"] != "1")
    finally:
        bench_load.end(proc)
    same, total = same_runs(cell / "jobs-1", cell / "jobs-auto")
    return {"competitor_threads": competitor_threads, "order": list(order), "runs": runs,
            "ratio": runs[1]["seconds"] / runs[0]["seconds"],
            "same_to_the_bit": same, "runs_compared": total,
            "same_verdict": runs[0]["verdict"] == runs[1]["verdict"]}


def main_job(config: Path, seeds: int, loads: list[int], matmul, auto_first: bool = False) -> dict:
    """Each load in turn (0: quiet; n: a competitor on n threads), the matmul rate around them all."""
    before = matmul()
    with tempfile.TemporaryDirectory(prefix="tiedlm-main-job-") as tmp:
        pairs = [pair(config, seeds, n, Path(tmp), auto_first) for n in loads]
        first = Path(tmp) / f"load{loads[0]}" / "jobs-1"
        for p in pairs[1:]:  # and every pair's runs against the first pair's
            cell = Path(tmp) / f"load{p['competitor_threads']}"
            p["same_as_first_pair"] = [same_runs(first, cell / f"jobs-{jobs}") for jobs in ("1", "auto")]
    return {"config": str(config), "seeds": seeds, "cores": os.cpu_count(), "matmul_flops_before": before,
            "matmul_flops_after": matmul(), "pairs": pairs}


def print_main_job(result: dict) -> None:
    rate = f"{result['matmul_flops_before'] / 1e9:.0f} GFLOP/s before, {result['matmul_flops_after'] / 1e9:.0f} after"
    print(f"\nthe main job (compare --config {result['config']} --seeds {result['seeds']}), "
          f"on {result['cores']} cores; the 2048³ matmul ran at {rate}")
    first = "--jobs auto first, then --jobs 1" if result["pairs"][0]["order"][0] == "auto" else \
        "--jobs 1 first, then --jobs auto"
    print(f"(each pair: {first}; the same runs to the bit: within the pair, "
          "then each command against the first pair's --jobs 1)")
    print("| load | --jobs 1 | --jobs auto | auto / 1 | 1-minute load (start – end of each) "
          "| runs the same to the bit | verdict the same |")
    print("| --- | ---: | ---: | ---: | --- | ---: | --- |")
    for p in result["pairs"]:
        n = p["competitor_threads"]
        name = "quiet" if not n else f"a competing {n}-thread process"
        one, auto = p["runs"]
        loads = " / ".join(f"{r['load_start']:.1f} – {r['load_end']:.1f}" for r in p["runs"])
        across = "".join(f"; {a} of {b}" for a, b in p.get("same_as_first_pair", []))
        print(f"| {name} | {one['seconds']:.1f} s | {auto['seconds']:.1f} s | {p['ratio']:.2f}× | {loads} | "
              f"{p['same_to_the_bit']} of {p['runs_compared']}{across} | {'yes' if p['same_verdict'] else 'no'} |")
