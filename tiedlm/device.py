"""Where a run executes: the device, the dtype and autocast, the threads of a CPU run, and how
much memory the device has and used. Every function here imports torch inside itself, so that
modules above can be imported (and `tiedlm --help` run) without it."""

from __future__ import annotations

import contextlib
import os
import sys
from contextlib import nullcontext
from pathlib import Path
from typing import Iterator, Mapping, MutableMapping

from .errors import ConfigError
from . import threads
from .threads import choose, current, usable_cpus


# ------------------------------------------------------------------------- OpenMP and threads

# torch's CPU build runs its thread pool on GNU OpenMP, whose threads spin this many times while
# they wait for the next parallel region (300,000 by default, milliseconds on a modern core). When
# another process holds a core, that spinning takes the time the other thread needs and a step
# slows by several times. This count took a step beside a 2-thread job from 3.7x its quiet time
# to 2.8x at no measured quiet cost, where PASSIVE (no spinning) cost 21% quiet
# (docs/studies/benchmarks.md, `scripts/bench.py --under-load`); train.threads: auto does the rest.
SPIN_COUNT = "10000"
# A user's choice of OpenMP wait behaviour, which tiedlm never overrides.
_WAIT_KEYS = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")
# MKL's conditional numerical reproducibility, strict: its matmuls give the same bits on any number
# of threads (by default it splits a long inner dimension between threads and adds the halves, so
# the thread count changed a run's weights). With norms.LayerNorm a training step is then the same
# on 1 or N threads, which lets train.threads: auto follow the load mid-run (tiedlm.threads). It
# costs 5-12% of a one-thread step, within noise on two (docs/studies/benchmarks.md). MKL reads it at
# its first call; a user's own MKL_CBWR is kept.
MKL_MODE = "AUTO,STRICT"


def thread_env(environ: Mapping[str, str]) -> dict[str, str]:
    """The variables tiedlm adds to an environment that sets none of its own: OpenMP's wait, and
    MKL's reproducible mode. A process started with them (a `--jobs` worker, whatever its command)
    waits and computes as tiedlm's CLI does. libgomp and MKL read them once, when torch is first
    imported or first calls MKL, so they belong in a process's environment before that."""
    added = {}
    if not any(key in environ for key in _WAIT_KEYS):
        added["GOMP_SPINCOUNT"] = SPIN_COUNT
    if "MKL_CBWR" not in environ:
        added["MKL_CBWR"] = MKL_MODE
    return added


def set_thread_env(environ: MutableMapping[str, str] = os.environ) -> dict[str, str]:
    """thread_env added to this process's environment, while torch is not imported yet (after, it
    would change nothing but what the process's children inherit, so nothing is set); returns what
    was added. The CLI (and the tests' conftest) call it before anything imports torch."""
    if "torch" in sys.modules:
        return {}
    added = thread_env(environ)
    environ.update(added)
    return added


# glibc's malloc hands a freed block above its mmap threshold (128 KiB, rising with what is freed
# up to 32 MiB) back to the system, and the next allocation of that size maps fresh pages that the
# kernel must zero on first touch. A training step frees and allocates the same activations every
# step: at the main job's shape 1,500-2,800 page faults and 4-8 ms of system time a step, and with
# two threads each returned block interrupts the other core too. With the threshold at
# MAP_FROM_BYTES and the trim threshold at KEEP_FREED_BYTES a process keeps what it freed below the
# first, up to the second, for its next allocation: 0-31 faults, a two-thread step 5-7% faster
# and a whole run of the main job's config 3-15% less time (docs/studies/benchmarks.md). Larger blocks are
# mapped afresh unless the heap has a free region that size: kept in the heap as a rule, they
# fragmented it, and a GPT-2-width model's peak memory grew from 1,281 to 1,996 MiB with the
# threshold at 1 GiB; at 64 MiB it was 1,327.
MAP_FROM_BYTES = 64 << 20
KEEP_FREED_BYTES = 1 << 30
# Some glibc releases refuse an mmap threshold above HEAP_MAX_SIZE / 2 (32 MiB on 64-bit); there
# the threshold is set to that instead.
FALLBACK_MMAP_BYTES = 32 << 20
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # mallopt's parameters, from glibc's malloc.h
KEEP_FREED_ENV = "TIEDLM_KEEP_FREED"  # "0": glibc's malloc as it comes
# A user's own choice of glibc's malloc thresholds, which tiedlm never overrides (glibc then stops
# moving its threshold, at 128 KiB where unset: a main-job run took 1.5x its time with malloc as it
# comes, 1.7x its time with freed memory kept, with MALLOC_TRIM_THRESHOLD_ alone set).
MALLOC_KEYS = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_TOP_PAD_", "MALLOC_MMAP_MAX_")
_MALLOC_TUNABLES = ("glibc.malloc.mmap_threshold", "glibc.malloc.trim_threshold", "glibc.malloc.top_pad",
                    "glibc.malloc.mmap_max")


def keep_freed_memory(environ: Mapping[str, str] = os.environ) -> bool:
    """Set glibc's malloc to keep freed blocks below MAP_FROM_BYTES (up to KEEP_FREED_BYTES in all)
    for the process's next allocations instead of returning them to the system; True where it was
    set. Nothing is done where TIEDLM_KEEP_FREED is 0, off Linux, under a C library other than
    glibc, or where the environment sets one of glibc's malloc thresholds (MALLOC_KEYS, or those
    tunables in GLIBC_TUNABLES). It lasts for the process and cannot be undone, so only the command
    calls it: `tiedlm.cli` when it is imported, and a `--jobs` worker (parallel.serve); the rest of
    the library never does."""
    if environ.get(KEEP_FREED_ENV) == "0":
        return False
    if not sys.platform.startswith("linux") or any(key in environ for key in MALLOC_KEYS):
        return False
    if any(name in environ.get("GLIBC_TUNABLES", "") for name in _MALLOC_TUNABLES):
        return False
    import ctypes

    try:
        libc = ctypes.CDLL(None)
        libc.gnu_get_libc_version  # noqa: B018  (glibc's own symbol: musl's mallopt does nothing)
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    # The threshold first: setting either one stops glibc moving the threshold with what is freed.
    mapped = mallopt(_M_MMAP_THRESHOLD, MAP_FROM_BYTES) or mallopt(_M_MMAP_THRESHOLD, FALLBACK_MMAP_BYTES)
    trimmed = mallopt(_M_TRIM_THRESHOLD, KEEP_FREED_BYTES)
    return bool(mapped and trimmed)


def auto_threads(cores: int, load: float) -> int:
    """train.threads: auto where it is decided once, as a run starts: the cores this process may
    use less the 1-minute load average (the processes already running or waiting for a core),
    rounded, at least 1 and at most `cores`. On a quiet machine that is every core; beside a 2-thread
    job on 2 cores it is 1, which leaves the other job its core instead of taking turns with it."""

    return choose(cores, load, cores)


def machine_threads() -> int:
    """auto_threads of this machine now (threads.usable_cpus: on Linux the affinity mask)."""

    try:
        load = os.getloadavg()[0]
    except (AttributeError, OSError):  # no load average (Windows): every core
        load = 0.0
    return auto_threads(len(usable_cpus()), load)


def resolve_threads(threads: int | str) -> int:
    """train.threads as a count for cpu_threads: "auto" by machine_threads, 0 (torch's default)
    and a number as they are."""
    return machine_threads() if threads == "auto" else int(threads)


def resolve_device(name: str, key: str = "train.device", fix: str = "--set train.device=auto"):
    """auto -> cuda, mps or cpu, in that order of preference; a named device must be visible.
    `key` is where the name came from and `fix` the option that changes it, for the message: a
    run's config (`--set train.device=auto`) or a command's own `--device auto`."""
    import torch

    if name == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda")
        if getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available():
            return torch.device("mps")
        return torch.device("cpu")
    if name.startswith("cuda"):
        if not torch.cuda.is_available():
            raise ConfigError(f"{key} is {name} but no CUDA device is visible — use {fix} (or cpu)")
        idx = int(name.split(":")[1]) if ":" in name else 0
        if idx >= torch.cuda.device_count():
            raise ConfigError(f"{key} is {name} but only {torch.cuda.device_count()} CUDA "
                              "device(s) are visible — choose one of them")
    if name == "mps" and not (getattr(torch.backends, "mps", None) and torch.backends.mps.is_available()):
        raise ConfigError(f"{key} is mps but MPS is not available — use {fix}")
    return torch.device(name)


def resolve_dtype(name: str, device) -> str:
    """auto: bf16 autocast on CUDA devices that support it, fp32 elsewhere (bf16 on a CPU without
    bf16 units is ~100x slower than fp32)."""
    import torch

    if name != "auto":
        return name
    if device.type == "cuda" and torch.cuda.is_bf16_supported():
        return "bf16"
    return "fp32"


def autocast_ctx(device, dtype: str):
    import torch

    if dtype == "bf16":
        return torch.autocast(device_type=device.type, dtype=torch.bfloat16)
    return nullcontext()


@contextlib.contextmanager
def cpu_threads(n: int | str) -> Iterator[None]:
    """torch's CPU thread count set to n (0: left as it is) for the duration, then restored: a
    library call must not change a setting of the process that called it. "auto": where this
    process's steps are the same to the bit on any count (threads.invariant), a threads.Governor
    follows the load from torch's count down, mid-run; elsewhere resolve_threads, once."""
    import torch

    before = torch.get_num_threads()
    adaptive = n == "auto" and len(threads.usable_cpus()) > 1 and threads.invariant()
    if adaptive:
        threads.start(ceiling=before)
    else:
        n = resolve_threads(n)
        if n:
            torch.set_num_threads(n)
    try:
        yield
    finally:
        if adaptive:
            threads.stop()
        if adaptive or n:
            torch.set_num_threads(before)


def threads_used(device) -> dict | None:
    """What report.json says of a CPU run's threads: {"adaptive": true, "seconds": {count: seconds}}
    under a threads.Governor, else {"adaptive": false, "threads": the count}; None off the CPU."""
    if getattr(device, "type", None) != "cpu":
        return None
    import torch

    gov = current()
    return gov.summary() if gov is not None else {"adaptive": False, "threads": torch.get_num_threads()}


@contextlib.contextmanager
def tf32_matmuls(device) -> Iterator[None]:
    """On CUDA, fp32 matmuls in TF32 (torch's "high" precision: ~3x the fp32 rate on Ampere and
    later, 10-bit mantissa products with fp32 accumulation) for the duration, then restored. Runs in
    bf16 autocast do their matmuls in bf16 anyway; CPU runs are untouched."""
    import torch

    if getattr(device, "type", None) != "cuda":
        yield
        return
    before = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("high")
    try:
        yield
    finally:
        torch.set_float32_matmul_precision(before)


def device_memory(device) -> tuple[int | None, str]:
    """(bytes, description) of the memory a run on `device` can use: the GPU's total memory, or
    for the CPU the physical memory capped by a cgroup limit (a container or a Slurm job)."""
    if device.type == "cuda":
        import torch

        props = torch.cuda.get_device_properties(device)
        return int(props.total_memory), f"{props.name} ({device})"
    try:
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, OSError, ValueError):
        return None, "this machine"
    for limit_file in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        try:
            limit = Path(limit_file).read_text().strip()
        except OSError:
            continue
        if limit.isdigit() and 0 < int(limit) < total:
            return int(limit), "this machine's memory limit (cgroup)"
    return int(total), "this machine"


def peak_memory(device) -> tuple[int, str]:
    """(bytes, what was measured): CUDA's peak allocation, or the process's peak resident set."""
    if device.type == "cuda":
        import torch

        return int(torch.cuda.max_memory_allocated(device)), "cuda max_memory_allocated"
    import resource

    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(rss * (1 if sys.platform == "darwin" else 1024)), "process peak RSS"

