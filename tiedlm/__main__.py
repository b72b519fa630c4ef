from .device import set_thread_env

set_thread_env()  # before anything imports torch: its OpenMP pool reads the variables once, at load

from .process import die_with_parent  # noqa: E402

die_with_parent()  # a --jobs child ends with the process that started it (parallel.py)

from .cli import app  # noqa: E402  (after: an orphan that is told to go need not import the CLI)

app(prog_name="tiedlm")
