"""The machine failing under a command: a full disk as torch.save reports it (a short write, no
errno), a folder that cannot be written, a comparison folder that is a file. Each is one line
naming the problem and the way on, said before any run is trained where it can be known."""

import errno
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tiedlm import files, runs
from tiedlm.experiment import jobs
from tiedlm.errors import RunError


TORCH_SHORT_WRITE = RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 383872 vs 383824")


def _fail_inside(what: Path, exc: BaseException, then: str = runs.RESUME_HINT) -> str:
    with pytest.raises(RunError) as info:
        with runs.writing(what, then):
            raise exc
    return str(info.value)


def test_torch_short_write_on_a_full_disk_is_the_no_space_line(tmp_path, monkeypatch):
    monkeypatch.setattr(files, "free_bytes", lambda where: 4096)
    text = _fail_inside(tmp_path / "checkpoints" / "step-0000004", TORCH_SHORT_WRITE)
    assert text.startswith(f"No space left on device while writing {tmp_path}/checkpoints/step-0000004 — free")
    assert "inline_container" not in text and text.endswith(runs.RESUME_HINT)


def test_torch_short_write_with_room_left_stays_a_generic_write_failure(tmp_path, monkeypatch):
    monkeypatch.setattr(files, "free_bytes", lambda where: 10 << 30)
    text = _fail_inside(tmp_path / "x", TORCH_SHORT_WRITE)
    assert text.startswith("cannot write") and "check the free disk space" in text


def test_free_bytes_looks_at_the_nearest_existing_folder(tmp_path):
    free = files.free_bytes(tmp_path / "not" / "yet" / "made")
    st = os.statvfs(tmp_path)
    assert free == st.f_bavail * st.f_frsize


def test_a_comparison_or_analysis_that_cannot_be_written_is_not_told_to_resume(tmp_path):
    text = _fail_inside(tmp_path / "comparison.md", OSError(errno.ENOSPC, "No space left on device"),
                        runs.AGAIN_HINT)
    assert text.endswith("then run the same command again") and "checkpoint" not in text


def test_a_folder_that_cannot_be_written_is_said_once_before_training(tmp_path, tiny):
    (tmp_path / "afile").write_text("x")
    trained = []
    with pytest.raises(RunError, match=r"cannot write into .*afile/runs \(Not a directory\) — check the path"):
        jobs.train_jobs([("a-s0", tiny()), ("b-s0", tiny(seed=1))], tmp_path / "afile" / "runs", progress=False,
                        train=lambda cfg, **kw: trained.append(kw["name"]))
    assert trained == []


def test_an_os_error_of_one_run_is_the_line_train_prints(tmp_path, tiny):
    def train(cfg, out, name, progress=True, **_):
        raise OSError(errno.EROFS, "Read-only file system", str(Path(out) / name))

    [result] = jobs.train_jobs([("a-s0", tiny())], tmp_path, progress=False, train=train)
    assert result.status == "failed" and result.error == (
        f"Read-only file system ({tmp_path / 'a-s0'}) — check the path, its permissions and the free disk space")


def test_a_comparison_folder_that_is_a_file_is_refused_before_training(tmp_path, tiny_yaml):
    from tiedlm.experiment import compare_config
    from tiedlm.errors import ConfigError

    (tmp_path / "runs").mkdir()
    (tmp_path / "runs" / "compare-tiny").write_text("mine")  # the tiny config's comparison folder
    trained = []
    with pytest.raises(ConfigError, match="cannot be a folder"):
        compare_config(tiny_yaml, runs_dir=tmp_path / "runs", progress=False,
                       train=lambda cfg, **kw: trained.append(kw["name"]))
    assert trained == [] and (tmp_path / "runs" / "compare-tiny").read_text() == "mine"


def _small_disk(path: Path, size: str) -> bool:
    """A tmpfs of `size` mounted at path (root only; False where mounting is not allowed)."""
    if os.geteuid() != 0 or not shutil.which("mount"):
        return False
    path.mkdir()
    return subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
                          capture_output=True).returncode == 0


def test_a_real_full_disk_ends_the_run_with_the_no_space_line(tmp_path, tiny_yaml):
    disk = tmp_path / "disk"
    if not _small_disk(disk, "2M"):
        pytest.skip("needs root and tmpfs mounts to fill a real disk")
    try:
        (disk / "filler").write_bytes(b"\0" * 1_250_000)
        args = [sys.executable, "-m", "tiedlm", "train", "-q", "-c", str(tiny_yaml), "--out", str(disk / "runs"),
                "--set", "model.n_embd=64", "--set", "train.max_steps=40"]
        r = subprocess.run(args, capture_output=True, text=True, env={**os.environ, "TIEDLM_CACHE": str(tmp_path / "c")})
        assert r.returncode == 1, r.stderr
        last = r.stderr.strip().splitlines()[-1]
        assert last.startswith("tiedlm: error: No space left on device while writing"), last
        assert "Traceback" not in r.stderr and "inline_container" not in r.stderr
    finally:
        subprocess.run(["umount", str(disk)], capture_output=True)
