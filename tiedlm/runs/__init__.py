"""The run folder, what is in it and who may write it:

    layout.py        the names of its files, a run's folder, clearing it for --overwrite
    record.py        report.json (`RunReport`, its one schema, older formats read as they meant),
                     config.yaml read back, and what to do with an existing folder
    human_report.py  report.md, report.json for people
    metrics.py       metrics.jsonl, appended, read past a torn line, trimmed on resume
    checkpoints.py   checkpoints/step-N folders and the LATEST pointer
    sharded.py       a sharded run's checkpoints (train.parallel: fsdp), each rank its shards
    ledger.py        the confound ledger: what E and W_out received besides the tie
    locks.py         a run's `.lock` and the lock on a folder compare or analyze writes into
    failures.py      a failed write, out of memory or a broken collective as one line

The names below are those the rest of tiedlm reads (`from tiedlm import runs; runs.read_report`).

The folder's layout is in layout.py's docstring. Every file is written to a temporary name, fsynced
and renamed (tiedlm/files.py), so a killed process never leaves a half-written file; a failed write
is one line saying what to do (write_failure).
"""

from .failures import AGAIN_HINT, RESUME_HINT, as_tiedlm_error, write_failure, writing
from .human_report import render_report_md
from .layout import (
    CHECKPOINTS,
    CONFIG,
    FORMAT,
    LOCK,
    MANAGED,
    METRICS,
    REPORT,
    REPORT_MD,
    START,
    STATUSES,
    TB,
    TOKENIZER,
    clean_temporary_files,
    clear_run_dir,
    expand_runs,
    keep_start,
    kept_start,
    run_dir_for,
)
from .locks import OUTPUT_LOCK, FolderLock, RunLock
from .metrics import append_metrics, read_metrics, read_metrics_counted, trim_metrics
from .record import (
    RunRecord,
    RunReport,
    check_config_unedited,
    check_format,
    existing_state,
    read_config,
    read_report,
)

__all__ = [
    "AGAIN_HINT", "CHECKPOINTS", "CONFIG", "FORMAT", "LOCK", "MANAGED", "METRICS", "OUTPUT_LOCK", "REPORT",
    "REPORT_MD", "RESUME_HINT", "START", "STATUSES", "TB", "TOKENIZER", "FolderLock", "RunLock", "RunRecord",
    "RunReport", "append_metrics", "as_tiedlm_error", "check_config_unedited", "check_format",
    "clean_temporary_files", "clear_run_dir", "existing_state", "expand_runs", "keep_start", "kept_start",
    "read_config", "read_metrics", "read_metrics_counted", "read_report", "render_report_md", "run_dir_for",
    "trim_metrics", "write_failure", "writing",
]
