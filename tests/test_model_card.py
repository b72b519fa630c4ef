"""The model card `tiedlm export` writes (tiedlm/export/card.py): README.md with front matter the hub's
own parser reads (the test perplexity in its model-index), the tie and how the export checked it,
the parameters, data, budget, and the comparison that named the run, or a line saying none was found."""

import pytest

from tiedlm import runs
from tiedlm.compare import compare_runs

from .conftest import comparison_dir
from tiedlm.export import export_run
from tiedlm.export.card import CARD
from tiedlm.train import train_run


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    from tiedlm.config import load_config

    from .conftest import TINY, train_tied_untied

    root = tmp_path_factory.mktemp("card")
    train_tied_untied(root)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TIEDLM_CACHE", str(root / "cache"))
        lone = train_run(load_config(None, TINY), out=root / "alone", name="lone", progress=False)
    return root, lone


def test_the_card_holds_the_tie_the_scores_and_the_comparison(trained, tmp_path):
    from huggingface_hub import ModelCard

    root, _ = trained
    compare_runs([root / "runs" / "ttrue", root / "runs" / "tfalse"], runs_dir=root / "runs")
    result = export_run(root / "runs" / "ttrue", tmp_path / "hf")
    card = ModelCard.load(tmp_path / "hf" / CARD)
    report = runs.read_report(root / "runs" / "ttrue")
    (evaluation,) = card.data.eval_results
    assert evaluation.metric_type == "perplexity"
    assert evaluation.metric_value == pytest.approx(report.final["test"]["perplexity"], abs=1e-4)
    assert card.data.library_name == "transformers" and "tied" in card.data.tags
    text = card.text
    assert "**tied** (`model.tie_mode: tied`), written as one matrix" in text
    assert result.verified and f"max |logit difference| {result.max_abs_diff:.2e}" in text
    assert f"| total | {report.params['total']:,} |" in text and f"{report.steps:,} steps" in text
    assert f"`{comparison_dir(root / 'runs') / 'comparison.json'}`" in text and "untied (1 seed), tied (1 seed)" in text


def test_an_untied_export_and_a_run_never_compared_say_so(trained, tmp_path):
    root, lone = trained
    export_run(lone, tmp_path / "lone")
    text = (tmp_path / "lone" / CARD).read_text()
    assert "No comparison naming this run was found beside it" in text
    export_run(root / "runs" / "tfalse", tmp_path / "untied")
    text = (tmp_path / "untied" / CARD).read_text()
    assert "**untied**" in text and "written as two matrices" in text
