"""Several runs at once, each in its own process: what `--jobs N` of `tiedlm compare --config` and
`tiedlm sweep` does (jobs.train_jobs hands its unfinished runs here when N > 1).

Each run is trained by a child `python -m tiedlm train -q` on the run's exact resolved config (written
with config.to_yaml to a temporary file), into the same folder under the same name as the sequential
path, so its results do not depend on --jobs: with the same train.threads, a run trained here ends
with the same weights and metrics, bit for bit, as the same run trained in-process.

- Threads: N processes share the cores; a run whose train.threads is 0 (torch's default) gets
  max(1, cores // N). train.threads is an operational key (outside the config hash): the run's
  identity does not change. A run whose config sets train.threads keeps it.
- `--jobs auto`: on CUDA one process per visible GPU (each sees one, through CUDA_VISIBLE_DEVICES);
  on the CPU min(runs, cores) processes when every run's model is small (below SMALL_MODEL
  non-embedding parameters, where one process per core beats one process using every core), else 1.
- Output: one line per event on stderr (started, finished with the time it took, failed with the
  child's last `tiedlm: error:` line), with the counts of runs done, running and queued and an ETA
  from the finished runs' durations. The children's own output goes to a log file per run.
- Signals: SIGINT and SIGTERM are forwarded to every child (started in sessions of their own, so that
  a terminal's Ctrl-C reaches them once, through here); each writes a checkpoint and exits 130/143,
  and the command ends with Interrupted (130/143), so running it again continues. A second signal is
  forwarded too: the children then stop at once (their previous checkpoints are intact)."""

from __future__ import annotations

import dataclasses
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from .config import Config, to_yaml
from .errors import ConfigError, Interrupted
from .files import HOST
from .process import PARENT_ENV, alive, log

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


def visible_gpus(cfgs: list[Config]) -> list[str]:
    """The GPUs the children may be spread over (CUDA_VISIBLE_DEVICES values), none when the runs
    do not train on CUDA or none is visible. A run that names cuda:K with K > 0 is left alone."""
    if not cfgs or not all(_wants_cuda(c) for c in cfgs):
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
    from .counting import count_params_config

    if all(count_params_config(c.model, 0)["non_embedding"] < SMALL_MODEL for c in cfgs):
        return min(len(cfgs), available_cores())
    return 1


@dataclass
class _Child:
    name: str
    index: int
    proc: subprocess.Popen
    log: Path
    started: float
    gpu: str | None


def _last_error(log_path: Path, code: int) -> str:
    try:
        lines = [ln.strip() for ln in log_path.read_text(errors="replace").splitlines() if ln.strip()]
    except OSError:
        lines = []
    errors = [ln for ln in lines if ln.startswith("tiedlm: error:")]
    if errors:
        return errors[-1].removeprefix("tiedlm: error:").strip()
    return f"{lines[-1]} (exit code {code})" if lines else f"exit code {code}"


def _eta(durations: list[float], left: int, workers: int) -> str:
    if not durations or not left:
        return ""
    s = int(round(sum(durations) / len(durations) * -(-left // workers)))
    return f", ETA ~{s // 3600}h{s % 3600 // 60:02d}m" if s >= 3600 else f", ETA ~{s // 60}m{s % 60:02d}s"


class _Signals:
    """SIGINT/SIGTERM noted (and forwarded to the children) instead of raising, while installed."""

    def __init__(self):
        self.received: int | None = None
        self.children: list[_Child] = []
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
    env = dict(os.environ)
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
    import shutil

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
    import json

    from .data import prepare_data
    from .process import StopSignals, Terminated

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


def train_parallel(jobs: list[tuple[str, Config, bool]], out: Path, workers: int, progress: bool = True,
                   total: int | None = None, done_before: int = 0) -> dict[str, str | None]:
    """Train (name, config, overwrite) jobs into `out`, at most `workers` at a time, each in its own
    process. Returns {name: None (finished) or the failure's message}. A signal stops them all at a
    checkpoint and raises Interrupted. `total`/`done_before`: the whole set's count and the runs
    already finished (skipped), for the display."""
    total = total or len(jobs)
    cores = available_cores()
    gpus = visible_gpus([cfg for _, cfg, _ in jobs])
    threads = max(1, cores // workers)
    outcome: dict[str, str | None] = {}
    durations: list[float] = []
    queue = list(enumerate(jobs, 1))
    running: list[_Child] = []
    free_gpus = list(gpus)
    if progress:
        log(f"training {len(jobs)} runs, {workers} at a time ({threads} CPU thread{'s' * (threads != 1)} each "
            f"where train.threads is 0{', one GPU each' if gpus else ''})")

    def counts() -> str:
        return f"{done_before + len(outcome)}/{total} done, {len(running)} running, {len(queue)} queued"

    def launch(i: int, name: str, cfg: Config, overwrite: bool, tmp: Path) -> None:
        if cfg.train.threads == 0:
            cfg = dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, threads=threads))
        path = tmp / f"{i}.yaml"
        path.write_text(to_yaml(cfg))
        log_path = tmp / f"{i}.log"
        gpu = free_gpus.pop(0) if free_gpus and cfg.train.device in ("auto", "cuda", "cuda:0") else None
        cmd = [sys.executable, "-m", "tiedlm", "train", "--config", str(path), "--name", name, "--out", str(out), "-q"]
        with open(log_path, "wb") as fh:
            proc = subprocess.Popen(cmd + (["--overwrite"] if overwrite else []), stdout=fh, stderr=fh,
                                    stdin=subprocess.DEVNULL, env=_child_env(gpu), start_new_session=True)
        running.append(_Child(name, i, proc, log_path, time.monotonic(), gpu))
        if progress:
            log(f"[{i}/{len(jobs)}] started {name}{f' on GPU {gpu}' if gpu is not None else ''} ({counts()})")

    def finished(c: _Child, code: int) -> None:
        running.remove(c)
        if c.gpu is not None:
            free_gpus.append(c.gpu)
        if code == 0:
            outcome[c.name] = None
            durations.append(time.monotonic() - c.started)
            if progress:
                log(f"[{c.index}/{len(jobs)}] {c.name} finished in {durations[-1]:.1f}s "
                    f"({counts()}{_eta(durations, len(running) + len(queue), workers)})")
        elif code not in (130, 143, -signal.SIGINT, -signal.SIGTERM, -signal.SIGKILL):
            outcome[c.name] = _last_error(c.log, code)
            log(f"[{c.index}/{len(jobs)}] {c.name} failed: {outcome[c.name]}")

    _clean_stale_folders()
    _prepare_once([cfg for _, cfg, _ in jobs], progress)
    with tempfile.TemporaryDirectory(prefix=f"{_TMP_PREFIX}{HOST}-{os.getpid()}-") as tmp, _Signals() as sig:
        sig.children = running
        try:
            while queue or running:
                while sig.received is None and queue and len(running) < workers:
                    i, (name, cfg, overwrite) = queue.pop(0)
                    launch(i, name, cfg, overwrite, Path(tmp))
                for c in list(running):
                    code = c.proc.poll()
                    if code is None:
                        continue
                    if code in (130, 143) and sig.received is None:  # a child interrupted on its own:
                        sig._handler(signal.SIGTERM if code == 143 else signal.SIGINT, None)  # stop them all
                    finished(c, code)
                if sig.received is not None:
                    queue.clear()
                if running:
                    time.sleep(_POLL_S)
        finally:
            for c in running:  # an exception here (not a signal): no child outlives the command
                _send(c.proc, signal.SIGTERM)
            for c in running:
                c.proc.wait()
    if sig.received is not None:
        left = [name for name, _, _ in jobs if name not in outcome]
        raise Interrupted(f"{signal.Signals(sig.received).name}: {len(left)} run(s) stopped at a checkpoint or not "
                          "started — run the same command again to continue",
                          exit_code=143 if sig.received == signal.SIGTERM else 130)
    return outcome
