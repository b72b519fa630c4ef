"""`datasets`' own progress bars follow tiedlm's: nothing when progress is off or stderr is not a
terminal, and on a terminal a bar that erases itself, so that an error that follows stands alone.
Offline, through the `text` builder on a local file (a fresh cache each test, so the builder runs)."""

import io

import datasets
import pytest
from typer.testing import CliRunner

from tiedlm.cli import app
from tiedlm.config import load_config
from tiedlm.data import sources


def _text_source(tmp_path):
    f = tmp_path / "corpus.txt"
    f.write_text("".join(f"line {i} of the corpus\n" for i in range(20)), encoding="utf-8")
    d = load_config(None, ["train.max_steps=1", "data.path=text", f"data.data_files={f}"]).data
    return sources.resolve_source(d), d


class _Terminal(io.StringIO):
    def isatty(self):
        return True


@pytest.mark.parametrize("progress", [True, False])
def test_no_datasets_bar_when_stderr_is_not_a_terminal(tmp_path, capsys, progress):
    source, d = _text_source(tmp_path)
    assert sources.load_raw(source, d, progress)["train"].num_rows == 20
    assert "Generating" not in capsys.readouterr().err


def test_on_a_terminal_the_bar_shows_and_erases_itself(tmp_path, monkeypatch):
    source, d = _text_source(tmp_path)
    before = datasets.are_progress_bars_disabled(), vars(datasets.utils.tqdm)["__init__"]
    terminal = _Terminal()
    monkeypatch.setattr("sys.stderr", terminal)
    sources.load_raw(source, d, progress=True)
    written = terminal.getvalue()
    assert "Generating train split" in written  # progress is shown where someone watches
    assert written.rsplit("\r", 1)[-1].strip() == ""  # and nothing of it is left on the line
    assert (datasets.are_progress_bars_disabled(), vars(datasets.utils.tqdm)["__init__"]) == before


def test_an_error_after_loading_is_the_only_line_on_stderr(tmp_path):
    f = tmp_path / "corpus.txt"
    f.write_text("one line\nanother line\n", encoding="utf-8")
    config = tmp_path / "c.yaml"
    config.write_text(f"train: {{max_steps: 1}}\ndata: {{path: {f}, text_column: nope}}\n", encoding="utf-8")
    r = CliRunner().invoke(app, ["data", "--config", str(config)])  # `data` shows progress always
    assert r.exit_code == 2, r.output
    assert r.stderr.strip().splitlines() == [r.stderr.strip()], r.stderr
    assert r.stderr.startswith("tiedlm: error: ") and "has no column 'nope'" in r.stderr
