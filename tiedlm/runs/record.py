"""report.json: `RunReport`, the one schema of a run's result, its reading (older formats
filled with the values they meant) and `RunRecord`, which keeps report.json and report.md in step.
config.yaml is read here too, refused when edited after the run, and compared with a new
config to say what to do with an existing folder (`existing_state`)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from .. import files
from ..config import Config, from_dict, to_dict
from ..config.identity import config_hash, diff_keys, operational_keys, variant_dict, with_added_keys
from ..config.yamlsafe import load_yaml, read_yaml_text
from ..errors import ConfigError, ConfigMismatchError, DamagedRunError, RunError
from .failures import writing
from .human_report import render_report_md
from .layout import CONFIG, FORMAT, LOCK, REPORT, REPORT_MD

# Fields whose null says something ("no error", "never untied"): written even when null.
_ALWAYS_WRITTEN = {"status", "error", "git_commit", "data_identity", "floor", "untie_step", "untied_at_step",
                   "params_after_untie"}
_NOT_WRITTEN = {"extra", "config_problem", "_stored"}  # fields of RunReport that are not keys of report.json


@dataclass
class RunReport:
    """report.json. The one schema of a run's result: training (tiedlm.train) writes it, and
    compare, sweep and eval read it through read_report. Keys a reader does not know (from another
    tiedlm version) are kept in `extra` and written back unchanged."""

    # in the order report.json holds them
    format: int = FORMAT
    tiedlm_version: str | None = None
    name: str = ""
    status: str | None = "running"  # one of STATUSES; None when a report lacks it
    error: str | None = None
    seed: int | None = None
    config_hash: str | None = None  # variant.config_hash: what identifies the variant
    config: Config | None = None  # the resolved config; read_report rebuilds it (None: see config_problem)
    started_at: str | None = None
    device: str | None = None
    dtype: str | None = None
    versions: dict = field(default_factory=dict)
    git_commit: str | None = None
    command: str | None = None
    data_identity: dict | None = None  # data.data_identity: what the tokens depend on
    start_identity: dict | None = None  # model.hf_config.start_identity: the files the model starts from, by content
    # known once the model is built
    params: dict | None = None  # model.count_params, with the tokenizer's and the padded vocabulary
    flops_per_token: dict | None = None
    total_steps: int | None = None
    data: dict | None = None  # PreparedData.info
    floor: dict | None = None  # builtin:synthetic only
    untie_step: int | None = None  # the step at which an untie_at run is to split in two
    decay_embeddings: bool | None = None
    ledger: dict | None = None  # ledger.Ledger: what E and W_out received (lr, decay, init, V·d's share)
    also: dict | None = None  # eval.also: another data set's test split before and after training
    resumed_at_steps: list = field(default_factory=list)
    # the end
    final: dict | None = None  # split -> evaluate.summarize_nll's result
    steps: int | None = None
    tokens_seen: int | None = None
    train_time_s: float | None = None
    wall_time_s: float | None = None  # over every attempt of a resumed run
    tokens_per_s: float | None = None
    peak_memory_bytes: int | None = None
    peak_memory_kind: str | None = None
    untied_at_step: int | None = None  # the step at which it did split
    skipped_steps: int | None = None
    finished_at: str | None = None
    params_after_untie: dict | None = None
    checkpoint: str | None = None  # the final checkpoint, relative to the run folder
    interrupted_at_step: int | None = None
    diverged_at_step: int | None = None
    best: dict | None = None  # selection.BestTracker.summary: the best periodic validation evaluation
    final_best: dict | None = None  # train.keep_best: the final evaluation of the best weights, as `final`
    stopped_early: dict | None = None  # early stopping: the step, the budget in steps, the reason
    world_size: int | None = None  # processes of a distributed run (torchrun); absent for one
    allreduce_bytes_per_step: int | None = None  # gradient bytes all-reduced per step under DDP
    threads: dict | None = None  # CPU runs: device.threads_used, the count(s) this attempt ran at
    extra: dict = field(default_factory=dict)
    config_problem: str | None = None  # why report.json's config did not rebuild (then `config` is None)
    _stored: tuple = field(default=(None, None), repr=False)  # (the config as read, its JSON as read)

    @classmethod
    def from_json(cls, data: dict) -> "RunReport":
        names = {f.name for f in fields(cls)} - _NOT_WRITTEN
        known = {k: v for k, v in data.items() if k in names}
        known.setdefault("status", None)  # a report without a status is not a running one
        config, problem = _report_config(known.get("config"))  # its JSON is written back while it is unchanged
        return cls(**{**known, "config": config}, config_problem=problem, _stored=(config, known.get("config")),
                   extra={k: v for k, v in data.items() if k not in names})

    def to_json(self) -> dict:
        """The fields that have a value (and _ALWAYS_WRITTEN), then `extra`."""
        out = {f.name: getattr(self, f.name) for f in fields(self) if f.name not in _NOT_WRITTEN}
        read, stored = self._stored
        out["config"] = stored if self.config == read else None if self.config is None else to_dict(self.config)
        keep = {k: v for k, v in out.items() if v is not None and v != [] or k in _ALWAYS_WRITTEN}
        return {**keep, **self.extra}

    def update(self, **changes: Any) -> None:
        for key, value in changes.items():
            if not hasattr(self, key) or key in _NOT_WRITTEN:
                raise AttributeError(f"RunReport has no field {key!r}")
            setattr(self, key, value)


class RunRecord:
    """A run's report.json, rewritten atomically at every update, and report.md, its view for
    people, rewritten with it once the run has ended (finished, interrupted, diverged or failed):
    while a run trains, report.json is the record and report.md is its last attempt's."""

    def __init__(self, run_dir: Path, report: RunReport):
        self.run_dir = Path(run_dir)
        self.report = report

    def write(self, **changes: Any) -> None:
        self.report.update(**changes)
        data = self.report.to_json()  # each made before its writing(): a failure there is no write's
        with writing(self.run_dir / REPORT):
            files.atomic_write_json(self.run_dir / REPORT, data)
        if self.report.status == "running":
            return
        text = render_report_md(self.report)
        with writing(self.run_dir / REPORT_MD):
            files.atomic_write_text(self.run_dir / REPORT_MD, text)




def read_report(run_dir: Path) -> RunReport | None:
    """report.json as a RunReport, None when there is none; a corrupt or newer report is an error."""
    path = Path(run_dir) / REPORT
    if not path.exists():
        return None
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError):
        raise DamagedRunError(f"{path} is not valid JSON (the run folder is damaged)",
                              "move it away, or start afresh with --overwrite", "move it away, or retrain the run") from None
    if not isinstance(data, dict):
        raise DamagedRunError(f"{path} is not a tiedlm report", "move the folder away, or use --overwrite",
                              "move the folder away, or retrain the run")
    check_format(data.get("format"), path)
    return RunReport.from_json(data)


def check_format(fmt: Any, path: Path) -> None:
    if isinstance(fmt, int) and fmt > FORMAT:
        raise RunError(f"{path} was written by a newer tiedlm (run format {fmt}, this one reads {FORMAT}) "
                       "— upgrade tiedlm to use this run")


def _report_config(stored: Any) -> tuple[Config | None, str | None]:
    """report.json's config rebuilt, or (None, why not); (None, None) when it holds none (config.yaml serves).
    A stored config is made the resolved Config here and in read_config only (from_dict normalises it)."""
    if not isinstance(stored, dict) or not stored:
        return None, None
    if not isinstance(stored.get("model"), dict):
        return None, f"the config in {REPORT} has no model section"
    try:
        return from_dict(stored), None
    except (ConfigError, TypeError, ValueError, AttributeError) as exc:  # a newer tiedlm's key, a hand edit
        return None, f"the config in {REPORT} does not load: {exc}"


def read_config(run_dir: Path) -> Config | None:
    """config.yaml rebuilt, None when there is none; damaged, or edited since the run
    (check_config_unedited): a DamagedRunError; not rebuilt: a ConfigError."""
    data = _config_data(run_dir)
    cfg = None if data is None else from_dict(data)
    if cfg is not None:
        check_config_unedited(run_dir, cfg, read_report(run_dir))
    return cfg


def check_config_unedited(run_dir: Path, cfg: Config, report: RunReport | None) -> None:
    """Refuse (DamagedRunError) config.yaml, read as `cfg`, when its config_hash is neither the hash
    report.json stores nor its config's: edited after the run (training writes all three from one
    Config), maybe in a key that keeps every shape (rope_theta). Keys outside the hash (threads) may
    change, as on a resume. from_dict gives an older folder's added keys their "as before" values,
    which the hash leaves out, so it compares equal (even were its stored hash of an older definition)."""
    theirs = {report.config_hash, None if report.config is None else config_hash(report.config)} if report else set()
    if not theirs - {None} or (mine := config_hash(cfg)) in theirs:
        return
    path, keys = Path(run_dir) / CONFIG, ""
    if report.config is not None:
        differ = diff_keys(variant_dict(report.config), variant_dict(cfg))
        shown = ", ".join(differ[:4]) + (f" and {len(differ) - 4} more" if len(differ) > 4 else "")
        keys = f"{shown} differ{'s' if len(differ) == 1 else ''} from the config in {REPORT}; " if differ else ""
    raise DamagedRunError(
        f"{path} was edited after the run ({keys}its hash {mine} is not the run's "
        f"{report.config_hash or config_hash(report.config)})", "restore it, or use --overwrite to start afresh "
        "with the config given", f"restore it (the run's config is in {REPORT}), or train the edited config as a "
        f"run of its own: tiedlm train --config {path} --out {Path(run_dir).parent} --name {Path(run_dir).name}-edited")


def _config_data(run_dir: Path) -> dict | None:
    """config.yaml as stored, None when there is none; a damaged one is a DamagedRunError."""
    import yaml

    path = Path(run_dir) / CONFIG
    if not path.exists():
        return None
    fixes = ("use --overwrite to start afresh", "restore it, or retrain the run")
    try:  # read_yaml_text: a regular file of bounded size (a pipe put there would hang the read)
        data = load_yaml(read_yaml_text(path, "run config"), str(path))  # duplicate keys and alias bombs refused
    except ConfigError as exc:  # its problem only: the fix load_yaml gives is for a file the user writes
        raise DamagedRunError(f"{str(exc).split(' — ', 1)[0]} (the run folder is damaged)", *fixes) from None
    except (yaml.YAMLError, UnicodeDecodeError):
        raise DamagedRunError(f"{path} is not valid YAML (the run folder is damaged)", *fixes) from None
    if not isinstance(data, dict):
        raise DamagedRunError(f"{path} is not a tiedlm config", *fixes)
    return data


def existing_state(run_dir: Path, cfg: Config) -> str:
    """What to do with a run folder for config `cfg`: 'new', 'finished' (nothing to do), or 'resume'.

    A folder holding a different config is refused with the keys that differ."""
    run_dir = Path(run_dir)
    if not run_dir.exists():
        return "new"
    report = read_report(run_dir)
    old = _config_data(run_dir)  # as stored: a key of a newer tiedlm is a difference, not an error
    if old is None and report is None:
        leftovers = [p.name for p in run_dir.iterdir() if p.name != LOCK]
        if leftovers:
            raise RunError(f"{run_dir} exists but is not a tiedlm run (it holds {', '.join(sorted(leftovers)[:3])}) "
                           "— choose another --name, or --overwrite to replace it")
        return "new"
    if old is not None and (stored := _report_config(old)[0]) is not None:  # not rebuilt: a newer key, said below
        check_config_unedited(run_dir, stored, report)
    if old is not None:
        skip = operational_keys(cfg)
        differ = [k for k in diff_keys(with_added_keys(old), to_dict(cfg)) if k not in skip]
        if differ:
            shown = ", ".join(differ[:6]) + (f" and {len(differ) - 6} more" if len(differ) > 6 else "")
            raise ConfigMismatchError(f"{run_dir} holds a run with a different config ({shown} differ) — "
                                      "choose another --name or --seed, or --overwrite to start afresh", differ)
    return "finished" if report is not None and report.status == "finished" else "resume"
