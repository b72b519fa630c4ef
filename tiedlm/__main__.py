from .process import die_with_parent

die_with_parent()  # a --jobs child ends with the process that started it (parallel.py)

from .cli import app  # noqa: E402  (after: an orphan that is told to go need not import the CLI)

app(prog_name="tiedlm")
