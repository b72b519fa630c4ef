"""Names a module uses but never binds (a NameError waiting in an error path) and imports it never
uses (a dependency the reader is told of that is not there), found by pyflakes over the package.
An import made only to check that a library is installed says so with `# noqa`."""

from __future__ import annotations

from pathlib import Path

import pytest

pyflakes_api = pytest.importorskip("pyflakes.api")
from pyflakes import messages  # noqa: E402

PACKAGE = Path(__file__).resolve().parent.parent / "tiedlm"
CHECKED = (messages.UndefinedName, messages.UndefinedLocal, messages.UnusedImport, messages.RedefinedWhileUnused,
           messages.ImportStarUsed)


class _Collect:
    def __init__(self):
        self.found = []

    def flake(self, message):
        self.found.append(message)

    def unexpectedError(self, filename, msg):  # noqa: N802 (pyflakes' reporter interface)
        self.found.append(f"{filename}: {msg}")

    def syntaxError(self, filename, msg, lineno, offset, text):  # noqa: N802
        self.found.append(f"{filename}:{lineno}: {msg}")


def _findings(path: Path) -> list[str]:
    reporter = _Collect()
    pyflakes_api.check(path.read_text(encoding="utf-8"), str(path), reporter)
    lines = path.read_text(encoding="utf-8").splitlines()
    out = []
    for m in reporter.found:
        if isinstance(m, str):
            out.append(m)
        elif isinstance(m, CHECKED) and "noqa" not in lines[m.lineno - 1]:
            out.append(f"{path.name}:{m.lineno}: {m.message % m.message_args}")
    return out


def test_every_name_is_bound_and_every_import_used():
    found = [f"{path.relative_to(PACKAGE.parent)}: {f}" for path in sorted(PACKAGE.rglob("*.py")) for f in _findings(path)]
    assert not found, "\n".join(found)


def test_the_check_sees_an_unbound_name_and_an_unused_import(tmp_path):
    bad = tmp_path / "probe.py"
    bad.write_text("import os\nimport sys  # noqa: F401\n\n\ndef f():\n    raise ConfigError('x')\n", encoding="utf-8")
    found = _findings(bad)
    assert any("undefined name 'ConfigError'" in f for f in found)
    assert any("'os' imported but unused" in f for f in found)
    assert not any("'sys'" in f for f in found) and len(found) == 2  # an import marked noqa is left alone
