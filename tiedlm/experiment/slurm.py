"""Slurm's own grammar for the `#SBATCH --key=value` lines `tiedlm sweep --emit slurm` writes, and
the one check of every such value (a grid file's slurm: block and the command line's options).

sbatch reads those lines itself (bash sees comments), so a value must be exactly one token of
Slurm's grammar: no blank, quote, `;`, `$` or newline can reach the script through them."""

from __future__ import annotations

import difflib
import re
from pathlib import Path
from typing import Any

from ..errors import ConfigError
from ..formatting import shown_text

SLURM_KEYS = ("partition", "time", "gpus_per_task", "cpus_per_task", "mem", "account")


def _fail(path: Path, message: str) -> ConfigError:
    return ConfigError(f"{path}: {message}")


def read_slurm_block(path: Path, data: Any) -> dict[str, str]:
    """slurm: sbatch options for --emit slurm, e.g. {partition: gpu, time: "02:00:00", gpus_per_task: 1}."""
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise _fail(path, f"slurm: must map sbatch options ({', '.join(SLURM_KEYS)}) to values")
    for key, value in data.items():
        if key not in SLURM_KEYS:
            close = difflib.get_close_matches(str(key), SLURM_KEYS, n=1)
            hint = f" — did you mean {close[0]}?" if close else f" — use {', '.join(SLURM_KEYS)}"
            raise _fail(path, f"slurm: unknown option {key!r}{hint}")
        if isinstance(value, (dict, list)) or value is None or isinstance(value, bool):
            raise _fail(path, f"slurm: {key} must be one value, got {value!r}")
        if key == "time" and not isinstance(value, str):  # YAML reads 2:00:00 as 7200 (seconds, base 60)
            raise _fail(path, f'slurm: time must be quoted, e.g. time: "02:00:00" (YAML read it as {value!r})')
        if _CONTROL.search(str(value)):
            raise _fail(path, f"slurm: {key} must be one line without control characters, got "
                              f"{shown_text(str(value))} — give a value on one line")
    # Slurm's grammar is checked when a script is emitted (slurm_script), not here: a value this
    # tiedlm does not know to be Slurm's must not keep the grid from running without Slurm.
    return {k: str(v) for k, v in data.items()}


# Slurm's grammar for each option tiedlm writes.
_NAME = r"[A-Za-z0-9_.-]+"  # a partition or account name (sbatch: letters, digits, '_', '-', '.')
_COUNT = r"[1-9][0-9]*"  # a positive whole number
_SLURM_GRAMMAR: dict[str, tuple[re.Pattern, str]] = {
    "partition": (re.compile(rf"{_NAME}(,{_NAME})*"),
                  "a partition name or a comma-separated list of them (letters, digits, '_', '-', '.'), e.g. gpu"),
    "account": (re.compile(_NAME), "an account name (letters, digits, '_', '-', '.'), e.g. proj42"),
    # sbatch --time: minutes, minutes:seconds, hours:minutes:seconds, days-hours, days-hours:minutes,
    # days-hours:minutes:seconds, or no limit (UNLIMITED / INFINITE, any case); 0 also means no limit
    "time": (re.compile(r"[0-9]+(:[0-5]?[0-9]){0,2}|[0-9]+-([01]?[0-9]|2[0-3])(:[0-5]?[0-9]){0,2}"
                        r"|(?i:unlimited|infinite)"),
             "minutes, MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS or UNLIMITED, e.g. 02:00:00"),
    # sbatch --gpus-per-task: [type:]count, or a comma-separated list of them (a100:1,v100:1)
    "gpus_per_task": (re.compile(rf"({_NAME}:)?{_COUNT}(,({_NAME}:)?{_COUNT})*"),
                      "a positive whole number of GPUs, TYPE:COUNT such as a100:2, or a comma-separated list of "
                      "them such as a100:1,v100:1"),
    "cpus_per_task": (re.compile(_COUNT), "a positive whole number of CPUs, e.g. 8"),
    # sbatch --mem (str_to_mbytes): megabytes, or a K, M, G or T suffix, optionally followed by B
    "mem": (re.compile(r"[0-9]+([KMGTkmgt][Bb]?)?"),
            "a whole number with an optional K, M, G or T suffix (optionally followed by B), e.g. 32G or 16GB"),
}
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")  # a newline would end an #SBATCH line and start a shell one
assert set(_SLURM_GRAMMAR) == set(SLURM_KEYS)
# Slurm keeps a time limit in 32-bit minutes (its top values mean "infinite" and "not set"), CPU
# counts in 16 bits (likewise) and memory in 64-bit megabytes: beyond these a value overflows.
SLURM_MINUTES_LIMIT = 2**32 - 3
SLURM_COUNT_LIMIT = 2**16 - 2
_MEM_MB = {"": 1, "k": 1 / 1024, "m": 1, "g": 1024, "t": 1024**2}


def _int(digits: str) -> int:
    return int(digits) if len(digits) <= 40 else 10**40  # int() refuses over 4,300 digits; all are out of range


def _slurm_range(key: str, text: str) -> str | None:
    """What is out of Slurm's range in a value of its grammar, or None."""
    if key == "time" and text[0].isdigit():
        days, _, rest = text.rpartition("-")
        parts = [_int(p) for p in rest.split(":")]
        if days:  # D-HH, D-HH:MM or D-HH:MM:SS
            h, m, sec = (parts + [0, 0])[:3]
            minutes = _int(days) * 1440 + h * 60 + m + (sec > 0)
        elif len(parts) == 3:  # HH:MM:SS
            minutes = parts[0] * 60 + parts[1] + (parts[2] > 0)
        else:  # MM or MM:SS
            minutes = parts[0] + (len(parts) == 2 and parts[1] > 0)
        if minutes > SLURM_MINUTES_LIMIT:
            return f"at most {SLURM_MINUTES_LIMIT:,} minutes (Slurm's 32-bit limit; UNLIMITED for none)"
    if key in ("gpus_per_task", "cpus_per_task") and any(_int(each.rpartition(":")[2]) > SLURM_COUNT_LIMIT
                                                           for each in text.split(",")):
        return f"at most {SLURM_COUNT_LIMIT:,} (Slurm's 16-bit count)"
    if key == "mem":
        number = text.rstrip("Bb")
        unit = number[-1].lower() if number[-1].isalpha() else ""
        if _int(number.rstrip("KMGTkmgt")) * _MEM_MB[unit] >= 2**63:
            return "below 2**63 megabytes (Slurm's 64-bit memory size)"
    return None


def check_slurm_option(key: str, value: Any, where: str) -> str:
    """A value for `#SBATCH --<key>=`, checked against Slurm's grammar for that option, as text.
    The one check for both the grid file's slurm: block and the command line's --partition, --time
    and --gpus-per-task (`where` names which, e.g. "--time" or "grid.yaml: slurm: time")."""
    pattern, rule = _SLURM_GRAMMAR[key]
    text = str(value)
    if not pattern.fullmatch(text):
        raise ConfigError(f"{where} must be {rule}; got {shown_text(text)} — give a value of that form")
    problem = _slurm_range(key, text)
    if problem is not None:
        shown = text if len(text) <= 40 else f"{text[:30]}... ({len(text)} characters)"
        raise ConfigError(f"{where} must be {problem}, got {shown} — give a smaller value")
    return text
