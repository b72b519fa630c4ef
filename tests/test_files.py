"""Atomic writes and the diagnosis of failed writes, which the run folder and the token cache share."""

import errno
import os

import pytest

from tiedlm import files


def test_a_failed_write_leaves_the_old_file_and_no_temporary(tmp_path):
    path = tmp_path / "report.json"
    path.write_text("old")

    def half_then_fail(tmp):
        tmp.write_text("half")
        raise OSError(errno.ENOSPC, "No space left on device")

    with pytest.raises(OSError):
        files.replace_atomically(path, half_then_fail)
    assert path.read_text() == "old" and os.listdir(tmp_path) == ["report.json"]
    files.atomic_write_text(path, "new")
    assert path.read_text() == "new" and os.listdir(tmp_path) == ["report.json"]


@pytest.mark.parametrize("exc, code", [
    (OSError(errno.ENOSPC, "No space left on device"), errno.ENOSPC),
    (RuntimeError("File too large (os error 27)"), errno.EFBIG),  # the Rust tokenizer's words
    (Exception("safetensors: No space left on device"), errno.ENOSPC),
    (ValueError("not a write failure"), None),
])
def test_errno_of_finds_the_cause_wherever_it_hides(exc, code):
    assert files.errno_of(exc) == code


def test_errno_of_follows_the_chain():
    try:
        try:
            raise OSError(errno.EDQUOT, "Disk quota exceeded")
        except OSError as inner:
            raise RuntimeError("unexpected pos 4864 vs 4752") from inner
    except RuntimeError as outer:
        assert files.errno_of(outer) == errno.EDQUOT
        assert files.describe_write_failure(outer) == (os.strerror(errno.EDQUOT), True)
    assert files.describe_write_failure(ValueError("bad")) == ("ValueError: bad", False)
