"""Several runs at once, on worker processes: what `--jobs N` of `tiedlm compare --config` and
`tiedlm sweep` does (jobs.train_jobs hands its unfinished runs here when N > 1).

A WorkerPool holds up to N long-lived workers (`serve`: a process that trains the runs it is sent,
one after another, each by train_run on the run's exact resolved config, written with
config.to_yaml to a temporary file), into the same folder under the same name as the sequential
path, so its results do not depend on --jobs: a run trained here ends with the same weights and
metrics, bit for bit, as the same run trained in-process (on any thread count: device.thread_env). A worker pays
its imports once and is kept from one stage of a comparison to the next (jobs.Executor); the data
is prepared here, before any worker starts, and read by the workers from the token cache, whose
token arrays are memory-mapped (one copy in the page cache for all of them).

- Threads: N processes share the cores. Under `train.threads: auto` (the default) each worker's
  count follows the load (tiedlm.threads), so that two workers on two cores take one thread each
  and the last run of a stage, alone, takes both; a step is the same to the bit on any count. A run
  whose train.threads is 0 (torch's default) gets max(1, cores // N); a count is kept.
  train.threads is an operational key (outside the config hash): the run's identity does not change.
- `--jobs auto`: on CUDA one process per visible GPU (each sees one, through CUDA_VISIBLE_DEVICES);
  on the CPU min(runs, cores) processes when every run's model is small (below SMALL_MODEL
  non-embedding parameters, where one process per core beats one process using every core), else 1.
- Output: one line per event on stderr (started, finished with the time it took, failed with the
  run's `tiedlm: error:` line), with the counts of runs done, running and queued and the whole
  comparison's count and time left (Tally, below). Each run's own output goes to a log file.
- Signals: SIGINT and SIGTERM are forwarded to every worker (started in sessions of their own, so
  that a terminal's Ctrl-C reaches them once, through here); a training one writes a checkpoint and
  stops, an idle one ends, and the command ends with Interrupted (130/143), so running it again
  continues. A second signal is forwarded too: the runs then stop at once (their previous
  checkpoints are intact)."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import re
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path

from ..config import Config, to_yaml
from .. import runs
from ..errors import ConfigError, Interrupted, RunError
from ..files import HOST
from ..process import PARENT_ENV, alive, log
from ..config import load_config
from ..model.counting import count_params_config
from ..device import keep_freed_memory, thread_env
from ..errors import TiedlmError
from ..files import os_error_line
from ..process import StopSignals, Terminated, die_with_parent

JOBS_LIMIT = 256  # --jobs: more processes than that is a typo, not a machine
SMALL_MODEL = 10_000_000  # non-embedding parameters below which --jobs auto runs one process per core
_POLL_S = 0.1


def parse_jobs(value: int | str | None, key: str = "--jobs") -> int | str:
    """--jobs: a whole number from 1 to JOBS_LIMIT, or 'auto'."""
    if value is None:
        return 1
    if isinstance(value, str):
        text = value.strip().lower()
        if text == "auto":
            return "auto"
        try:
            value = int(text)
        except ValueError:
            raise ConfigError(f"{key} must be a whole number or auto, got {value!r}") from None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"{key} must be at least 1 (1: one run after another) or auto, got {value!r}")
    if value > JOBS_LIMIT:
        raise ConfigError(f"{key} must be at most {JOBS_LIMIT}, got {value} (each job is a process "
                          "training a model) — lower it, or use --jobs auto")
    return value


def available_cores() -> int:
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def _wants_cuda(cfg: Config) -> bool:
    return cfg.train.device == "auto" or cfg.train.device.startswith("cuda")


# The device files a GPU driver makes (NVIDIA, CUDA under WSL 2, ROCm): where none exists torch
# finds no GPU, and the parent need not import it (3 s, before any worker could start) to know.
GPU_DEVICE_FILES = ("/dev/nvidiactl", "/dev/nvidia0", "/dev/dxg", "/dev/kfd")


def visible_gpus(cfgs: list[Config]) -> list[str]:
    """The GPUs the children may be spread over (CUDA_VISIBLE_DEVICES values), none when the runs
    do not train on CUDA or none is visible. A run that names cuda:K with K > 0 is left alone."""
    if not cfgs or not all(_wants_cuda(c) for c in cfgs):
        return []
    if not any(os.path.exists(f) for f in GPU_DEVICE_FILES):
        return []
    import torch

    if not torch.cuda.is_available():
        return []
    n = torch.cuda.device_count()
    env = os.environ.get("CUDA_VISIBLE_DEVICES")
    ids = [x.strip() for x in env.split(",") if x.strip()] if env else [str(i) for i in range(n)]
    return ids[:n]


def resolve_workers(spec: int | str, cfgs: list[Config]) -> int:
    """How many processes for these runs: spec (a number) capped at the runs, or auto's choice."""
    if not cfgs:
        return 1
    if spec != "auto":
        return max(1, min(int(spec), len(cfgs)))
    gpus = visible_gpus(cfgs)
    if gpus:
        return min(len(cfgs), len(gpus))

    if all(count_params_config(c.model, 0)["non_embedding"] < SMALL_MODEL for c in cfgs):
        return min(len(cfgs), available_cores())
    return 1


def _last_error(log_path: Path, code: int) -> str:
    try:
        lines = [ln.strip() for ln in log_path.read_text(errors="replace").splitlines() if ln.strip()]
    except OSError:
        lines = []
    errors = [ln for ln in lines if ln.startswith("tiedlm: error:")]
    if errors:
        return errors[-1].removeprefix("tiedlm: error:").strip()
    return f"{lines[-1]} (exit code {code})" if lines else f"exit code {code}"


def sharded_processes(cfg: Config) -> int:
    """How many processes a sharded run that tiedlm launches itself gets: train.processes, else
    one per visible GPU where the run uses them, else 2 (CPU, gloo)."""
    if cfg.train.processes is not None:
        return cfg.train.processes
    gpus = visible_gpus([cfg])
    return len(gpus) if gpus else 2


def train_sharded(cfg: Config, out: Path, name: str, progress: bool = True, overwrite: bool = False) -> Path:
    """A train.parallel: fsdp run of compare --config or a sweep (train_run's signature): one
    torchrun job of sharded_processes(cfg) processes on this machine, this process waiting for it.
    Its config goes to the job as a resolved YAML file; its one-line error comes back as this
    process's RunError (ConfigMismatchError is met here first, as train_run meets it)."""
    run_dir = runs.run_dir_for(Path(out), name)
    if not overwrite:
        runs.existing_state(run_dir, cfg)  # another config in the folder: the caller decides
    n = sharded_processes(cfg)
    with tempfile.TemporaryDirectory(prefix=_TMP_PREFIX + f"{HOST}-{os.getpid()}-") as tmp:
        config = Path(tmp) / "config.yaml"
        config.write_text(to_yaml(cfg), encoding="utf-8")
        log_path = Path(tmp) / "torchrun.log"
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={n}", "-m", "tiedlm",
               "train", "-c", str(config), "--out", str(out), "--name", name, "-q",
               *(["--overwrite"] if overwrite else [])]
        if progress:
            log(f"{name}: train.parallel fsdp, launching torchrun with {n} processes")
        env = _child_env(None)
        env.pop(PARENT_ENV, None)  # torchrun's ranks are its children, not this process's
        with open(log_path, "w", encoding="utf-8") as sink:
            code = subprocess.run(cmd, stdout=sink, stderr=subprocess.STDOUT, env=env).returncode
        if code in (130, 143, -signal.SIGINT, -signal.SIGTERM):
            raise Interrupted(f"{name}: interrupted — run the same command again to resume it", exit_code=130)
        if code != 0:
            raise RunError(f"{_last_error(log_path, code)} (a torchrun job of {n} processes)")
    return run_dir


class _Signals:
    """SIGINT/SIGTERM noted (and forwarded to the children) instead of raising, while installed."""

    def __init__(self):
        self.received: int | None = None
        self.children: list = []  # what has a .proc: the pool's workers
        self._old: dict = {}

    def _handler(self, signum, frame):
        first = self.received is None
        self.received = self.received or signum
        for c in self.children:
            _send(c.proc, signum)
        if first:
            log(f"\n{signal.Signals(signum).name} received: every running job stops at a checkpoint "
                "(send it again to stop them at once)")

    def __enter__(self) -> "_Signals":
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                self._old[sig] = signal.signal(sig, self._handler)
        return self

    def __exit__(self, *exc) -> None:
        for sig, old in self._old.items():
            signal.signal(sig, old)


def _send(proc: subprocess.Popen, signum: int) -> None:
    if proc.poll() is None:
        try:
            proc.send_signal(signum)
        except OSError:  # gone in between
            pass


def _child_env(gpu: str | None) -> dict:
    """The one place a worker's environment is made: this process's, with device.thread_env's
    variables where it has none of its own (a worker computes as the CLI does, even when this
    process loaded torch before tiedlm could set them), plus what ties it to this process."""

    env = dict(os.environ)
    env.update(thread_env(env))
    env[PARENT_ENV] = str(os.getpid())  # the child ends when this process does (process.die_with_parent)
    package_root = str(Path(__file__).resolve().parent.parent)  # the children run this very tiedlm
    env["PYTHONPATH"] = os.pathsep.join([package_root] + [p for p in [env.get("PYTHONPATH")] if p])
    if gpu is not None:
        env["CUDA_VISIBLE_DEVICES"] = gpu
    return env


_TMP_PREFIX = "tiedlm-jobs-"  # then host-pid-: whose folder it is, for _clean_stale_folders
_TMP_NAME = re.compile(re.escape(_TMP_PREFIX) + r"(?P<host>[A-Za-z0-9._]+)-(?P<pid>\d+)-")


def _clean_stale_folders() -> None:
    """Remove the temporary folders (the children's configs and logs) that a --jobs process killed
    without cleaning up (kill -9) left: only those of this host whose process is gone; a folder of
    a live process, another host's, or one named otherwise is left alone."""
    root = Path(tempfile.gettempdir())
    try:
        entries = list(root.iterdir())
    except OSError:
        return
    for entry in entries:
        m = _TMP_NAME.match(entry.name)
        if m is None or m["host"] != HOST or int(m["pid"]) == os.getpid() or alive(int(m["pid"])):
            continue
        try:
            if entry.is_dir() and not entry.is_symlink() and entry.stat().st_uid == os.getuid():
                shutil.rmtree(entry, ignore_errors=True)
        except OSError:
            pass


def _prepare_once(cfgs: list[Config], progress: bool) -> None:
    """Fill the token cache for every distinct data of these runs, here, before any child starts,
    so that the children read it instead of tokenizing the same data at once. A preparation that
    fails is left to the children: each then says it for its own run, as it would have."""

    from ..data import prepare_data

    seen = set()
    try:
        with StopSignals():  # SIGTERM unwinds as Ctrl-C does: the cache's half-made entries are removed
            for cfg in cfgs:
                key = json.dumps([dataclasses.asdict(cfg.data), dataclasses.asdict(cfg.tokenizer)], sort_keys=True,
                                 default=str)
                if key in seen:
                    continue
                seen.add(key)
                try:
                    prepare_data(cfg, progress=progress)
                except Exception:  # noqa: BLE001  (the children meet it again and say it, one line per run)
                    pass
    except KeyboardInterrupt as exc:
        sig = "SIGTERM" if isinstance(exc, Terminated) else "SIGINT"
        raise Interrupted(f"{sig} while preparing the data, before any run started — run the same command again",
                          exit_code=143 if isinstance(exc, Terminated) else 130) from None


# ------------------------------------------------------------------------- the workers

# What a worker runs: `-c` rather than `-m tiedlm.parallel`, so that this module is imported once,
# under its own name, in the worker as everywhere else.
_WORKER = "import sys; from tiedlm.experiment.parallel import serve; sys.exit(serve())"
_WAIT_S = 10  # how long a closing pool waits for an idle worker to read its end of input


@dataclass
class _Job:
    index: int  # in its stage, for the display
    name: str
    log: Path
    started: float
    gpu: str | None


@dataclass
class _Worker:
    """One long-lived worker process; `job` is what it trains now (None: idle)."""

    proc: subprocess.Popen
    gpu: str | None
    job: _Job | None = None
    pending: bytes = b""  # a reply read in part


class WorkerPool:
    """Worker processes that each train runs one after another, as they are sent: started when a
    stage first needs them and kept for the next stages, so that a comparison pays a process's
    imports once per worker instead of once per run. Each worker trains in a fresh call of
    train_run, as the one-after-another path does in its one process, so a run's numbers do not
    depend on which worker trained it or what it trained before. `close()` (or the end of a `with`)
    ends them; every one also ends with this process (process.die_with_parent)."""

    def __init__(self) -> None:
        self.workers: list[_Worker] = []  # mutated in place: _Signals holds this very list
        self.starts = 0  # processes started, for the tests and the display
        self._tmp: tempfile.TemporaryDirectory | None = None
        self._files = 0  # config and log files written, numbered across stages

    def __enter__(self) -> "WorkerPool":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def folder(self) -> Path:
        """The pool's temporary folder (the runs' configs and logs, the workers' own logs)."""
        if self._tmp is None:
            _clean_stale_folders()
            self._tmp = tempfile.TemporaryDirectory(prefix=f"{_TMP_PREFIX}{HOST}-{os.getpid()}-")
        return Path(self._tmp.name)

    def _start(self, gpu: str | None) -> _Worker:
        with open(self.folder() / f"worker-{self.starts + 1}.log", "wb") as fh:
            proc = subprocess.Popen([sys.executable, "-c", _WORKER], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                    stderr=fh, env=_child_env(gpu), start_new_session=True)
        self.starts += 1
        worker = _Worker(proc, gpu)
        self.workers.append(worker)
        return worker

    def send(self, index: int, name: str, cfg: Config, overwrite: bool, out: Path, gpu: str | None) -> _Job:
        """Hand a run to an idle worker on `gpu` (None: no GPU of its own), started if none is idle."""
        self._files += 1
        path = self.folder() / f"{self._files}.yaml"
        path.write_text(to_yaml(cfg))
        job = _Job(index, name, self.folder() / f"{self._files}.log", time.monotonic(), gpu)
        line = json.dumps({"config": str(path), "name": name, "out": str(out), "overwrite": overwrite,
                           "log": str(job.log)}) + "\n"
        for worker in [w for w in self.workers if w.job is None and w.gpu == gpu] + [None]:
            worker = worker or self._start(gpu)
            try:
                worker.proc.stdin.write(line.encode())
                worker.proc.stdin.flush()
            except OSError:  # it died while idle (killed from outside): the next one, or a new one
                self._drop(worker)
                continue
            worker.job = job
            return job
        raise AssertionError("unreachable: a new worker takes the run or raises")

    def _drop(self, worker: _Worker) -> None:
        with contextlib.suppress(OSError):
            worker.proc.stdin.close()
        if worker.proc.poll() is None:
            _send(worker.proc, signal.SIGTERM)
        worker.proc.wait()
        worker.proc.stdout.close()
        self.workers.remove(worker)

    def busy(self) -> list[_Worker]:
        return [w for w in self.workers if w.job is not None]

    def ended(self, timeout: float) -> list[tuple[_Job, int, str | None]]:
        """The runs that ended within `timeout` seconds: (job, exit code, its error line or None
        to read from its log). A worker that died in a run is dropped, its exit code the run's."""
        busy = self.busy()
        if not busy:
            return []
        ready, _, _ = select.select([w.proc.stdout for w in busy], [], [], timeout)
        done = []
        for worker in busy:
            if worker.proc.stdout not in ready:
                continue
            chunk = os.read(worker.proc.stdout.fileno(), 65536)
            worker.pending += chunk
            if b"\n" in worker.pending:
                line, _, worker.pending = worker.pending.partition(b"\n")
                reply = json.loads(line)
                done.append((worker.job, reply["code"], reply["error"]))
                worker.job = None
            elif not chunk:  # end of its output: the worker is gone
                job, code = worker.job, worker.proc.wait()
                self._drop(worker)
                done.append((job, code, None))
        return done

    def stop_busy(self) -> None:
        """End the workers still in a run (SIGTERM: a checkpoint, then exit) and wait for them."""
        for worker in self.busy():
            _send(worker.proc, signal.SIGTERM)
        for worker in self.busy():
            self._drop(worker)

    def close(self) -> None:
        """End every worker (an idle one at the end of its input) and remove the temporary folder."""
        for worker in self.workers:
            with contextlib.suppress(OSError):
                worker.proc.stdin.close()
        for worker in list(self.workers):
            try:
                worker.proc.wait(_WAIT_S)
            except subprocess.TimeoutExpired:
                pass
            self._drop(worker)
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None


def _train_in_worker(job: dict) -> tuple[int, str | None]:
    """One run of a worker, its output into the run's log: (exit code, error line), what
    `tiedlm train -q` would exit with and print (run_command's mapping)."""
    from ..train import train_run

    try:
        cfg = load_config(job["config"])
        train_run(cfg, out=Path(job["out"]), name=job["name"], overwrite=job["overwrite"], progress=False)
        return 0, None
    except TiedlmError as exc:
        text = str(exc)
        return exc.exit_code, text.splitlines()[0] if text else type(exc).__name__
    except KeyboardInterrupt:
        return 130, "interrupted"
    except OSError as exc:
        return 1, os_error_line(exc)
    except Exception as exc:  # noqa: BLE001  (a bug in one run: said, in full in its log; the worker goes on)
        traceback.print_exc()
        return 1, f"{type(exc).__name__}: {exc}"


def serve() -> int:
    """A worker's life: read runs (one JSON line each) from stdin, train each, answer one JSON line
    on stdout, until the end of stdin. A run that stops on a signal ends the worker with its exit
    code, as it ends the whole command; one that fails does not: the next run is trained."""

    die_with_parent()
    keep_freed_memory()  # as in the command's own process: a worker never imports tiedlm.cli
    replies = os.fdopen(os.dup(1), "w")
    own_err = os.dup(2)
    # Idle, there is nothing to save: SIGTERM ends the worker at once (SIGINT raises, as always).
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(143))
    try:
        for line in sys.stdin:
            job = json.loads(line)
            sys.stdout.flush()
            sys.stderr.flush()
            fd = os.open(job["log"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            os.dup2(fd, 1)
            os.dup2(fd, 2)
            os.close(fd)
            code, error = _train_in_worker(job)
            if error is not None:
                print(f"tiedlm: error: {error}", file=sys.stderr)
            sys.stdout.flush()
            sys.stderr.flush()
            os.dup2(own_err, 1)
            os.dup2(own_err, 2)
            replies.write(json.dumps({"code": code, "error": error}) + "\n")
            replies.flush()
            if code in (130, 143):
                return code
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # the parent is gone: so is the reason to go on
        return 143
    return 0


# ------------------------------------------------------------------------- a stage over the workers


def _gpu_for(cfg: Config, free: list[str]) -> str | None:
    return free.pop(0) if free and cfg.train.device in ("auto", "cuda", "cuda:0") else None


def _about(seconds: float) -> str:
    s = max(1, round(seconds))
    if s < 60:
        return f"about {s} s"
    m = max(1, round(s / 60))
    return f"about {m} min" if m < 60 else f"about {m // 60} h {m % 60:02d} min"


@dataclass
class Tally:
    """The runs of one comparison or sweep so far, over all its stages: how many have ended, of
    how many known, and the time the rest takes at the mean wall time of the runs trained here
    (a skipped or failed run says nothing of the speed). `may_grow`: later stages may add runs
    (a tuning grid extended past its edge, the seeds after the tuning, --seeds auto), so the
    count is of the runs known so far and the line says so."""

    may_grow: bool = False
    known: dict[str, None] = field(default_factory=dict)  # run names, each once, in order
    ended: set[str] = field(default_factory=set)
    seconds: list[float] = field(default_factory=list)
    finished: set[str] = field(default_factory=set)  # known runs found finished already: they take no time

    def expect(self, names: list[str], finished: set[str] | frozenset[str] = frozenset()) -> None:
        self.known.update(dict.fromkeys(names))
        self.finished |= set(finished) & set(names)

    def end(self, name: str, seconds: float | None = None) -> None:
        self.ended.add(name)
        if seconds is not None:
            self.seconds.append(seconds)

    def tag(self, name: str) -> str:
        """ "[7/10] name": the run's place among the runs known so far, the count `line` gives too
        (one count for the whole comparison, over its stages)."""
        return f"[{list(self.known).index(name) + 1}/{len(self.known)}] {name}"

    def line(self, workers: int = 1) -> str:
        """ "run 3 of 10, about 4 min left", with `workers` runs trained at a time."""
        done, known = len(self.ended & self.known.keys()), len(self.known)
        text = f"run {done} of {known}" + (" known so far (more may follow)" if self.may_grow else "")
        left = known - done
        to_train = len(self.known.keys() - self.ended - self.finished)  # the finished ones will be skipped
        if left and to_train and self.seconds:
            rounds = -(-to_train // max(1, workers))
            text += f", {_about(sum(self.seconds) / len(self.seconds) * rounds)} left" + \
                (" for those" if self.may_grow else "")
        return text


def train_parallel(jobs: list[tuple[str, Config, bool]], out: Path, workers: int, progress: bool = True,
                   pool: WorkerPool | None = None, tally: Tally | None = None) -> dict[str, str | None]:
    """Train (name, config, overwrite) jobs into `out`, at most `workers` at a time, on the
    workers of `pool` (one made and closed here when None). Returns {name: None (finished) or the
    failure's message}. A signal stops them all at a checkpoint and raises Interrupted.
    `tally` (a Tally): the whole comparison's count, the one each line gives (these jobs
    alone when None), and the time left."""
    if pool is None:
        with WorkerPool() as own:
            return train_parallel(jobs, out, workers, progress, own, tally)
    if tally is None:
        tally = Tally()
        tally.expect([name for name, _, _ in jobs])
    gpus = visible_gpus([cfg for _, cfg, _ in jobs])
    threads = max(1, available_cores() // workers)
    outcome: dict[str, str | None] = {}
    queue = list(enumerate(jobs, 1))
    free_gpus = list(gpus)
    if progress:
        log(f"training {len(jobs)} runs, {workers} at a time (CPU threads following the load where train.threads "
            f"is auto, {threads} each where it is 0{', one GPU each' if gpus else ''}; {len(pool.workers)} worker process"
            f"{'es' * (len(pool.workers) != 1)} started already)")

    def counts() -> str:
        return f"{len(pool.busy())} running, {len(queue)} queued"

    def finished(job: _Job, code: int, error: str | None) -> None:
        if job.gpu is not None:
            free_gpus.append(job.gpu)
        seconds = time.monotonic() - job.started
        if code == 0:
            outcome[job.name] = None
            tally.end(job.name, seconds)
            if progress:
                log(f"{tally.tag(job.name)} finished in {seconds:.1f}s ({counts()}; {tally.line(workers)})")
        elif code not in (130, 143, -signal.SIGINT, -signal.SIGTERM, -signal.SIGKILL):
            outcome[job.name] = error or _last_error(job.log, code)
            tally.end(job.name)
            log(f"{tally.tag(job.name)} failed: {outcome[job.name]}")

    _prepare_once([cfg for _, cfg, _ in jobs], progress)
    with _Signals() as sig:
        sig.children = pool.workers
        try:
            while queue or pool.busy():
                while sig.received is None and queue and len(pool.busy()) < workers:
                    i, (name, cfg, overwrite) = queue.pop(0)
                    if cfg.train.threads == 0:
                        cfg = dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, threads=threads))
                    job = pool.send(i, name, cfg, overwrite, out, _gpu_for(cfg, free_gpus))
                    if progress:
                        log(f"{tally.tag(name)} started{f' on GPU {job.gpu}' if job.gpu is not None else ''} "
                            f"({counts()})")
                for job, code, error in pool.ended(_POLL_S):
                    if code in (130, 143) and sig.received is None:  # a run interrupted on its own:
                        sig._handler(signal.SIGTERM if code == 143 else signal.SIGINT, None)  # stop them all
                    finished(job, code, error)
                if sig.received is not None:
                    queue.clear()
        finally:
            pool.stop_busy()  # an exception here (not a signal): no run goes on training unwatched
    if sig.received is not None:
        left = [name for name, _, _ in jobs if name not in outcome]
        raise Interrupted(f"{signal.Signals(sig.received).name}: {len(left)} run(s) stopped at a checkpoint or not "
                          "started — run the same command again to continue",
                          exit_code=143 if sig.received == signal.SIGTERM else 130)
    return outcome
