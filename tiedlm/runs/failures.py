"""A failed write or an expected runtime failure (out of memory, a broken collective) as one
line: what went wrong and the way on (resume from the last checkpoint, or run again)."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Iterator

from ..errors import RunError, TiedlmError
from ..files import describe_write_failure

RESUME_HINT = "then run the same command to resume from the last checkpoint"
AGAIN_HINT = "then run the same command again"  # for what is not a run's own file: a comparison, an analysis


def write_failure(exc: BaseException, what: Path | str, then: str = RESUME_HINT) -> RunError:
    """A failed write of a run file as one line. A full disk, a quota or a file-size limit
    surface as OSError from plain writes but as other exceptions from torch.save and safetensors
    (files.errno_of finds them): every one is a write that did not happen, with the previous
    checkpoint intact, so the advice is the same."""
    if isinstance(exc, RunError):
        return exc
    why, no_room = describe_write_failure(exc, what)
    if no_room:
        return RunError(f"{why} while writing {what} — free some disk space (or raise the file-size "
                        f"limit, ulimit -f), {then}")
    if isinstance(exc, OSError):
        return RunError(f"{why} while writing {what} — check the path and its permissions, {then}")
    return RunError(f"cannot write {what} ({why}) — check the free disk space and the file-size limit "
                    f"(ulimit -f), {then}")


@contextlib.contextmanager
def writing(what: Path | str, then: str = RESUME_HINT) -> Iterator[None]:
    """Turn any failure of the writes inside into write_failure's one-line RunError; `then` is the
    way on it advises (a run's files: resume from the last checkpoint)."""
    try:
        yield
    except RunError:
        raise
    except Exception as exc:
        raise write_failure(exc, what, then) from exc


def as_tiedlm_error(exc: BaseException, distributed: bool = False) -> TiedlmError | None:
    """Expected runtime failures as one-line errors: out of memory (GPU or CPU), a failed write,
    and under torchrun a collective broken by another rank's failure."""
    import torch

    if isinstance(exc, TiedlmError):
        return exc
    if distributed and isinstance(exc, RuntimeError) and any(
            w in str(exc) for w in ("gloo", "NCCL", "Connection closed", "connection", "peer")):
        return RunError("another process of this distributed run failed, which broke a collective — see "
                        "torchrun's output for that rank's error; the last checkpoint is kept")
    # The CPU allocator raises a plain RuntimeError; its message is the only sign of what it is.
    cpu_oom = isinstance(exc, RuntimeError) and "DefaultCPUAllocator" in str(exc)
    if isinstance(exc, (torch.OutOfMemoryError, MemoryError)) or cpu_oom:
        where = "the device" if isinstance(exc, torch.OutOfMemoryError) else "this machine (CPU memory)"
        return RunError(f"out of memory on {where} — lower train.batch_size (raise train.grad_accum to keep "
                        "the same batch), model.block_size or the model size; the last checkpoint is kept")
    if isinstance(exc, OSError):
        return write_failure(exc, exc.filename or "the run folder")
    return None
