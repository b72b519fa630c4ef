"""The README is a page a newcomer reads in five minutes: at most 150 lines, the CPU build of torch
advised before the set-up commands it applies to, the two set-up commands (byte for byte what
.ci/run runs) near the top, and a command on the reader's own data on the first screen."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"

MAIN_JOB = "pip install -e . && tiedlm compare --config configs/shakespeare.yaml --seeds 3"
TEST_COMMAND = "pip install -e '.[dev]' && python -m pytest -q -n 2"
CPU_TORCH = "pip install torch --index-url https://download.pytorch.org/whl/cpu"
FIRST_SCREEN = 40


def lines() -> list[str]:
    return README.read_text(encoding="utf-8").splitlines()


def line_of(needle: str) -> int:
    """The 1-based number of the first README line holding `needle`."""
    for n, line in enumerate(lines(), 1):
        if needle in line:
            return n
    raise AssertionError(f"README.md does not contain {needle!r}")


def test_at_most_150_lines():
    assert len(lines()) <= 150, f"README.md has {len(lines())} lines; move detail to docs/"


def test_the_set_up_commands_are_near_the_top_and_byte_identical_to_ci():
    text = lines()
    main, tests = line_of(MAIN_JOB), line_of(TEST_COMMAND)
    assert text[main - 1] == MAIN_JOB and text[tests - 1] == TEST_COMMAND, "set-up commands changed"
    assert main < tests <= FIRST_SCREEN, f"set-up commands at lines {main} and {tests}, after line {FIRST_SCREEN}"
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8").splitlines()
    assert ci[-1].replace("pip install -q ", "pip install ") == TEST_COMMAND, \
        ".ci/run's last line is not the README's test command"


def test_the_cpu_torch_advice_comes_before_the_commands_it_applies_to():
    assert line_of(CPU_TORCH) < line_of(MAIN_JOB), "the CPU build of torch must be advised before it is needed"


def test_your_data_is_on_the_first_screen():
    """A compare command on the main job's config that points data.path at the reader's own text."""
    pattern = re.compile(r"^tiedlm compare --config configs/shakespeare\.yaml --seeds 3 --set data\.path=\S+")
    found = [n for n, line in enumerate(lines(), 1) if pattern.match(line)]
    assert found, "README.md has no 'your data' command"
    assert found[0] <= FIRST_SCREEN, f"the first 'your data' command is at line {found[0]}, after line {FIRST_SCREEN}"


def test_no_thread_or_allocator_talk_on_the_front_page():
    text = README.read_text(encoding="utf-8").lower()
    for word in ("malloc", "page fault", "mkl_cbwr", "omp_", "gomp"):
        assert word not in text, f"README.md mentions {word!r}: that belongs in docs/"
