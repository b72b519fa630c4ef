"""Numbers, sizes and tables as people read them: one renderer for each thing shown in more than
one place (a run's report.md, `tiedlm params`, the comparison's Markdown and terminal tables).
Pure functions of plain values; no tiedlm module is imported here."""

from __future__ import annotations

import json
import math
from typing import Any, Iterable

MISSING = "—"


def _is_number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def fmt(x: Any, digits: int = 2) -> str:
    """A number with `digits` decimals and thousands separators; ints without decimals; None and
    nan as a dash; an overflow (a perplexity past the largest float) as ∞; anything else as str()."""
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return MISSING
    if isinstance(x, float) and math.isinf(x):
        return "∞" if x > 0 else "−∞"
    if isinstance(x, bool):
        return str(x)
    if isinstance(x, int):
        return f"{x:,}"
    if isinstance(x, float):
        return f"{x:,.{digits}f}"
    return str(x)


def shown_text(text: str) -> str:
    """A value in a message: quoted with its escapes (a newline shows as \\n), cut when long, or
    "an empty value"."""
    if not text:
        return "an empty value"
    return json.dumps(text) if len(text) <= 60 else json.dumps(text[:40])[:-1] + f'..." ({len(text)} characters)'


def fmt_signed(x: Any, digits: int = 2) -> str:
    """+1.23 / −1.23 (a typographic minus)."""
    if not _is_number(x):
        return MISSING
    return f"{x:+.{digits}f}".replace("-", "−")


def percent(x: float | None, digits: int = 2) -> str:
    """A fraction as a signed percentage: −5.00% (a typographic minus); a dash for None."""
    return fmt_signed(x * 100, digits) + "%" if x is not None else MISSING


def fmt_int(x: Any) -> str:
    return f"{int(x):,}" if _is_number(x) else MISSING


def fmt_count(x: Any) -> str:
    """1234567 -> 1.23M."""
    if not _is_number(x):
        return MISSING
    for div, suffix in ((1e9, "B"), (1e6, "M"), (1e3, "k")):
        if abs(x) >= div:
            return f"{x / div:.3g}{suffix}"
    return f"{x:g}"


def format_bytes(n: Any) -> str:
    """Bytes in binary units: 512 B, 1.5 KiB, 23.5 GiB, 27.9 PiB."""
    if not _is_number(n):
        return MISSING
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024:
            return f"{int(n)} B" if unit == "B" else f"{n:,.1f} {unit}"
        n /= 1024
    return f"{n:,.1f} PiB"


def fmt_seconds(x: Any) -> str:
    if not _is_number(x):
        return MISSING
    if x >= 3600:
        return f"{x / 3600:.1f} h"
    if x >= 60:
        return f"{x / 60:.1f} min"
    return f"{x:.1f} s"


def fmt_p(p: float | None) -> str:
    if p is None:
        return MISSING
    return "p<0.001" if p < 0.001 else f"p={p:.3f}"


def p_only(p: float | None) -> str:
    """0.012 or <0.001, as a table's p column shows it: fmt_p without its 'p='; a dash for None."""
    return fmt_p(p)[1:].lstrip("=") if p is not None else MISSING


def markdown_table(header: list[str], rows: Iterable[list[Any]], align: str | None = None) -> str:
    """A GitHub Markdown table; align is one letter per column, l or r (default: first column
    left, the rest right)."""
    align = align or "l" + "r" * (len(header) - 1)
    sep = ["---:" if a == "r" else "---" for a in align]
    lines = ["| " + " | ".join(_md_cell(h) for h in header) + " |", "| " + " | ".join(sep) + " |"]
    lines += ["| " + " | ".join(_md_cell(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def _md_cell(c: Any) -> str:
    """A table cell: | would end the cell, and <unk> would be read as an HTML tag and vanish."""
    return str(c).replace("|", "\\|").replace("<", "&lt;").replace(">", "&gt;")


def text_table(header: list[str], rows: list[list[Any]], align: str | None = None) -> str:
    """Columns padded for a terminal, a dashed rule under the header."""
    align = align or "l" + "r" * (len(header) - 1)
    cells = [[str(c) for c in row] for row in [header, *rows]]
    widths = [max(len(row[i]) for row in cells) for i in range(len(header))]

    def line(row: list[str]) -> str:
        return "  ".join(c.rjust(w) if a == "r" else c.ljust(w) for c, w, a in zip(row, widths, align)).rstrip()

    return "\n".join([line(cells[0]), line(["-" * w for w in widths])] + [line(r) for r in cells[1:]])


# The parameter breakdown (model.count_params), one row per piece, in every table that shows it.
PARAM_ROWS = (
    ("total (unique)", "total"),
    ("E: wte (V×d)", "wte"),
    ("W_out's own: lm_head (0 tied; P, or A and B)", "lm_head"),
    ("lm_head bias", "lm_head_bias"),
    ("position embeddings: wpe", "wpe"),
    ("non-embedding", "non_embedding"),
    ("saved by tying (V×d less W_out's own)", "saved_by_tying"),
)


def params_rows(columns: dict[str, dict]) -> list[list[str]]:
    """Rows of PARAM_ROWS with one column per breakdown (`{"tied": {...}, "untied": {...}}`)."""
    return [[label, *(fmt_int(p.get(key)) for p in columns.values())] for label, key in PARAM_ROWS]


def params_markdown(columns: dict[str, dict]) -> str:
    return markdown_table(["piece", *columns], params_rows(columns))


def params_text(columns: dict[str, dict]) -> str:
    return text_table(["", *columns], params_rows(columns))
