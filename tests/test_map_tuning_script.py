"""scripts/map_tuning.py: each cell's tied/untied effect at the best lr with the other key held,
and at the joint best, from a tuned sweep's tuning.json (written here by hand); each tie mode
against its cell's untied twin, in the record a tuned sweep or a tuned compare --config writes
(tuning.write_record: the tags of compare --config are tied, untied, projection, ...; a
sweep's are its grid points); and one line, exit 2, for a record it cannot use."""

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import script_module

ROOT = Path(__file__).resolve().parent.parent


def script():
    return script_module("map_tuning")


def point(lr, dropout, loss):
    return {"point": {"train.lr": lr, "model.dropout": dropout}, "label": f"lr={lr},dropout={dropout}",
            "validation_loss": loss}


def variant(tag, losses):
    points = [point(lr, d, loss) for (lr, d), loss in losses.items()]
    return {"variant": tag, "points": points, "chosen": min(points, key=lambda p: p["validation_loss"])}


RECORD = {"tuning": {"keys": ["train.lr", "model.dropout", "train.min_lr_ratio"][:2], "seeds": [0],
                     "config": {"train.lr": 0.003, "model.dropout": 0.0},
                     "variants": [
                         variant("v=512-tie_embeddings=true", {(1e-3, 0.0): 5.0, (3e-3, 0.0): 4.9, (3e-3, 0.2): 4.7}),
                         variant("v=512-tie_embeddings=false", {(1e-3, 0.0): 4.8, (3e-3, 0.0): 4.85, (3e-3, 0.2): 4.9}),
                         variant("v=2048-tie_embeddings=true", {(3e-3, 0.0): 5.5}),
                     ]}}


def test_each_cell_s_effect_held_and_joint_by_hand(tmp_path, capsys):
    mod = script()
    t = mod.table(RECORD)
    assert (t.other, t.held) == ("model.dropout", 0.0) and len(t.rows) == 1  # the 2048 cell has no untied twin
    r = t.rows[0]
    assert (r["cell"], r["variant"]) == ("v=512", "tie_embeddings=true")
    assert r["held"] == pytest.approx(math.expm1(4.9 - 4.8))  # tied's best at dropout 0 is lr 3e-3, untied's 1e-3
    assert r["joint"] == pytest.approx(math.expm1(4.7 - 4.8))  # tied chose dropout 0.2, untied stayed at 0
    assert r["joint_points"] == ("lr=0.003,dropout=0.2", "lr=0.001,dropout=0.0")
    (tmp_path / "tuning.json").write_text(json.dumps(RECORD))
    assert mod.main([str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert r["at"] == {0.2: pytest.approx(math.expm1(4.7 - 4.9))}  # both at dropout 0.2 (one lr each there)
    assert ("| v=512 | tie_embeddings=true | lr=0.003,dropout=0.2 | lr=0.001,dropout=0.0 | +10.52% | −18.13% | "
            "−9.52% | −20.03 points |") in out
    assert "| effect, best lr at model.dropout 0 | at 0.2 | effect, joint best |" in out


def test_a_folder_without_a_record_is_one_line_and_exit_2(tmp_path, capsys):
    assert script().main([str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "tuning.json" in err and "tuned sweep" in err


# ---------------------------------------------------------------- the record tiedlm writes


def lr_point(lr, loss):
    return {"point": {"train.lr": lr}, "label": f"lr={lr}", "validation_loss": loss,
            "validation_perplexity": math.exp(loss), "best_step": None, "runs": {"0": "x"}, "failed": []}


def lr_variant(tag, losses):
    points = [lr_point(lr, loss) for lr, loss in losses.items()]
    return {"variant": tag, "chosen": min(points, key=lambda p: p["validation_loss"]), "points": points,
            "axes": {"train.lr": sorted(losses)}, "extensions": {}, "edge": None, "bound": None}


def written(variants, axes, config):
    """A tuning.json as tuning.write_record lays it out."""
    return {"format": 1, "keys": [*axes, "train.min_lr", "train.min_lr_ratio"], "chosen": [], "runs": [],
            "tuning": {"keys": list(axes), "seeds": [0], "selected_on": "validation", "selection": "final weights",
                       "spec": {"axes": axes, "seeds": None, "extend": True, "extend_limit": 3, "shared_seeds": False},
                       "schedule": [], "variants": variants, "shared": None, "config": config, "joint": None,
                       "cost": {"runs": 0, "tokens": 0.0}}}


def test_an_lr_only_record_of_compare_config_shows_the_config_s_point_and_each_choice(tmp_path, capsys):
    """compare --config --tune train.lr=...: tags tied and untied, one key. Each variant at the
    config's lr, then each at its own choice."""
    rec = written([lr_variant("tied", {1e-3: 5.4, 3e-3: 5.3, 9e-3: 5.1}),
                   lr_variant("untied", {1e-3: 5.5, 3e-3: 5.2, 9e-3: 5.25})], {"train.lr": [1e-3, 3e-3]},
                  {"train.lr": 3e-3})
    (tmp_path / "tuning.json").write_text(json.dumps(rec))
    assert script().main([str(tmp_path)]) == 0
    out = capsys.readouterr().out
    at_config, joint = math.expm1(5.3 - 5.2), math.expm1(5.1 - 5.2)
    assert f"| - | tied | lr=0.009 | lr=0.003 | +{100 * at_config:.2f}% | −{-100 * joint:.2f}% | " in out
    assert "| effect, config's point (train.lr 0.003) | effect, joint best | moved by |" in out
    assert "tuning seed 0 only (train.lr tuned)" in out


def test_a_two_key_record_of_compare_config_has_its_row(tmp_path, capsys):
    """compare --config --tune train.lr=... --tune model.dropout=...: tags tied and untied."""
    rec = written([variant("tied", {(1e-3, 0): 5.0, (3e-3, 0): 4.9, (3e-3, 0.1): 4.7}),
                   variant("untied", {(1e-3, 0): 4.8, (3e-3, 0): 4.85, (3e-3, 0.1): 4.9})],
                  {"train.lr": [1e-3, 3e-3], "model.dropout": [0, 0.1]}, {"train.lr": 3e-3, "model.dropout": 0.0})
    (tmp_path / "tuning.json").write_text(json.dumps(rec))
    assert script().main([str(tmp_path / "tuning.json")]) == 0  # the file itself does as well as its folder
    out = capsys.readouterr().out
    assert ("| - | tied | lr=0.003,dropout=0.1 | lr=0.001,dropout=0 | +10.52% | −18.13% | −9.52% | "
            "−20.03 points |") in out


@pytest.mark.parametrize("tag, expected", [
    ("tied", ("", "tied", False)),
    ("untied", ("", "untied", True)),
    ("lowrank-r8", ("", "lowrank-r8", False)),
    ("soft-l1e-05", ("", "soft-l1e-05", False)),
    ("tied-matched-width", ("", "tied-matched-width", False)),
    ("n_embd=64-tie_embeddings=false", ("n_embd=64", "tie_embeddings=false", True)),
    ("vocab_size=128-tie_mode=lowrank-untie_rank=8", ("vocab_size=128", "tie_mode=lowrank, untie_rank=8", False)),
    ("tie_mode=untied-untie_rank=0", ("", "tie_mode=untied, untie_rank=0", True)),
    ("tie_mode=soft-tie_strength=0.1", ("", "tie_mode=soft, tie_strength=0.1", False)),
    ("weight_decay=1e-05-n_embd=32-tie_embeddings=true",
     ("weight_decay=1e-05, n_embd=32", "tie_embeddings=true", False)),
    ("n_embd=64", ("n_embd=64", "", None)),
])
def test_each_tag_tiedlm_writes_names_its_cell_and_tie(tag, expected):
    assert script().side(tag) == expected


def test_every_tie_mode_of_a_sweep_is_set_against_its_cell_s_untied_twin(tmp_path, capsys):
    """A sweep over a paired tying axis (configs/rank-dial.yaml) in two cells: a row per tie but
    untied; a cell with two untied variants has no one twin and is left out, as compare's grid does."""
    modes = {"tie_mode=tied-untie_rank=0": 5.0, "tie_mode=lowrank-untie_rank=8": 4.9,
             "tie_mode=projection-untie_rank=0": 4.95, "tie_mode=untied-untie_rank=0": 5.1}
    variants = [lr_variant(f"n_embd={d}-{m}", {1e-3: loss + d / 1000, 3e-3: loss}) for d in (32, 64)
                for m, loss in modes.items()]
    rec = written(variants, {"train.lr": [1e-3, 3e-3]}, {"train.lr": 3e-3})
    t = script().table(rec)
    assert [(r["cell"], r["variant"]) for r in t.rows] == [
        (f"n_embd={d}", m) for d in (32, 64) for m in ("tie_mode=tied, untie_rank=0", "tie_mode=lowrank, untie_rank=8",
                                                      "tie_mode=projection, untie_rank=0")]
    assert t.rows[1]["joint"] == pytest.approx(math.expm1(4.9 - 5.1))
    (tmp_path / "tuning.json").write_text(json.dumps(rec))
    assert script().main([str(tmp_path)]) == 0
    assert "| n_embd=64 | tie_mode=projection, untie_rank=0 | lr=0.003 | lr=0.003 | −13.93% | −13.93% |" \
        in capsys.readouterr().out
    two = written(variants + [lr_variant("n_embd=64-tie_mode=untied-untie_rank=4", {3e-3: 5.0})],
                  {"train.lr": [1e-3, 3e-3]}, {"train.lr": 3e-3})
    assert {r["cell"] for r in script().table(two).rows} == {"n_embd=32"}


def test_compare_config_s_tie_mode_and_matched_variants_each_get_a_row():
    rec = written([lr_variant("lowrank-r8", {3e-3: 4.9}), lr_variant("untied", {3e-3: 5.0}),
                   lr_variant("tied-matched", {3e-3: 4.8})], {"train.lr": [3e-3]}, {"train.lr": 3e-3})
    rows = script().table(rec).rows
    assert [r["variant"] for r in rows] == ["lowrank-r8", "tied-matched"]
    assert rows[1]["joint"] == pytest.approx(math.expm1(-0.2))


UNUSABLE = {
    "a list": ("[]", "holds a JSON list, not a tuning record"),
    "an empty object": ("{}", "is not a tuning record (it has no tuning)"),
    "null": ("null", "holds JSON null, not a tuning record"),
    "no variants": ('{"tuning": {"keys": ["train.lr"], "variants": []}}', "holds no tuned variants"),
    "a variant without points": ('{"tuning": {"variants": [{"variant": "tied"}]}}',
                                 "without its tag, points or choice"),
    "another format": ('{"format": 2, "tuning": {}}', "format 2"),
    "no untied twin": (json.dumps(written([lr_variant("n_embd=32-tie_embeddings=true", {3e-3: 5.0}),
                                           lr_variant("n_embd=64-tie_embeddings=false", {3e-3: 5.0})],
                                          {"train.lr": [3e-3]}, {})), "no tied variant with an untied twin"),
}


@pytest.mark.parametrize("name", sorted(UNUSABLE))
def test_a_record_it_cannot_use_is_one_line_and_exit_2(tmp_path, capsys, name):
    text, what = UNUSABLE[name]
    (tmp_path / "tuning.json").write_text(text)
    assert script().main([str(tmp_path)]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.count("\n") == 1
    assert what in captured.err and " — " in captured.err and str(tmp_path / "tuning.json") in captured.err


def test_a_list_or_bytes_that_are_not_utf8_give_no_traceback(tmp_path):
    for i, data in enumerate([b"[]", b"\xff\xfe{}"]):
        (tmp_path / str(i)).mkdir()
        (tmp_path / str(i) / "tuning.json").write_bytes(data)
        r = subprocess.run([sys.executable, str(ROOT / "scripts" / "map_tuning.py"), str(tmp_path / str(i))],
                           capture_output=True, text=True, timeout=60)
        assert r.returncode == 2 and "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1
        assert "map_tuning: " in r.stderr and "give the runs folder of a tuned sweep" in r.stderr
