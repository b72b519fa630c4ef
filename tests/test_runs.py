"""The run folder's report schema: what tiedlm 0.1 wrote still reads, nothing is lost on rewrite,
and report.json and report.md are written together."""

import json
from pathlib import Path

import pytest

from tiedlm import runs
from tiedlm.config import Config

FIXTURE = Path(__file__).parent / "fixtures" / "report-0.1.json"  # written by tiedlm 0.1 (base.yaml, tied)


def test_a_report_written_by_0_1_reads_into_the_schema_and_back_unchanged(tmp_path):
    original = json.loads(FIXTURE.read_text())
    (tmp_path / runs.REPORT).write_text(FIXTURE.read_text())
    report = runs.read_report(tmp_path)
    assert report.extra == {}  # every key 0.1 wrote is a field of the schema
    assert report.status == "finished" and report.seed == 0 and report.config_hash == original["config_hash"]
    assert report.final["validation"]["perplexity"] == original["final"]["validation"]["perplexity"]
    again = report.to_json()
    assert again == original  # the same keys, values and order


def test_keys_of_another_version_survive_a_rewrite(tmp_path):
    data = {**json.loads(FIXTURE.read_text()), "best_step": 500, "future": {"x": 1}}
    report = runs.RunReport.from_json(data)
    assert report.extra == {"best_step": 500, "future": {"x": 1}}
    runs.RunRecord(tmp_path, report).write(status="interrupted")
    written = json.loads((tmp_path / runs.REPORT).read_text())
    assert written["best_step"] == 500 and written["future"] == {"x": 1} and written["status"] == "interrupted"


def test_a_record_writes_json_and_markdown_together_and_refuses_unknown_fields(tmp_path):
    record = runs.RunRecord(tmp_path, runs.RunReport(name="r", seed=3, config=Config()))
    record.write(status="diverged", error="non-finite loss (nan) at step 7")
    assert json.loads((tmp_path / runs.REPORT).read_text())["status"] == "diverged"
    md = (tmp_path / runs.REPORT_MD).read_text()
    assert "Status: **diverged** — non-finite loss (nan) at step 7" in md and "Tying: **tied**" in md
    with pytest.raises(AttributeError, match="no field 'stauts'"):
        record.write(stauts="finished")


def test_report_md_of_a_0_1_report_shows_its_numbers():
    md = runs.render_report_md(runs.RunReport.from_json(json.loads(FIXTURE.read_text())))
    original = json.loads(FIXTURE.read_text())
    assert f"{original['final']['validation']['perplexity']:,.2f}" in md
    assert f"| total (unique) | {original['params']['total']:,} |" in md
    assert "not a bound on this split" in md  # the floor is an expectation, never called a bound


def test_a_folder_written_before_keys_were_added_resumes(tiny, tmp_path):
    """config.yaml as an older tiedlm wrote it lacks the keys added since (ADDED_KEYS): they read at
    their "as before" values, so the folder resumes instead of holding "a different config"."""
    import yaml

    from tiedlm.config.identity import ADDED_KEYS
    from tiedlm.errors import ConfigMismatchError, Interrupted
    from tiedlm.train import train_run

    cfg = tiny()
    with pytest.raises(Interrupted):
        train_run(cfg, out=tmp_path, name="old", progress=False, stop_after_step=4)
    path = tmp_path / "old" / runs.CONFIG
    stored = yaml.safe_load(path.read_text())
    for key in ("train.warmup", "train.fsdp_init", "model.tie_strength", "eval.also"):
        section, leaf = key.split(".")
        assert stored[section].pop(leaf) == ADDED_KEYS[key]
    path.write_text(yaml.safe_dump(stored))
    assert runs.existing_state(tmp_path / "old", cfg) == "resume"
    with pytest.raises(ConfigMismatchError, match="train.warmup"):
        runs.existing_state(tmp_path / "old", tiny("train.warmup=0.1"))
