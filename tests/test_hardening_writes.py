"""Commands that write next to the user's files replace only what tiedlm wrote: analyze and compare
refuse a file of their outputs' names that tiedlm did not write (exit 2, one line naming the file
and the option that replaces it), replace it with that option, and rewrite their own output
silently (compare also knows a comparison that has no record by its headers); `tiedlm
tensorboard` removes only its own event files from tb/; and no command writes into a
run folder's managed parts (checkpoints/, tb/, ...), where a resume would delete what it wrote."""

import json
import shutil
import threading
import time

import pytest
from typer.testing import CliRunner

from tiedlm import runs
from tiedlm.analyze import ANALYSIS_JSON, ANALYSIS_MD
from tiedlm.analyze.render import PLOTS, TITLE
from tiedlm.cli import app
from tiedlm.config import load_config
from tiedlm.errors import Interrupted
from tiedlm.files import WRITTEN
from tiedlm.train import train_run

from .conftest import TINY
from .test_compare import make_pair, make_run

PNG = b"\x89PNG\r\n\x1a\n"
MINE = b"my own notes, not tiedlm's\n"


def invoke(*args):
    return CliRunner().invoke(app, [str(a) for a in args])


def refused(r, path, option: str) -> None:
    """Exit 2 with one line on stderr that names the file and the option."""
    assert r.exit_code == 2, r.output
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and str(path) in lines[0] and option in lines[0], r.stderr
    assert "Traceback" not in r.output


def listing(folder):
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in folder.rglob("*") if p.is_file()}


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A tiny run stopped after its first checkpoint (unfinished, so a resume has work to do)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TIEDLM_CACHE", str(tmp_path_factory.mktemp("cache")))
        root = tmp_path_factory.mktemp("runs")
        with pytest.raises(Interrupted):
            train_run(load_config(None, TINY), out=root, name="r", progress=False, stop_after_step=5)
        return root / "r"


# ------------------------------------------------------------------ 4. analyze


def test_analyze_refuses_the_users_own_files_and_replaces_them_with_overwrite(trained, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    for name in (ANALYSIS_MD, ANALYSIS_JSON, PLOTS["norms"]):  # each one alone is refused
        (out / name).write_bytes(MINE)
        r = invoke("analyze", trained, "--out", out)
        refused(r, out / name, "--overwrite")
        assert listing(out) == {name: MINE}  # nothing written, nothing changed
        (out / name).unlink()
    (out / ANALYSIS_MD).write_bytes(MINE)
    r = invoke("analyze", trained, "--out", out, "--overwrite")
    assert r.exit_code == 0, r.output
    assert (out / ANALYSIS_MD).read_text().startswith(TITLE + "r")
    before = (out / ANALYSIS_MD).read_bytes()
    r = invoke("analyze", trained, "--out", out)  # its own output: rewritten without a word
    assert r.exit_code == 0, r.output
    assert (out / ANALYSIS_MD).read_bytes() == before
    (out / ANALYSIS_MD).write_text(before.decode() + "\nmy notes on it\n")  # changed since: the user's now
    edited = (out / ANALYSIS_MD).read_bytes()
    refused(invoke("analyze", trained, "--out", out), out / ANALYSIS_MD, "--overwrite")
    assert (out / ANALYSIS_MD).read_bytes() == edited


def test_analyze_into_the_run_folder_keeps_working(trained, tmp_path):
    run = tmp_path / "r"
    shutil.copytree(trained, run)  # the module's run stays as the other tests expect it
    for _ in range(2):
        r = invoke("analyze", run)
        assert r.exit_code == 0, r.output
    assert (run / ANALYSIS_MD).read_text().startswith(TITLE)
    assert not (trained / ANALYSIS_MD).exists()


def test_a_plot_of_the_analysis_name_that_tiedlm_did_not_write_is_the_users(trained, tmp_path):
    (tmp_path / "plots").mkdir()
    (tmp_path / "plots" / PLOTS["spectrum"]).write_bytes(PNG + b"mine")
    refused(invoke("analyze", trained, "--out", tmp_path / "plots"), tmp_path / "plots" / PLOTS["spectrum"],
            "--overwrite")


# ------------------------------------------------------------------ 4. compare


def test_compare_refuses_the_users_own_files_and_replaces_them_with_overwrite_output(tmp_path):
    root = tmp_path / "runs"
    make_pair(root, [57.0, 58.0], [59.0, 60.0])
    out = root / "compare-base"  # the folder of the runs base-tied-s0, base-untied-s0, ...
    out.mkdir()
    for name in ("comparison.md", "comparison.csv", "comparison.json", "bucket_loss.png"):
        (out / name).write_bytes(MINE)
        refused(invoke("compare", "--out", root), out / name, "--overwrite-output")
        assert listing(out) == {name: MINE}
        (out / name).unlink()
    (out / "comparison.md").write_bytes(MINE)
    r = invoke("compare", "--out", root, "--overwrite-output")
    assert r.exit_code == 0, r.output
    assert (out / "comparison.md").read_text().startswith("# tiedlm comparison\n")
    r = invoke("compare", "--out", root)  # its own output: rewritten without a word
    assert r.exit_code == 0, r.output
    (out / WRITTEN).unlink()  # the record gone: nothing there is known to be tiedlm's any more
    refused(invoke("compare", "--out", root), out / "comparison.md", "--overwrite-output")
    r = invoke("compare", "--out", root, "--overwrite-output")
    assert r.exit_code == 0, r.output
    assert (out / WRITTEN).is_file()
    r = invoke("compare", "--out", root, "--overwrite")  # still only with --config
    assert r.exit_code == 2 and "only applies with --config" in r.stderr


# ------------------------------------------------------------------ 5. tensorboard


def test_tensorboard_removes_only_its_own_event_files(tmp_path):
    from tiedlm.trackers.tensorboard import SUFFIX, TB

    run = make_run(tmp_path, "t-s0", 0)
    tb = run / TB
    (tb / "mine").mkdir(parents=True)
    (tb / "mine" / "events.out.tfevents.1.host.1.0").write_bytes(b"the user's own run")
    (tb / "notes.txt").write_bytes(MINE)
    (tb / "events.out.tfevents.2.host.2.0").write_bytes(b"another tool's event file")
    users = listing(tb)
    for _ in range(2):
        r = invoke("tensorboard", run)
        assert r.exit_code == 0, r.output
        assert f"left alone: {tb / 'notes.txt'} (not written by tiedlm)" in r.stdout
        ours = [p.name for p in tb.iterdir() if p.name.endswith(SUFFIX)]
        assert len(ours) == 1  # the previous one replaced
        assert {k: v for k, v in listing(tb).items() if k not in ours} == users
    run = make_run(tmp_path / "f", "f-s0", 0)
    (run / TB).write_bytes(MINE)  # a file where the folder belongs: refused, kept
    r = invoke("tensorboard", run)
    assert r.exit_code == 2 and str(run / TB) in r.stderr and (run / TB).read_bytes() == MINE


# ------------------------------------------------------------------ 6. a run's managed parts


def test_no_command_writes_into_a_runs_checkpoints_and_the_run_resumes(trained, tmp_path):
    inside = trained / runs.CHECKPOINTS / "step-0000099"
    before = listing(trained)
    for args in (("export", trained, "--out", inside), ("analyze", trained, "--out", inside),
                 ("analyze", trained, "--out", trained / "tb" / "x"),
                 ("compare", trained, "--out", trained / runs.CHECKPOINTS)):
        r = invoke(*args)
        refused(r, args[3], "--out")
        part = trained / ("tb" if "tb" in args[3].parts else runs.CHECKPOINTS)
        assert f"lies in {part}, a part of the run r that tiedlm manages" in r.stderr, r.stderr
    assert not inside.exists() and not (trained / "tb").exists()
    assert listing(trained) == before
    r = invoke("analyze", trained, "--out", tmp_path / "elsewhere")  # outside the run's parts: fine
    assert r.exit_code == 0, r.output
    done = train_run(load_config(None, TINY), out=trained.parent, name="r", progress=False)
    assert runs.read_report(done).status == "finished"


def test_an_ordinary_folder_with_a_config_yaml_is_not_a_run(trained, tmp_path, monkeypatch):
    """A project folder holding its own config.yaml (or another tool's report.json) may hold an
    export's checkpoints/ or an analysis' tb/: only real run markers make a folder a run."""
    proj = tmp_path / "proj"
    proj.mkdir()
    (proj / runs.CONFIG).write_text((trained / runs.CONFIG).read_text())
    (proj / runs.REPORT).write_text('{"coverage": 0.93}')
    monkeypatch.chdir(proj)
    r = invoke("export", trained, "--out", "checkpoints/hf")
    assert r.exit_code == 0, r.output
    assert (proj / "checkpoints" / "hf" / "config.json").is_file()
    r = invoke("analyze", trained, "--out", "tb/analysis")
    assert r.exit_code == 0, r.output
    from tiedlm.runs.checkpoints import is_run_folder

    assert not is_run_folder(proj)
    # each marker alone still makes a run: tiedlm's report, the checkpoints' pointer, config with metrics
    assert is_run_folder(trained)
    for keep in ({runs.REPORT}, {runs.CHECKPOINTS}, {runs.CONFIG, runs.METRICS}):
        other = tmp_path / "copy" / "-".join(sorted(keep))
        shutil.copytree(trained, other)
        for p in list(other.iterdir()):
            if p.name not in keep:
                shutil.rmtree(p) if p.is_dir() else p.unlink()
        assert is_run_folder(other), keep
        refused(invoke("export", trained, "--out", other / runs.CHECKPOINTS / "hf"), other / runs.CHECKPOINTS / "hf",
                "--out")
    damaged = tmp_path / "copy" / "damaged"
    shutil.copytree(trained, damaged)
    (damaged / runs.REPORT).write_text("{not json")  # a run whose report was damaged is still a run
    assert is_run_folder(damaged)


def test_a_failed_write_leaves_no_name_recorded_as_being_written(tmp_path):
    """A block that fails after writing one of its files: that file is recorded with its hash, the
    others are dropped, and a file the user later puts under one of those names is refused."""
    from tiedlm.errors import ConfigError
    from tiedlm.files import recording

    out = tmp_path / "out"
    with pytest.raises(RuntimeError):
        with recording(out, ["a.md", "b.png"], "--overwrite"):
            (out / "a.md").write_text("tiedlm's\n")
            raise RuntimeError("the plot failed")
    record = json.loads((out / WRITTEN).read_text())["files"]
    assert list(record) == ["a.md"] and record["a.md"] is not None
    (out / "b.png").write_bytes(PNG + b"the user's own plot")
    with pytest.raises(ConfigError, match="b.png was not written by tiedlm"):
        with recording(out, ["a.md", "b.png"], "--overwrite"):
            pass
    assert (out / "b.png").read_bytes() == PNG + b"the user's own plot"


def test_the_record_is_rewritten_under_a_lock(tmp_path):
    """Two writers into one folder: the second waits for the first's read-modify-write of the record,
    so neither loses the other's entries."""
    import fcntl
    import os

    from tiedlm.files import WRITTEN_LOCK, recording

    out = tmp_path / "out"
    with recording(out, ["first.md"], "--overwrite"):
        (out / "first.md").write_text("one\n")
    fd = os.open(out / WRITTEN_LOCK, os.O_RDWR)
    fcntl.flock(fd, fcntl.LOCK_EX)  # another writer, in the middle of its update
    done = threading.Event()

    def second():
        with recording(out, ["second.md"], "--overwrite"):
            (out / "second.md").write_text("two\n")
        done.set()

    thread = threading.Thread(target=second)
    thread.start()
    time.sleep(0.5)
    assert not done.is_set() and "second.md" not in (out / WRITTEN).read_text()  # waiting for the lock
    os.close(fd)
    thread.join(10)
    assert done.is_set()
    record = json.loads((out / WRITTEN).read_text())["files"]
    assert sorted(record) == ["first.md", "second.md"] and None not in record.values()


def test_several_runs_are_checked_for_an_untied_runs_own_plot_before_any_is_written(trained, tmp_path):
    """analyze of a tied and an untied run into one --out: the untied run's pair-cosine plot name is
    checked with the others, before the tied run's analysis is written."""
    from tiedlm.analyze.render import analysis_files

    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TIEDLM_CACHE", str(tmp_path / "cache"))
        untied = train_run(load_config(None, TINY + ["model.tie_embeddings=false"]), out=tmp_path / "runs",
                           name="u", progress=False)
    out = tmp_path / "out"
    (out / "u").mkdir(parents=True)
    (out / "u" / PLOTS["cosine"]).write_bytes(PNG + b"mine")
    r = invoke("analyze", trained, untied, "--out", out)
    refused(r, out / "u" / PLOTS["cosine"], "--overwrite")
    assert not (out / "r").exists()  # the tied run, first, was not written either
    assert listing(out) == {f"u/{PLOTS['cosine']}": PNG + b"mine"}
    assert PLOTS["cosine"] in analysis_files(tied=False) and PLOTS["cosine"] not in analysis_files(tied=True)
