"""scripts/map_tuning.py: each cell's tied/untied effect at the best lr with the other key held,
and at the joint best, from a tuned sweep's tuning.json (written here by hand)."""

import json
import math

import pytest

from tests.conftest import script_module


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
    other, held, rows = mod.cells(RECORD)
    assert (other, held) == ("model.dropout", 0.0) and len(rows) == 1  # the 2048 cell has no untied twin
    r = rows[0]
    assert r["cell"] == "v=512"
    assert r["held"] == pytest.approx(math.expm1(4.9 - 4.8))  # tied's best at dropout 0 is lr 3e-3, untied's 1e-3
    assert r["joint"] == pytest.approx(math.expm1(4.7 - 4.8))  # tied chose dropout 0.2, untied stayed at 0
    assert r["joint_points"] == ("lr=0.003,dropout=0.2", "lr=0.001,dropout=0.0")
    (tmp_path / "tuning.json").write_text(json.dumps(RECORD))
    assert mod.main([str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert r["at"] == {0.2: pytest.approx(math.expm1(4.7 - 4.9))}  # both at dropout 0.2 (one lr each there)
    assert "| v=512 | lr=0.003,dropout=0.2 | lr=0.001,dropout=0.0 | +10.52% | −18.13% | −9.52% | −20.03 points |" in out
    assert "| effect, best lr at model.dropout 0 | at 0.2 | effect, joint best |" in out


def test_a_folder_without_a_record_is_one_line_and_exit_2(tmp_path, capsys):
    assert script().main([str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "tuning.json" in err and "tuned sweep" in err
