"""--jobs workers that start once: fewer workers than runs, each started once and kept across the
stages of one executor, a failing run that leaves its worker training the next, a signal that
reaches the workers mid-queue, and the count and time left printed as each run ends (parallel.Tally)."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from tiedlm.experiment import parallel
from tiedlm.config import apply_overrides
from tiedlm.experiment.jobs import Executor, train_jobs
from tiedlm.experiment.parallel import Tally
from tiedlm.experiment.plan import PlannedRun, Stage

from .conftest import ROOT, TINY
from .test_parallel import _metrics, _tensors

ENV = {**os.environ, "PYTHONPATH": str(ROOT)}


def _starts(monkeypatch) -> list:
    """Every process start (of the parent's subprocess.Popen), by its command."""
    seen = []
    popen = parallel.subprocess.Popen

    def launch(cmd, *args, **kwargs):
        seen.append(cmd)
        return popen(cmd, *args, **kwargs)

    monkeypatch.setattr(parallel.subprocess, "Popen", launch)
    return seen


def test_two_workers_train_five_runs_over_two_stages_started_once_and_bitwise_as_in_turn(tiny, tmp_path,
                                                                                        monkeypatch):
    runs = [PlannedRun(f"r{s}", tiny(seed=s)) for s in range(5)]
    for r in runs:  # one after another in this process: the reference
        train_jobs([(r.name, r.cfg)], tmp_path / "one", progress=False)
    starts = _starts(monkeypatch)
    with Executor(tmp_path / "two", progress=False, parallel=2) as executor:
        assert executor.run(Stage("first", runs[:3])) and executor.run(Stage("second", runs[3:]))
        pool = executor.pool
        assert pool.starts == 2 and len(starts) == 2  # two processes for five runs, kept between stages
        procs = [w.proc for w in pool.workers]
    assert all(p.returncode is not None for p in procs)  # closed with the executor
    assert executor.pool is None and all(r.status == "finished" for r in executor.results.values())
    for r in runs:
        a, b = tmp_path / "one" / r.name, tmp_path / "two" / r.name
        assert _metrics(a) == _metrics(b)
        ta, tb = _tensors(a), _tensors(b)
        assert ta.keys() == tb.keys() and all(ta[k].numpy().tobytes() == tb[k].numpy().tobytes() for k in ta)


def test_a_run_failing_in_a_worker_leaves_it_training_the_next(tiny, tmp_path, monkeypatch):
    starts = _starts(monkeypatch)
    bad = tiny("train.lr=1e6", "train.weight_decay=0", "train.max_skipped=0")
    with parallel.WorkerPool() as pool:
        outcome = parallel.train_parallel([("bad", bad, False), ("good", tiny(), False)], tmp_path, 1,
                                          progress=False, pool=pool)
        assert pool.starts == 1 and len(starts) == 1 and len(pool.workers) == 1
        assert pool.workers[0].proc.poll() is None  # still serving
    assert outcome["good"] is None and outcome["bad"] and "tiedlm: error" not in outcome["bad"]
    assert json.loads((tmp_path / "good" / "report.json").read_text())["status"] == "finished"


def test_without_a_with_each_stage_starts_and_ends_its_own_workers(tiny, tmp_path, monkeypatch):
    starts = _starts(monkeypatch)
    executor = Executor(tmp_path, progress=False, parallel=2)
    assert executor.run(Stage("s", [PlannedRun(f"r{s}", tiny(seed=s)) for s in range(2)]))
    assert len(starts) == 2 and executor.pool is None
    assert not [p for p in Path(parallel.tempfile.gettempdir()).iterdir()
                if p.name.startswith(f"tiedlm-jobs-{parallel.HOST}-{os.getpid()}-")]  # its folder removed


@pytest.mark.parametrize("signum", [signal.SIGTERM])  # SIGINT takes the same path: tests/test_parallel.py sends it
def test_a_signal_mid_queue_stops_the_running_runs_starts_no_other_and_the_rerun_completes(tmp_path, signum):
    cfg = tmp_path / "long.yaml"
    cfg.write_text(yaml.safe_dump(apply_overrides({}, TINY + [
        "train.max_steps=300", "train.checkpoint_every=50", "train.eval_every=150", "train.log_every=10"])))
    cmd = [sys.executable, "-m", "tiedlm", "compare", "--config", str(cfg), "--seeds", "2", "--jobs", "2",
           "--out", str(tmp_path / "runs"), "-q"]
    parent = subprocess.Popen(cmd, cwd=tmp_path, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    runs = tmp_path / "runs"
    names = {"tiny-tied-s0", "tiny-untied-s0", "tiny-tied-s1", "tiny-untied-s1"}
    deadline = time.monotonic() + 120
    first = []  # the two runs training; the other two are queued
    while len(first) < 2:
        assert parent.poll() is None and time.monotonic() < deadline, parent.communicate()
        time.sleep(0.1)
        first = [runs / n for n in sorted(names) if (runs / n / "metrics.jsonl").exists() and (runs / n / ".lock").exists()]
    workers = [json.loads((r / ".lock").read_text())["pid"] for r in first]
    parent.send_signal(signum)
    try:
        _, err = parent.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        parent.kill()
        raise
    assert parent.returncode == (130 if signum == signal.SIGINT else 143), err
    assert "tiedlm: error:" in err.strip().splitlines()[-1]
    for r in first:
        assert (r / "checkpoints" / "LATEST").exists() and not (r / ".lock").exists()
        assert not (r / "report.json").exists() or json.loads((r / "report.json").read_text())["status"] != "finished"
    assert not [n for n in names - {r.name for r in first} if (runs / n).exists()]  # queued: not started
    for pid in workers:  # the workers ended with the command
        assert not Path(f"/proc/{pid}").exists() or Path(f"/proc/{pid}/stat").read_text().split()[2] == "Z"
    rerun = subprocess.run(cmd, cwd=tmp_path, env=ENV, capture_output=True, text=True, timeout=300)
    assert rerun.returncode == 0, rerun.stderr
    for name in names:
        assert json.loads((runs / name / "report.json").read_text())["status"] == "finished"


def test_the_tally_counts_the_runs_known_and_the_time_left():
    t = Tally()
    t.expect(["a", "b", "c", "d"])
    assert t.line() == "run 0 of 4"
    t.end("a")  # skipped: counted, says nothing of the speed
    assert t.line() == "run 1 of 4"
    t.end("b", 120.0)
    assert t.line() == "run 2 of 4, about 4 min left" and t.line(workers=2) == "run 2 of 4, about 2 min left"
    t.expect(["c", "d", "e"])  # a later stage: the runs known already are counted once
    t.may_grow = True
    assert t.line() == "run 2 of 5 known so far (more may follow), about 6 min left for those"
    t.end("c", 10.0)
    assert t.line() == "run 3 of 5 known so far (more may follow), about 2 min left for those"
    assert Tally(known=dict.fromkeys("ab"), seconds=[4000.0]).line() == "run 0 of 2, about 2 h 13 min left"
    assert Tally(known=dict.fromkeys("ab"), seconds=[0.2]).line() == "run 0 of 2, about 1 s left"


def test_runs_found_finished_already_take_no_time_in_the_estimate():
    """A rerun that reuses most of its runs: only the runs still to train are timed."""
    t = Tally()
    t.expect(["a", "b", "c", "d", "e"], finished={"c", "d", "x"})  # x: not one of this stage's runs
    t.end("a", 60.0)
    assert t.line() == "run 1 of 5, about 2 min left"  # b and e, not c and d
    t.end("b", 60.0)
    t.end("c")
    t.end("d")
    assert t.line() == "run 4 of 5, about 1 min left"
    t.end("e", 60.0)
    assert t.line() == "run 5 of 5"
    only_skips = Tally(seconds=[60.0])
    only_skips.expect(["f", "g"], finished={"f", "g"})
    assert only_skips.line() == "run 0 of 2"  # nothing left to train: no time


def test_the_line_is_printed_as_each_run_ends_one_after_another(tiny, tmp_path, capsys):
    def fake(cfg, out, name, progress, overwrite=False):
        run = Path(out) / name
        run.mkdir(parents=True, exist_ok=True)
        return run

    with Executor(tmp_path, progress=True, train=fake, may_grow=True) as executor:
        executor.run(Stage("grid", [PlannedRun(f"g{s}", tiny(seed=s)) for s in range(2)]))
        executor.may_grow = False
        executor.run(Stage("seeds", [PlannedRun("g1", tiny(seed=1)), PlannedRun("s9", tiny(seed=9))]))
    err = capsys.readouterr().err
    assert "[1/2] g0: run 1 of 2 known so far (more may follow), about" in err
    assert "[2/2] g1: run 2 of 2 known so far (more may follow)\n" in err
    assert "[3/3] s9: run 3 of 3\n" in err  # g1 again is one run, not two
    assert "[3/3] s9: training" in err and "[1/2] s9" not in err  # one count: the comparison's, not the stage's
