"""A CPU run's thread count, following the machine's load while the run trains (`train.threads:
auto`, the default).

Two threads on two cores that another process also wants make every parallel region wait for
whichever thread the scheduler left out: a step slowed 2.8-4x beside one competing 2-thread job,
where one thread slowed 1.1x (docs/studies/benchmarks.md). The right count is the cores that other processes
leave free, and that changes while a run trains. Changing it costs nothing in the result only where
a step's arithmetic does not depend on the count: MKL's strict reproducible mode for the matmuls
(`MKL_CBWR`, set by device.thread_env before torch loads) and norms.LayerNorm for the one kernel that
still summed per thread. `invariant()` checks that the mode is in force in this process; only then
does the Governor change the count mid-run. Otherwise (torch loaded before tiedlm could set the mode,
a BLAS other than MKL) `auto` is decided once, as the run starts, from the 1-minute load.

The Governor reads, about once a second, the busy time of the CPUs this process may use
(/proc/stat) less this process's own CPU time: what the other processes used, in cores. The count
is the usable cores less that, rounded, between 1 and the ceiling (torch's default count). A second
in which this process itself mostly waited decides nothing: what others did then is no measure of
what sharing the cores costs it. Linux
only; elsewhere the count stays where it started."""

from __future__ import annotations

import os
import time

INTERVAL_S = 1.0  # how often the count is reconsidered
FIRST_S = 0.2  # the first look comes sooner: a run that starts beside a busy process leaves it soon
ACTIVE = 0.5  # a window in which this process used less CPU than this (in cores) decides nothing
# /proc/stat's columns of a cpuN line that are busy time: user nice system irq softirq steal (guest
# time is inside user); idle and iowait are not.
_BUSY = (1, 2, 3, 6, 7, 8)
_invariant: bool | None = None


def usable_cpus() -> list[int]:
    """The CPUs this process may run on: its affinity mask (which a cgroup's cpuset or taskset
    narrows), or every CPU where there is none."""
    try:
        return sorted(os.sched_getaffinity(0))
    except AttributeError:
        return list(range(os.cpu_count() or 1))


def busy_seconds(cpus: list[int], text: str | None = None) -> float | None:
    """The busy time of `cpus` since boot, in CPU-seconds, from /proc/stat (or its `text`); None
    where it cannot be read (not Linux)."""
    if text is None:
        try:
            with open("/proc/stat") as f:
                text = f.read()
        except OSError:
            return None
    wanted = {f"cpu{c}" for c in cpus}
    ticks = 0
    found = False
    for line in text.splitlines():
        fields = line.split()
        if fields and fields[0] in wanted:
            ticks += sum(int(fields[i]) for i in _BUSY if i < len(fields))
            found = True
    return ticks / os.sysconf("SC_CLK_TCK") if found else None


def choose(cores: int, others: float, ceiling: int) -> int:
    """The thread count when other processes use `others` cores of `cores`: the rest, rounded, at
    least 1 and at most `ceiling`."""
    return max(1, min(ceiling, int(cores - others + 0.5)))


def invariant() -> bool:
    """Whether a matmul that MKL splits along its inner dimension gives the same bits on one thread
    as on two in this process: whether MKL's strict reproducible mode is in force (it is read at
    MKL's first call, so it cannot be set later). Measured once per process (about a millisecond)."""
    global _invariant
    if _invariant is None:
        import torch

        gen = torch.Generator().manual_seed(0)
        a, b = torch.randn(128, 4096, generator=gen), torch.randn(4096, 128, generator=gen)
        before = torch.get_num_threads()
        try:
            torch.set_num_threads(1)
            one = a @ b
            torch.set_num_threads(2)
            _invariant = torch.equal(one, a @ b)
        finally:
            torch.set_num_threads(before)
    return _invariant


class Governor:
    """Sets torch's thread count from the load, at most once per INTERVAL_S, when `tick()` is
    called (once per training step or evaluation batch). `seconds` holds the time spent at each
    count, for the run's report. The clock, the two CPU-time readings and the setter can be given
    (tests)."""

    def __init__(self, ceiling: int, clock=time.monotonic, busy=None, own=time.process_time, apply=None,
                 threads: int | None = None):
        import torch

        self.cpus = usable_cpus()
        self.ceiling = max(1, ceiling)
        self.threads = threads or torch.get_num_threads()
        self._clock, self._own = clock, own
        self._busy = busy or (lambda: busy_seconds(self.cpus))
        self._apply = apply or torch.set_num_threads
        self._last = self._sample()
        self._ticked = self._last[0]
        self._interval = FIRST_S
        self.seconds: dict[int, float] = {}

    def _sample(self) -> tuple[float, float | None, float]:
        return self._clock(), self._busy(), self._own()

    def tick(self) -> int:
        now = self._clock()
        self.seconds[self.threads] = self.seconds.get(self.threads, 0.0) + (now - self._ticked)
        self._ticked = now
        if now - self._last[0] < self._interval:
            return self.threads
        self._interval = INTERVAL_S
        t, busy, own = sample = self._sample()
        t0, busy0, own0 = self._last
        self._last = sample
        if busy is None or busy0 is None or t <= t0:
            return self.threads
        if (own - own0) / (t - t0) < ACTIVE:  # this process mostly waited (between runs, on its input):
            return self.threads  # the window shows other processes' work, not what sharing costs now
        others = max(0.0, (busy - busy0) - (own - own0)) / (t - t0)
        want = choose(len(self.cpus), others, self.ceiling)
        if want != self.threads:
            self._apply(want)
            self.threads = want
        return self.threads

    def summary(self) -> dict:
        """{"adaptive": True, "seconds": {count: seconds at it}} for report.json."""
        return {"adaptive": True, "seconds": {str(k): round(v, 1) for k, v in sorted(self.seconds.items())}}


_governor: Governor | None = None


_settled: int | None = None  # the count the last run of this process ended at


def start(ceiling: int) -> Governor:
    """This process's governor for one run, never above `ceiling`: it starts at the count the
    process's previous run ended at (a `--jobs` worker's second run beside the other worker starts
    at one thread), else at torch's."""
    global _governor
    if _settled is not None and _settled <= ceiling:
        import torch

        torch.set_num_threads(_settled)
    _governor = Governor(ceiling)
    return _governor


def stop() -> None:
    global _governor, _settled
    if _governor is not None:
        _settled = _governor.threads
    _governor = None


def current() -> Governor | None:
    return _governor


def tick() -> None:
    """The running governor's tick, where there is one (a training step, an evaluation batch)."""
    if _governor is not None:
        _governor.tick()
