"""CPU threads and OpenMP's wait: the CLI's defaults are in the environment before torch loads
its pool, a user's own settings win, `train.threads: auto` follows its rule, and the bench's
competing process never outlives it. No timing is asserted here (scripts/bench.py --under-load
measures)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import script_module
from tiedlm.device import SPIN_COUNT, auto_threads, resolve_threads, set_thread_env, thread_env
from tiedlm.errors import ConfigError

ROOT = Path(__file__).resolve().parents[1]
OPENMP_KEYS = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "OMP_NUM_THREADS", "MKL_NUM_THREADS")

# In a fresh process: run `tiedlm --version` as `python -m tiedlm` does (or import the CLI, as the
# `tiedlm` script does), note whether torch was imported by then, import torch, and print what its
# OpenMP saw: the variables in the C environment (what libgomp reads) and torch's thread count.
PROBE = """
import ctypes, json, os, runpy, sys
entry = sys.argv[1]
if entry == "module":
    sys.argv = ["tiedlm", "--version"]
    try:
        runpy.run_module("tiedlm", run_name="__main__", alter_sys=True)
    except SystemExit:
        pass
else:
    import tiedlm.cli
before = "torch" in sys.modules
import torch
getenv = ctypes.CDLL(None).getenv
getenv.restype = ctypes.c_char_p
seen = {k: (getenv(k.encode()) or b"").decode() or None for k in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")}
print(json.dumps({"torch_before": before, "seen": seen, "threads": torch.get_num_threads()}))
"""


def probe(entry: str, **env: str) -> dict:
    full = {k: v for k, v in os.environ.items() if k not in OPENMP_KEYS}
    full.update(env)
    out = subprocess.run([sys.executable, "-c", PROBE, entry], capture_output=True, text=True, env=full,
                         cwd=ROOT, timeout=120)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("entry", ["module", "script"])
def test_the_cli_sets_openmp_s_wait_before_torch_loads(entry):
    got = probe(entry)
    assert not got["torch_before"]  # `tiedlm --version` (and --help) never import torch
    assert got["seen"] == {"OMP_WAIT_POLICY": None, "GOMP_SPINCOUNT": SPIN_COUNT}


@pytest.mark.parametrize("user", [{"OMP_WAIT_POLICY": "PASSIVE"}, {"OMP_WAIT_POLICY": "ACTIVE"},
                                  {"GOMP_SPINCOUNT": "123"}])
def test_a_user_s_own_wait_is_kept(user):
    got = probe("module", **user)
    assert got["seen"] == {"OMP_WAIT_POLICY": None, "GOMP_SPINCOUNT": None, **user}


def test_a_user_s_own_thread_count_is_kept():
    got = probe("module", OMP_NUM_THREADS="1")
    assert got["threads"] == 1
    assert got["seen"]["GOMP_SPINCOUNT"] == SPIN_COUNT  # the wait is tiedlm's, the count the user's


def test_thread_env_adds_only_what_the_user_left_unset():
    assert thread_env({}) == {"GOMP_SPINCOUNT": SPIN_COUNT}
    assert thread_env({"OMP_NUM_THREADS": "3"}) == {"GOMP_SPINCOUNT": SPIN_COUNT}
    assert thread_env({"OMP_WAIT_POLICY": "ACTIVE"}) == {}
    assert thread_env({"GOMP_SPINCOUNT": "0"}) == {}


def test_nothing_is_set_once_torch_is_imported():
    import torch  # noqa: F401  (this process's pool has read its environment already)

    env: dict = {}
    assert set_thread_env(env) == {} and env == {}


@pytest.mark.parametrize("cores, load, threads", [
    (2, 0.0, 2), (2, 0.4, 2), (2, 0.6, 1), (2, 1.0, 1), (2, 2.0, 1), (2, 7.5, 1),
    (8, 0.0, 8), (8, 3.0, 5), (8, 2.5, 6), (8, -1.0, 8), (1, 0.0, 1), (1, 3.0, 1)])
def test_auto_threads_leaves_the_busy_cores(cores, load, threads):
    assert auto_threads(cores, load) == threads


def test_auto_reads_this_machine(monkeypatch):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1, 2, 3}, raising=False)
    monkeypatch.setattr(os, "getloadavg", lambda: (1.2, 9.0, 9.0))  # the last minute, not the last 15
    assert resolve_threads("auto") == 3
    assert resolve_threads(0) == 0 and resolve_threads(5) == 5


def test_train_threads_takes_a_count_or_auto():
    from tiedlm.checks import validate
    from tiedlm.config import load_config

    assert load_config(ROOT / "configs/base.yaml", ["train.threads=auto"]).train.threads == "auto"
    assert load_config(ROOT / "configs/base.yaml", ["train.threads=3"]).train.threads == 3
    for bad in ("many", "-1"):
        with pytest.raises(ConfigError, match="train.threads"):
            validate(load_config(ROOT / "configs/base.yaml", [f"train.threads={bad}"]))


def bench_load():
    return script_module("bench_load")


def test_the_bench_s_competing_process_is_ended_by_pid():
    mod = bench_load()
    proc = mod.start_competitor(seconds=60)  # started, ready, and paused
    try:
        assert proc.poll() is None
    finally:
        mod.end(proc)
    assert proc.returncode is not None
    with pytest.raises(ProcessLookupError):
        os.kill(proc.pid, 0)


def test_the_pool_ceiling_times_both_workers_at_once_and_ends_every_timer(monkeypatch):
    """scripts/bench.py --pool-ceiling: one timer on every core and one per core, its arithmetic on
    its own medians, and no timer left running."""
    mod = bench_load()
    started = []
    real = mod.start_timer
    monkeypatch.setattr(mod, "start_timer", lambda env: started.append(real(env)) or started[-1])
    from tiedlm.parallel import available_cores

    r = mod.pool_ceiling(rounds=1, steps=2, warmup=0)
    n = available_cores()
    assert [p.args[-1] for p in started] == ["--timer"] * (n + 1) and all(p.returncode is not None for p in started)
    assert r["steps"] == 2 and r["cores"] == n
    assert r["ratio"] == pytest.approx(r["parallel_s"] / (n * r["alone_s"]))
    assert r["contention"] == pytest.approx(r["parallel_s"] / r["one_thread_s"])
    assert all(r[k] > 0 for k in ("alone_s", "one_thread_s", "parallel_s"))
