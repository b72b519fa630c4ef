"""The processes of `--jobs`: children end with their parent however it ends (kill -9 included),
the temporary folders a killed parent left are removed at the next start (only those of dead
processes), and the data is prepared once, before any child starts."""

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

from tiedlm.experiment import parallel
from tiedlm.config import apply_overrides
from tiedlm.files import HOST
from tiedlm.process import PARENT_ENV

from .conftest import ROOT, TINY

ENV = {**os.environ, "PYTHONPATH": str(ROOT)}


def gone(pid: int) -> bool:
    """Dead: no such process, or a zombie nobody has reaped yet."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


def wait_gone(pids, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while not all(gone(p) for p in pids):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


def jobs_folders(tmp: Path) -> list[Path]:
    return sorted(p for p in tmp.iterdir() if p.name.startswith("tiedlm-jobs-"))


def dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_kill_9_of_the_parent_ends_its_children_and_the_rerun_works(tmp_path):
    cfg = tmp_path / "long.yaml"
    cfg.write_text(yaml.safe_dump(apply_overrides({}, TINY + [
        "train.max_steps=400", "train.checkpoint_every=50", "train.eval_every=200", "train.log_every=10"])))
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    env = {**ENV, "TMPDIR": str(tmp)}
    live = tmp / f"tiedlm-jobs-{HOST}-{os.getpid()}-keepme"  # a live process's folder (this test's)
    live.mkdir()
    cmd = [sys.executable, "-m", "tiedlm", "compare", "--config", str(cfg), "--jobs", "2",
           "--out", str(tmp_path / "runs"), "-q"]
    parent = subprocess.Popen(cmd, cwd=tmp_path, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    runs = [tmp_path / "runs" / n for n in ("tiny-tied-s0", "tiny-untied-s0")]
    children = []
    try:
        deadline = time.monotonic() + 120
        while not all((r / "metrics.jsonl").exists() and (r / ".lock").exists() for r in runs):  # both training
            assert parent.poll() is None and time.monotonic() < deadline
            time.sleep(0.05)
        children = [json.loads((r / ".lock").read_text())["pid"] for r in runs]
        assert [p.name for p in jobs_folders(tmp) if p != live][0].startswith(f"tiedlm-jobs-{HOST}-{parent.pid}-")
        os.kill(parent.pid, signal.SIGKILL)
        parent.wait()
        assert wait_gone(children, 3), "children outlived their parent"
        for r in runs:  # they were stopped, not finished: the wait above proved something
            assert not (r / "report.json").exists() or json.loads((r / "report.json").read_text())["status"] != "finished"
    finally:
        for pid in [parent.pid, *children]:
            if not gone(pid):
                os.kill(pid, signal.SIGKILL)
        parent.wait()
    rerun = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert rerun.returncode == 0, rerun.stderr
    assert "in use" not in rerun.stderr
    for r in runs:
        assert json.loads((r / "report.json").read_text())["status"] == "finished"
    assert jobs_folders(tmp) == [live]  # the killed parent's folder removed, the live one kept


def test_stale_folders_only_of_dead_processes_of_this_host_are_removed(tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        dead = tmp_path / f"tiedlm-jobs-{HOST}-{dead_pid()}-abc"
        kept = [tmp_path / f"tiedlm-jobs-{HOST}-{sleeper.pid}-abc",  # alive
                tmp_path / f"tiedlm-jobs-otherhost-{dead_pid()}-abc",  # a pid of another host means nothing here
                tmp_path / "tiedlm-jobs-k2j4h5g",  # an older name, with no owner to check
                tmp_path / "unrelated"]
        for d in [dead, *kept]:
            d.mkdir()
            (d / "1.log").write_text("x")
        parallel._clean_stale_folders()
        assert not dead.exists() and all(d.exists() for d in kept)
    finally:
        sleeper.kill()
        sleeper.wait()


def test_a_child_whose_parent_is_already_gone_does_not_start():
    """The parent died between starting the child and the child arming its parent-death signal."""
    r = subprocess.run([sys.executable, "-m", "tiedlm", "--version"], env={**ENV, PARENT_ENV: str(dead_pid())},
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 143 and not r.stdout, (r.returncode, r.stdout, r.stderr)


# The fallback where there is no parent-death signal: a thread watching the parent's pid.
MIDDLE = """import os, subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c", sys.argv[1]], env={**os.environ, "%s": str(os.getpid())},
                         start_new_session=True, stdout=subprocess.PIPE, text=True)
assert child.stdout.readline().strip() == "armed"
print(child.pid, flush=True)
time.sleep(60)
""" % PARENT_ENV
CHILD = """import signal, sys, time
from tiedlm.process import die_with_parent
die_with_parent(use_prctl=False)
signal.signal(signal.SIGTERM, lambda *a: sys.exit(143))
print("armed", flush=True)
time.sleep(60)
"""


def test_the_watchdog_ends_a_child_whose_parent_was_killed():
    middle = subprocess.Popen([sys.executable, "-c", MIDDLE, CHILD], env=ENV, stdout=subprocess.PIPE, text=True)
    child = int(middle.stdout.readline())
    assert not gone(child)
    middle.kill()
    middle.wait()
    try:
        assert wait_gone([child], 5)
    finally:
        if not gone(child):
            os.kill(child, signal.SIGKILL)


def test_the_data_is_prepared_once_before_any_child_starts(tiny, tmp_path, monkeypatch):
    from tiedlm.data import cache_entries
    from tiedlm.experiment.jobs import train_jobs

    seen = []
    popen = parallel.subprocess.Popen

    def launch(*args, **kwargs):
        seen.append(sorted((e["kind"], e["split"]) for e in cache_entries()))
        return popen(*args, **kwargs)

    monkeypatch.setattr(parallel.subprocess, "Popen", launch)
    jobs = [("a", tiny("model.tie_embeddings=true")), ("b", tiny("model.tie_embeddings=false"))]
    results = train_jobs(jobs, tmp_path, progress=False, parallel=2)
    assert [r.status for r in results] == ["finished", "finished"]
    full = sorted([("tokenizer", None)] + [("tokens", split) for split in ("test", "train", "validation")])
    assert seen == [full, full]  # the cache was full when each child started
    for name, _ in jobs:  # and each child read it: nothing loaded or tokenized there
        assert json.loads((tmp_path / name / "report.json").read_text())["data"]["cache"]["hit"] is True
