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

from tests import cpu_probe
from tests.conftest import script_module
from tiedlm.device import MKL_MODE, SPIN_COUNT, auto_threads, resolve_threads, set_thread_env, thread_env
from tiedlm.errors import ConfigError

ROOT = Path(__file__).resolve().parents[1]
OPENMP_KEYS = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "OMP_NUM_THREADS", "MKL_NUM_THREADS", "MKL_CBWR",
               "MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_TOP_PAD_", "MALLOC_MMAP_MAX_", "GLIBC_TUNABLES",
               "TIEDLM_KEEP_FREED")

# In a fresh process: run `tiedlm --version` as `python -m tiedlm` does (or import the CLI, as the
# `tiedlm` script does), note whether torch was imported by then, import torch, and print what its
# OpenMP saw: the variables in the C environment (what libgomp reads) and torch's thread count; and
# the page faults that allocating, touching and freeing a 48 MiB tensor takes, after ten of them
# (12,288 pages: every one faults where malloc gave the memory back to the system).
PROBE = """
import ctypes, json, os, resource, runpy, sys
entry = sys.argv[1]
if entry == "library":
    import tiedlm.train
elif entry == "worker":  # a --jobs worker, as the pool starts it, given no run
    from tiedlm.experiment.parallel import serve
    serve()
elif entry == "module":
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
seen = {k: (getenv(k.encode()) or b"").decode() or None for k in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "MKL_CBWR")}
from tiedlm.threads import invariant
for _ in range(10):  # glibc settles on where the block goes within a few
    torch.ones(12 * 2**20)
before_faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(10):
    torch.ones(12 * 2**20)
faults = (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before_faults) / 10
print(json.dumps({"torch_before": before, "seen": seen, "threads": torch.get_num_threads(),
                  "invariant": invariant(), "faults": faults}))
"""


def _glibc() -> bool:
    try:
        glibc = sys.platform.startswith("linux") and (os.confstr("CS_GNU_LIBC_VERSION") or "").startswith("glibc")
    except (AttributeError, ValueError, OSError):
        return False
    try:  # with transparent huge pages always on, a fresh 48 MiB block faults in a few dozen times
        thp = Path("/sys/kernel/mm/transparent_hugepage/enabled").read_text()
    except OSError:
        thp = ""
    return glibc and "[always]" not in thp


FAULTS = pytest.mark.skipif(not _glibc(), reason="glibc's malloc, counted in 4 KiB page faults (no THP always)")


PAGES = 12 * 2**20 * 4 // 4096  # of the probe's 48 MiB tensor: above glibc's own 32 MiB, below tiedlm's 64


def probe(entry: str, **env: str) -> dict:
    full = {k: v for k, v in os.environ.items() if k not in OPENMP_KEYS}
    full.update(env)
    out = subprocess.run([sys.executable, "-c", PROBE, entry], capture_output=True, text=True, env=full,
                         cwd=ROOT, timeout=120, stdin=subprocess.DEVNULL)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("entry", ["module", "script"])
def test_the_cli_sets_openmp_s_wait_before_torch_loads(entry):
    got = probe(entry)
    assert not got["torch_before"]  # `tiedlm --version` (and --help) never import torch
    assert got["seen"] == {"OMP_WAIT_POLICY": None, "GOMP_SPINCOUNT": SPIN_COUNT, "MKL_CBWR": MKL_MODE}
    assert got["invariant"]  # MKL's strict mode is in force: a step is the same on any thread count


@FAULTS
@pytest.mark.parametrize("entry", ["module", "script", "worker"])
def test_the_command_and_its_workers_keep_freed_memory_for_the_next_allocation(entry):
    """The command's process and a --jobs worker reuse a freed 48 MiB block: the kernel maps and
    zeroes no new pages."""
    assert probe(entry)["faults"] < PAGES / 20


@FAULTS
@pytest.mark.parametrize("entry, env", [("library", {}), ("module", {"TIEDLM_KEEP_FREED": "0"}),
                                        ("module", {"MALLOC_TRIM_THRESHOLD_": "131072"}),
                                        ("script", {"GLIBC_TUNABLES": "glibc.malloc.mmap_threshold=131072"})])
def test_the_library_an_opt_out_and_a_user_s_own_malloc_settings_are_left_alone(entry, env):
    """The control: glibc's own behaviour maps (and faults in) every page of each new 48 MiB
    block, in a program that only imports tiedlm, where the command is told not to set malloc, and
    under a user's own malloc settings."""
    assert probe(entry, **env)["faults"] > PAGES / 2


def test_without_the_cli_s_mode_the_split_matmul_differs():
    """The probe can fail: in a process that never had MKL_CBWR, MKL splits the long inner
    dimension between two threads and the bits change (so train.threads: auto stays fixed there).
    Where this CPU's MKL gives the same bits without the mode too (tests/cpu_probe.py), there is no
    difference to see: skipped, and the next test shows the probe failing on any machine."""
    if not cpu_probe.shows_thread_differences():
        pytest.skip(cpu_probe.skip_reason())
    code = "from tiedlm.threads import invariant; print(invariant())"
    env = {k: v for k, v in os.environ.items() if k not in OPENMP_KEYS}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=ROOT, timeout=120)
    assert out.stdout.strip() == "False", out.stderr


def test_the_probe_fails_where_two_threads_give_other_bits(monkeypatch):
    """On every machine: threads.invariant() is False where a matmul on two threads gives other
    bits than on one (here a matmul made to differ by one ulp on two threads), and True where it
    does not; so train.threads: auto keeps its count fixed wherever the bits depend on it."""
    import torch

    from tiedlm import threads

    real = torch.Tensor.__matmul__

    def on_two_threads_off_by_an_ulp(a, b):
        out = real(a, b)
        return torch.nextafter(out, torch.full_like(out, float("inf"))) if torch.get_num_threads() == 2 else out

    before = torch.get_num_threads()
    monkeypatch.setattr(threads, "_invariant", None)
    monkeypatch.setattr(torch.Tensor, "__matmul__", on_two_threads_off_by_an_ulp)
    assert threads.invariant() is False
    assert torch.get_num_threads() == before  # the probe puts the count back
    monkeypatch.setattr(torch.Tensor, "__matmul__", real)
    monkeypatch.setattr(threads, "_invariant", None)
    assert threads.invariant() is True  # this process has the mode (the conftest set it, as the CLI does)


@pytest.mark.parametrize("user", [{"OMP_WAIT_POLICY": "PASSIVE"}, {"OMP_WAIT_POLICY": "ACTIVE"},
                                  {"GOMP_SPINCOUNT": "123"}])
def test_a_user_s_own_wait_is_kept(user):
    got = probe("module", **user)
    assert got["seen"] == {"OMP_WAIT_POLICY": None, "GOMP_SPINCOUNT": None, "MKL_CBWR": MKL_MODE, **user}


def test_a_user_s_own_mkl_mode_is_kept():
    got = probe("module", MKL_CBWR="COMPATIBLE")
    assert got["seen"]["MKL_CBWR"] == "COMPATIBLE" and got["seen"]["GOMP_SPINCOUNT"] == SPIN_COUNT


def test_a_user_s_own_thread_count_is_kept():
    got = probe("module", OMP_NUM_THREADS="1")
    assert got["threads"] == 1
    assert got["seen"]["GOMP_SPINCOUNT"] == SPIN_COUNT  # the wait is tiedlm's, the count the user's


def test_thread_env_adds_only_what_the_user_left_unset():
    both = {"GOMP_SPINCOUNT": SPIN_COUNT, "MKL_CBWR": MKL_MODE}
    assert thread_env({}) == both
    assert thread_env({"OMP_NUM_THREADS": "3"}) == both
    assert thread_env({"OMP_WAIT_POLICY": "ACTIVE"}) == {"MKL_CBWR": MKL_MODE}
    assert thread_env({"GOMP_SPINCOUNT": "0"}) == {"MKL_CBWR": MKL_MODE}
    assert thread_env({"MKL_CBWR": "AVX2"}) == {"GOMP_SPINCOUNT": SPIN_COUNT}


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
    from tiedlm.config.checks import validate
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
    from tiedlm.experiment.parallel import available_cores

    r = mod.pool_ceiling(rounds=1, steps=2, warmup=0)
    n = available_cores()
    assert [p.args[-1] for p in started] == ["--timer"] * (n + 1) and all(p.returncode is not None for p in started)
    assert r["steps"] == 2 and r["cores"] == n
    assert r["ratio"] == pytest.approx(r["parallel_s"] / (n * r["alone_s"]))
    assert r["contention"] == pytest.approx(r["parallel_s"] / r["one_thread_s"])
    assert all(r[k] > 0 for k in ("alone_s", "one_thread_s", "parallel_s"))


@pytest.mark.skipif(not _glibc(), reason="glibc's malloc only")
def test_the_allocator_bench_sets_malloc_in_half_its_timers(monkeypatch):
    """scripts/bench.py --allocator: on one thread and on every core, one timer with the command's
    malloc setting in force and one without (as each timer's process reports it, whatever the
    caller's own environment says of malloc), and none is left running. That the setting removes
    the faults is test_the_command_and_its_workers_keep_freed_memory_...'s."""
    from tiedlm.experiment.parallel import available_cores

    monkeypatch.setenv("TIEDLM_KEEP_FREED", "0")  # the caller's: no timer may inherit it
    mod = bench_load()
    started = []
    real = mod.start_timer
    monkeypatch.setattr(mod, "start_timer", lambda env: started.append(real(env)) or started[-1])
    r = mod.allocator(rounds=1, steps=2, warmup=1)
    counts = {1, available_cores()}
    assert sorted((row["threads"], row["keep_freed"]) for row in r["rows"]) == sorted(
        (n, keep) for n in counts for keep in (False, True))
    assert all(row["applied"] == row["keep_freed"] for row in r["rows"])
    assert r["steps"] == 2 and all(row["step_s"] > 0 for row in r["rows"])
    assert len(started) == 2 * len(counts) and all(p.returncode is not None for p in started)


# ------------------------------------------------------------------ the governor (train.threads: auto)

STAT = """cpu  500 0 300 9000 10 0 0 0 0 0
cpu0 100 5 50 4000 3 7 11 13 0 0
cpu1 400 0 250 5000 7 0 0 2 0 0
cpu2 1 1 1 1 1 1 1 1 0 0
intr 12345
"""


def test_busy_seconds_counts_the_usable_cpus_busy_columns(monkeypatch):
    from tiedlm.threads import busy_seconds

    hz = os.sysconf("SC_CLK_TCK")
    # user nice system irq softirq steal; idle and iowait are not busy; guest is inside user
    assert busy_seconds([0], STAT) == pytest.approx((100 + 5 + 50 + 7 + 11 + 13) / hz)
    assert busy_seconds([0, 1], STAT) == pytest.approx((186 + 400 + 250 + 2) / hz)
    assert busy_seconds([7], STAT) is None  # no such CPU: no reading, not zero


class Machine:
    """A fake clock and /proc/stat: `others` cores busy with other processes, `ours` with this one."""

    def __init__(self):
        self.t = self.busy = self.own = 0.0
        self.set = []

    def run(self, seconds, others, ours):
        self.t += seconds
        self.busy += seconds * (others + ours)
        self.own += seconds * ours

    def governor(self, ceiling=2, threads=2):
        from tiedlm.threads import Governor

        return Governor(ceiling, clock=lambda: self.t, busy=lambda: self.busy, own=lambda: self.own,
                        apply=self.set.append, threads=threads)


def test_the_governor_leaves_the_cores_others_use_and_takes_them_back(monkeypatch):
    from tiedlm import threads

    monkeypatch.setattr(threads, "usable_cpus", lambda: [0, 1])
    m = Machine()
    gov = m.governor()
    m.run(0.1, others=1.3, ours=0.7)
    assert gov.tick() == 2 and m.set == []  # before the first look (FIRST_S): nothing decided
    m.run(0.2, others=1.3, ours=0.7)
    assert gov.tick() == 1 and m.set == [1]  # a 2-thread competitor: one core left
    m.run(0.5, others=0.0, ours=1.0)
    assert gov.tick() == 1  # within the interval: unchanged
    m.run(0.6, others=0.0, ours=1.0)
    assert gov.tick() == 2 and m.set == [1, 2]  # the competitor is gone: both cores again
    m.run(1.1, others=0.3, ours=1.7)
    assert gov.tick() == 2  # a light load (0.3 of a core) is rounded away
    m.run(1.1, others=0.6, ours=1.4)
    assert gov.tick() == 1
    assert set(gov.summary()["seconds"]) == {"1", "2"} and gov.summary()["adaptive"] is True
    assert sum(gov.seconds.values()) == pytest.approx(m.t)


def test_the_governor_stays_within_one_and_its_ceiling(monkeypatch):
    from tiedlm import threads

    monkeypatch.setattr(threads, "usable_cpus", lambda: list(range(8)))
    m = Machine()
    gov = m.governor(ceiling=4, threads=4)
    m.run(1.1, others=0.0, ours=4.0)
    assert gov.tick() == 4 and m.set == []  # 8 free cores, but never above torch's count
    m.run(1.1, others=7.5, ours=0.6)
    assert gov.tick() == 1  # never below one
    m.run(1.1, others=5.0, ours=1.0)
    assert gov.tick() == 3


def test_the_governor_keeps_its_count_without_a_reading(monkeypatch):
    from tiedlm import threads

    monkeypatch.setattr(threads, "usable_cpus", lambda: [0, 1])
    m = Machine()
    gov = threads.Governor(2, clock=lambda: m.t, busy=lambda: None, own=lambda: m.own, apply=m.set.append,
                           threads=2)
    m.run(2.0, others=2.0, ours=0.0)
    assert gov.tick() == 2 and m.set == []


def test_auto_is_decided_once_where_the_steps_depend_on_the_count(monkeypatch):
    """Without MKL's mode (threads.invariant false) auto is the old rule, once: no governor runs."""
    import torch

    from tiedlm import threads
    from tiedlm.device import cpu_threads

    monkeypatch.setattr(threads, "_invariant", False)
    monkeypatch.setattr(os, "getloadavg", lambda: (5.0, 5.0, 5.0))
    before = torch.get_num_threads()
    with cpu_threads("auto"):
        assert threads.current() is None and torch.get_num_threads() == 1
    assert torch.get_num_threads() == before
    monkeypatch.setattr(threads, "_invariant", True)
    monkeypatch.setattr(threads, "usable_cpus", lambda: [0, 1])
    with cpu_threads("auto"):
        assert threads.current() is not None
    assert threads.current() is None and torch.get_num_threads() == before


def test_a_window_in_which_this_process_waited_decides_nothing(monkeypatch):
    """Between runs (or while a bench's other timers run) the other processes' work says nothing of
    what sharing costs this one: the count stays, and the next busy window decides."""
    from tiedlm import threads

    monkeypatch.setattr(threads, "usable_cpus", lambda: [0, 1])
    m = Machine()
    gov = m.governor()
    m.run(2.0, others=2.0, ours=0.1)
    assert gov.tick() == 2 and m.set == []
    m.run(1.1, others=1.0, ours=1.0)
    assert gov.tick() == 1 and m.set == [1]
