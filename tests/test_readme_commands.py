"""Every command the README shows runs, as a user types it, in a folder holding only the
repository's configs (a fresh clone's, offline), scaled down by budget overrides: the training
budget, the evaluation slices and the BPE vocabulary shrink; nothing else of the command changes.
The README's own set-up commands (pip) are tests/test_readme.py's."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT
from .conftest import comparison_dir

README = ROOT / "README.md"
TIEDLM = [sys.executable, "-m", "tiedlm"]
# what shrinks: the budget and what scores it, never the command's own options
SMALL = ["train.max_tokens=4096", "train.warmup_steps=1", "train.eval_every=1", "train.eval_tokens=512",
         "data.max_eval_tokens=2048",
         "train.checkpoint_every=2", "eval.buckets=[]"]
SMALL_FROM_SCRATCH = SMALL + ["tokenizer.vocab_size=300"]  # a model with a tokenizer of its own (not init_from)
SMALL_ADAPTATION = SMALL + ["eval.also={path: builtin:shakespeare, max_eval_tokens: 2048}"]  # the old domain's slice


def readme_commands() -> list[str]:
    """The tiedlm commands of the README's bash blocks, in order (`pip install ... && tiedlm ...`
    gives its tiedlm part; the test command is left to tests/test_readme.py)."""
    text = README.read_text(encoding="utf-8")
    out = []
    for block in re.findall(r"```bash\n(.*?)```", text, flags=re.S):
        for line in block.splitlines():
            line = line.split("&&")[-1].strip()
            if line.startswith("tiedlm "):
                out.append(line)
    return out


def test_the_readme_s_commands_are_the_ones_tested_here():
    """A command added to the README without a test here fails this test."""
    assert readme_commands() == [c for group in GROUPS.values() for c in group]


GROUPS = {
    "main job and your data": [
        "tiedlm compare --config configs/shakespeare.yaml --seeds 3",
        "tiedlm compare --config configs/shakespeare.yaml --seeds 3 --set data.path=my_corpus.txt",
        "tiedlm compare --config configs/shakespeare.yaml --seeds 3 --set data.path=my_texts/",
    ],
    "your model": [
        "tiedlm params --config configs/smollm2-135m.yaml",
        "tiedlm compare --config configs/smollm2-mini.yaml --seeds 3 --jobs auto",
    ],
    "from a pretrained model": [
        "tiedlm train --config configs/shakespeare.yaml --set name=pretrained --out runs/adapt",
        "tiedlm export runs/adapt/pretrained-s0 --out runs/adapt/export",
        "tiedlm compare --config configs/adapt-pydoc.yaml --seeds 3 --jobs auto --out runs/adapt",
    ],
}


def clone_like(tmp_path: Path) -> Path:
    """A working folder as a fresh clone gives it: the configs, and the user's own text the README's
    'your data' commands name (a file, and a folder of files)."""
    from tiedlm.data.builtin import shakespeare_text

    work = tmp_path / "clone"
    work.mkdir()
    (work / "configs").symlink_to(ROOT / "configs")
    lines = [line for line in shakespeare_text().splitlines() if line.strip()]
    (work / "my_corpus.txt").write_text("\n".join(lines[:4000]) + "\n", encoding="utf-8")
    (work / "my_texts").mkdir()
    for i in range(3):
        (work / "my_texts" / f"part{i}.txt").write_text("\n".join(lines[4000 + 1500 * i:5500 + 1500 * i]) + "\n",
                                                       encoding="utf-8")
    return work


def run(command: str, work: Path) -> subprocess.CompletedProcess:
    args = shlex.split(command)[1:]
    if args[0] in ("train", "compare"):
        small = SMALL_ADAPTATION if "adapt-pydoc" in command else SMALL_FROM_SCRATCH
        args += [a for s in small for a in ("--set", s)]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TIEDLM_CACHE": str(work.parent / "cache"),
           "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    return subprocess.run(TIEDLM + args, cwd=work, env=env, capture_output=True, text=True, timeout=600)


@pytest.mark.parametrize("group", list(GROUPS))
def test_each_readme_command_runs_in_a_fresh_clone_offline(group, tmp_path):
    work = clone_like(tmp_path)
    for command in GROUPS[group]:
        r = run(command, work)
        assert r.returncode == 0, f"{command}\n{r.stderr[-3000:]}"
        assert "Traceback" not in r.stderr
        if command.startswith("tiedlm compare"):
            assert re.search(r"^tied +3 ", r.stdout, flags=re.M), r.stdout[-2000:]  # the verdict's table row
    if group == "from a pretrained model":
        assert (work / "runs" / "adapt" / "export" / "config.json").is_file()
        assert (comparison_dir(work / "runs" / "adapt") / "comparison.md").is_file()
        assert not [p for p in (work / "runs").iterdir() if p.name.startswith("compare")]  # nothing else compared
