"""model.rope_theta is bounded when the config is read: a value at which the rotary embedding
degenerates (1 or below; so small that its float32 frequencies overflow to nan; so large that
they vanish) is refused in one line naming the key, the bound and the usual values, instead of
training into a nan that is then blamed on the learning rate. model.norm_eps likewise below what
float32 holds."""

import pytest
import torch
from typer.testing import CliRunner

from tiedlm.config.checks import NORM_EPS_MIN, ROPE_THETA_MAX
from tiedlm.cli import app
from tiedlm.config import load_config
from tiedlm.errors import ConfigError
from tiedlm.model.blocks import rotary_tables

from .conftest import TINY

runner = CliRunner()


def finite(theta: float) -> bool:
    cos, sin = rotary_tables(8, 16, theta)
    return bool(torch.isfinite(cos).all() and torch.isfinite(sin).all())


def test_the_bound_is_where_the_tables_break():
    """What the bound is for: 1e-300 makes nan at position 0 (θ rounds to 0 in float32, inv_freq to
    inf, 0·inf = nan); at float32's largest value every pair but the first stops turning."""
    assert not finite(1e-300)
    assert finite(1.0 + 1e-6) and finite(10000.0) and finite(float(torch.finfo(torch.float32).max) * 0.99)
    assert ROPE_THETA_MAX == float(torch.finfo(torch.float32).max)
    _, sin = rotary_tables(8, 16, ROPE_THETA_MAX * 2)
    assert torch.count_nonzero(sin[:, 1:]) == 0  # only the first pair turns
    assert NORM_EPS_MIN == float(torch.finfo(torch.float32).tiny)


@pytest.mark.parametrize("theta", ["1e-300", "0.5", "1", "-3", "1e39"])
def test_train_refuses_a_degenerate_rope_theta(theta, tiny_yaml, tmp_path):
    out = tmp_path / "runs"
    result = runner.invoke(app, ["train", "--config", str(tiny_yaml), "--out", str(out), "--quiet",
                                 "--set", "model.arch=llama", "--set", f"model.rope_theta={theta}"])
    lines = (result.stderr or "").strip().splitlines()
    assert result.exit_code == 2, result.output
    assert len(lines) == 1 and "Traceback" not in result.output, result.output
    assert lines[0].startswith(f"tiedlm: error: model.rope_theta must be greater than 1 and below 3.4e38, got {theta}"
                               if theta in ("0.5", "1") else "tiedlm: error: model.rope_theta must be greater than 1")
    assert "— use 10000 (Llama 2) or 500000 (Llama 3), the usual values" in lines[0]
    assert not out.exists()


@pytest.mark.parametrize("theta", ["1.5", "10000", "500000", "1e7"])
def test_usual_and_small_but_sound_values_pass(theta):
    assert load_config(None, TINY + ["model.arch=llama", f"model.rope_theta={theta}"]).model.rope_theta == float(theta)


@pytest.mark.parametrize("arch", ["gpt2", "llama"])
def test_norm_eps_below_what_float32_holds_is_refused(arch):
    with pytest.raises(ConfigError, match=r"model.norm_eps must be at least 1.2e-38 .*got 1e-300 — norms use 1e-5"):
        load_config(None, TINY + [f"model.arch={arch}", "model.norm_eps=1e-300"])
    assert load_config(None, TINY + [f"model.arch={arch}", "model.norm_eps=1e-12"]).model.norm_eps == 1e-12


def test_a_tuning_grid_never_steps_past_the_bounds_the_config_check_sets():
    """A grid at rope_theta 2 extended downwards goes halfway to 1, never to 1 or below; norm_eps's
    floor is float32's smallest normal number, as the check's."""
    from tiedlm.config.checks import NORM_EPS_MIN
    from tiedlm.experiment.tuning_spec import BOUNDS, extend_value

    low = extend_value([2.0, 4.0], 2.0, -1, False, BOUNDS["model.rope_theta"])
    assert low is not None and 1.0 < low < 2.0
    assert BOUNDS["model.norm_eps"][0] == NORM_EPS_MIN
