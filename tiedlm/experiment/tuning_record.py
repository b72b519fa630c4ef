"""A tuned sweep's record: tuning.json beside its runs, so that `tiedlm compare FOLDER` compares
each grid point at its own chosen values without being told (tuning.py does the tuning; sweep.py
writes the record when its runs are done; compare reads it: compare/tuned.py's read_record).
"""

from __future__ import annotations

from pathlib import Path

from ..compare.tuned import RECORD, Tuning, tuned_keys
from ..errors import ConfigError
from ..files import atomic_write_json, foreign_files, recording

def check_record_target(folder: Path, remove: bool = True) -> None:
    """Before a tuned sweep or a tuned compare --config trains: refuse a tuning.json in its runs
    folder that tiedlm did not write, and (`remove`, a sweep) remove tiedlm's own (an earlier
    sweep's, perhaps of another grid): the new one is written when this sweep's runs are done, so an
    interrupted sweep leaves no stale record."""

    folder = Path(folder)
    found = foreign_files(folder, [RECORD])
    if found:
        raise ConfigError(f"{found[0]} was not written by tiedlm, or was changed since — move it away, or train into "
                          "another folder (out: in a grid file, --out for compare --config)")
    if remove:  # a tuned compare --config keeps another command's record until it writes its own
        (folder / RECORD).unlink(missing_ok=True)


def record_runs(tuning: Tuning, chosen: list[str], others: list[str] = ()) -> list[str]:
    """Every run a record speaks for: the chosen ones, `others`, and each tuning point's runs."""
    return sorted({*chosen, *others, *(name for v in tuning.variants for p in v.points for name in p.runs.values())})


def write_record(folder: Path, tuning: Tuning, chosen: list[str], others: list[str] = ()) -> Path:
    """tuning.json into a tuned sweep's (or a tuned `compare --config`'s) runs folder, atomically,
    recorded as tiedlm's. `others` are runs it trained that are neither tuning runs nor compared
    (--seeds auto's shared-value runs)."""

    folder = Path(folder)
    with recording(folder, [RECORD], "out:", overwrite=True):
        atomic_write_json(folder / RECORD, {"format": 1, "keys": tuned_keys(tuning), "chosen": sorted(chosen),
                                            "runs": record_runs(tuning, chosen, list(others)), "tuning": tuning.to_json()})
    return folder / RECORD


