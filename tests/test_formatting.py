"""The shared renderers: numbers, sizes, tables."""

import pytest

from tiedlm import formatting as f


@pytest.mark.parametrize("n, text", [(0, "0 B"), (1023, "1023 B"), (1536, "1.5 KiB"), (25_276_502_016, "23.5 GiB"),
                                     (2**50 * 27.9, "27.9 PiB"), (2**60 * 3, "3,072.0 PiB"), (None, "—")])
def test_format_bytes(n, text):
    assert f.format_bytes(n) == text


def test_numbers():
    assert f.fmt(1234567) == "1,234,567" and f.fmt(3.14159, 3) == "3.142" and f.fmt(float("nan")) == "—"
    assert f.fmt_signed(-0.5) == "−0.50" and f.fmt_count(929_280) == "929k" and f.fmt_p(0.0004) == "p<0.001"


def test_tables_align_and_escape():
    md = f.markdown_table(["a", "<unk>"], [["x|y", 1]])
    assert md.splitlines() == ["| a | &lt;unk&gt; |", "| --- | ---: |", "| x\\|y | 1 |"]
    text = f.text_table(["name", "n"], [["tied", "12"], ["untied", "3"]]).splitlines()
    assert text[0] == "name     n" and text[2] == "tied    12" and text[3] == "untied   3"


def test_params_table_has_one_row_per_piece_and_one_column_per_form():
    t = {"total": 10, "wte": 4, "lm_head": 0, "lm_head_bias": 0, "wpe": 2, "non_embedding": 4, "saved_by_tying": 4}
    u = {**t, "total": 14, "lm_head": 4, "saved_by_tying": 0}
    rows = f.params_rows({"tied": t, "untied": u})
    assert [r[0] for r in rows] == [label for label, _ in f.PARAM_ROWS]
    assert rows[0] == ["total (unique)", "10", "14"] and rows[2][1:] == ["0", "4"]
