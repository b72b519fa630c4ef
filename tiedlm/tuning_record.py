"""A tuned sweep's record: tuning.json beside its runs, so that `tiedlm compare FOLDER` compares
each grid point at its own chosen values without being told (tuning.py does the tuning; sweep.py
writes the record when its runs are done; compare reads it).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path

from .errors import ConfigError
from .tuning import Tuning, not_compared, single_point, tuned_keys

RECORD = "tuning.json"  # in a tuned sweep's runs folder: which runs are each grid point's choice


@dataclass
class TuningRecord:
    """What a tuned sweep leaves beside its runs, so that `tiedlm compare FOLDER` compares each
    grid point at its own chosen values (and leaves the other tuning runs out) without being told.
    It is read only when the folder itself is compared (read_record) and only when every run there
    is one of the sweep's, so a record never decides about runs it does not know."""

    folder: Path
    keys: list[str]  # the tuned keys and the schedule's: what variants differ in by design
    chosen: list[str]  # the run names at the chosen points, every seed
    runs: list[str]  # every run the sweep trained: its tuning runs and the chosen ones
    tuning: dict  # Tuning.to_json()
    ignored: str | None = None  # why a record that is, or was, in the folder cannot be used (then empty)

    @property
    def usable(self) -> bool:
        return self.ignored is None

    def warnings(self, primary: str) -> list[str]:
        """What the comparison says first when the record is ignored: every grid point is then a
        variant of its own, and validation is the split that chose the tuned values."""
        if self.usable:
            return []
        on = (f"the verdict is on {primary}, the split that chose the tuned values, so it favours each variant's "
              "chosen point — use --primary test" if primary == "validation" else f"the verdict is on {primary}")
        return [f"the tuning record was ignored: {self.ignored}. Every grid point is compared as a variant of its "
                f"own, not each variant at its chosen value; {on}. Rerun the sweep (or compare --config) that trained "
                "them to write the record again"]

    def notes(self) -> list[str]:
        """The comparison's notes: what was tuned, and each variant's choice."""
        if not self.usable:
            return []
        tuned = self.tuning.get("keys") or self.keys[:1]
        variants = [v for v in self.tuning.get("variants") or [] if isinstance(v, dict)]
        only = single_point([[p.get("label") for p in v.get("points") or [] if isinstance(p, dict)]
                             for v in variants])
        if only is not None:
            return [f"{not_compared(tuned, only)} ({self.folder / RECORD}); each grid point is compared "
                    "at it, on test"]
        choices = [f"{v.get('variant')}: {(v.get('chosen') or {}).get('label', 'none')}"
                   + (f" (edge: {v['edge']})" if v.get("edge") else "")
                   + (f" (bound: {v['bound']})" if v.get("bound") else "")
                   for v in self.tuning.get("variants") or []]
        return [f"{', '.join(tuned)} tuned per variant on validation ({self.folder / RECORD}): each "
                "variant is compared at its own choice, on test; labels and twins leave the tuned keys out",
                *(["chosen: " + "; ".join(choices)] if choices else [])]


def check_record_target(folder: Path, remove: bool = True) -> None:
    """Before a tuned sweep or a tuned compare --config trains: refuse a tuning.json in its runs
    folder that tiedlm did not write, and (`remove`, a sweep) remove tiedlm's own (an earlier
    sweep's, perhaps of another grid): the new one is written when this sweep's runs are done, so an
    interrupted sweep leaves no stale record."""
    from .files import foreign_files

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
    from .files import atomic_write_json, recording

    folder = Path(folder)
    with recording(folder, [RECORD], "out:", overwrite=True):
        atomic_write_json(folder / RECORD, {"format": 1, "keys": tuned_keys(tuning), "chosen": sorted(chosen),
                                            "runs": record_runs(tuning, chosen, list(others)), "tuning": tuning.to_json()})
    return folder / RECORD


def read_record(folder: Path, run_dirs: list[Path]) -> TuningRecord | None:
    """The tuning record of `folder` (the one folder compared); None where tiedlm never wrote one.
    It is used (`usable`) when tiedlm wrote it, nobody changed it since, and every run in run_dirs
    is one of its sweep's runs: it never speaks for runs it does not know. Otherwise the record
    returned is empty and says, in `ignored`, why (a comparison then says so first)."""
    from .files import foreign_files, read_json, written_here

    folder = Path(folder)
    path = folder / RECORD
    ignored = functools.partial(TuningRecord, folder, [], [], [], {})  # a record that says why it is not used
    if not path.exists():
        return ignored(ignored=f"{path}, which a tuned sweep or compare --config wrote, is missing") if written_here(folder, RECORD) else None
    if foreign_files(folder, [RECORD]):
        return ignored(ignored=f"{path} was not written by tiedlm, or was changed since")
    data = read_json(path)
    keys, chosen, runs = (data.get(k) for k in ("keys", "chosen", "runs")) if isinstance(data, dict) else (None,) * 3
    if (not isinstance(data, dict) or data.get("format") != 1
            or not all(isinstance(x, list) and all(isinstance(i, str) for i in x) for x in (keys, chosen, runs))):
        return ignored(ignored=f"{path} is not a tuning record this tiedlm reads")
    strangers = sorted(Path(d).name for d in run_dirs
                       if Path(d).resolve().parent != folder.resolve() or Path(d).name not in set(runs))
    if strangers:
        more = ", …" if len(strangers) > 3 else ""
        return ignored(ignored=f"{len(strangers)} run{'s' * (len(strangers) != 1)} here the tuning did not train "
                       f"({', '.join(strangers[:3])}{more}: renamed, or added since)")
    return TuningRecord(folder, keys, chosen, runs, data.get("tuning") if isinstance(data.get("tuning"), dict) else {})
