"""Whether this machine can show what MKL's strict mode (MKL_CBWR) prevents: a matmul that gives
other bits on two threads than on one. On some CPUs (an AMD EPYC with torch 2.13.0+cpu) MKL gives
the same bits on any thread count even without the mode, so a control test that expects a
difference there cannot show one; it skips with SKIP_REASON. The tests that the mode makes results
identical run everywhere."""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MODE_KEYS = ("MKL_CBWR", "OMP_NUM_THREADS", "MKL_NUM_THREADS")

# (rows, inner, columns): threads.invariant's own shape, a weight gradient's (2,048 rows summed),
# and a long thin inner dimension
SHAPES = [(128, 4096, 128), (32, 2048, 128), (128, 2048, 32), (4, 65536, 4), (64, 16384, 64)]

PROBE = """
import json, sys, torch
from tiedlm.threads import invariant
differ = []
gen = torch.Generator().manual_seed(0)
for m, k, n in json.loads(sys.argv[1]):
    a, b = torch.randn(m, k, generator=gen), torch.randn(k, n, generator=gen)
    torch.set_num_threads(1)
    one = a @ b
    torch.set_num_threads(2)
    differ.append(not torch.equal(one, a @ b))
print(json.dumps({"invariant": invariant(), "differ": differ}))
"""

SKIP_REASON = ("this CPU's MKL gives the same bits on one thread and on two even without MKL_CBWR "
               "(no split matmul of {} shapes differs), so the difference the strict mode prevents "
               "cannot show here; the invariance tests with the mode still run")


@functools.lru_cache(maxsize=1)
def without_mode() -> dict:
    """In a fresh process that never had MKL_CBWR: {"invariant": threads.invariant(), "differ":
    for each of SHAPES whether one and two threads gave other bits}."""
    env = {k: v for k, v in os.environ.items() if k not in MODE_KEYS}
    out = subprocess.run([sys.executable, "-c", PROBE, json.dumps(SHAPES)], capture_output=True, text=True,
                         env=env, cwd=ROOT, timeout=120, stdin=subprocess.DEVNULL)
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def shows_thread_differences() -> bool:
    """Whether, without the mode, any simple split matmul differs between one and two threads here."""
    got = without_mode()
    return any(got["differ"]) or not got["invariant"]


def skip_reason() -> str:
    return SKIP_REASON.format(len(SHAPES) + 1)
