"""The README and the pages in docs/ stay true to the repository: every relative link (and its
#anchor) resolves, every `module.function` they name is defined there, every repository path they
name exists, every figure keeps its provenance, and the README stays short, with the two set-up
commands that .ci/run runs."""

import ast
import re
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "tiedlm"
README = ROOT / "README.md"
DOCS_INDEX = ROOT / "docs" / "README.md"
# the reference pages in docs/, the studies in docs/studies/
PAGES = [README, *sorted((ROOT / "docs").rglob("*.md"))]

README_MAX_LINES = 150
MAIN_JOB = "pip install -e . && tiedlm compare --config configs/shakespeare.yaml --seeds 3"

# Code spans that read like module.attr but are neither a module reference nor a config key:
# fields of a run's report.json.
NOT_MODULE_REFS = {"data.carving"}
# module.EXT code spans are file names (`config.yaml`, `model.safetensors`), not references;
# module.py is a module's file and must exist.
FILE_SUFFIXES = {"yaml", "yml", "json", "jsonl", "md", "png", "csv", "txt", "safetensors", "pt",
                 "npy", "sh", "sbatch", "out", "tmp", "toml", "parquet", "gz", "tiedlm"}
REPO_DIRS = ("tiedlm", "tests", "scripts", "configs", "docs")


def ids(paths):
    return [str(p.relative_to(ROOT)) for p in paths]


def split_fences(text: str) -> tuple[str, str]:
    """(prose, code): the text outside fenced code blocks, and the text inside them (each kept
    line for line, the other side blanked, so that line numbers stay true)."""
    prose, code, fence = [], [], False
    for line in text.split("\n"):
        if line.lstrip().startswith("```"):
            fence = not fence
            prose.append("")
            code.append("")
        elif fence:
            prose.append("")
            code.append(line)
        else:
            prose.append(line)
            code.append("")
    return "\n".join(prose), "\n".join(code)


CODE_SPAN = re.compile(r"(`+)(.+?)\1", re.S)


def code_spans(prose: str) -> list[str]:
    return [" ".join(m.group(2).split()) for m in CODE_SPAN.finditer(prose)]


def links(prose: str) -> list[str]:
    """Targets of markdown links and images, outside code."""
    text = CODE_SPAN.sub(lambda m: " " * len(m.group(0)), prose)
    return [m.group(1) for m in re.finditer(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)", text)]


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: the rendered text, lower-cased, punctuation dropped,
    spaces made hyphens."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link's text
    text = re.sub(r"<[^>]+>", "", text).replace("`", "").replace("*", "")
    return re.sub(r"[^\w\- ]", "", text.strip().lower()).replace(" ", "-")


@cache
def anchors(path: Path) -> frozenset[str]:
    prose, _ = split_fences(path.read_text(encoding="utf-8"))
    seen: dict[str, int] = {}
    found = set()
    for line in prose.split("\n"):
        m = re.match(r" {0,3}#{1,6}\s+(.*?)\s*#*\s*$", line)
        if not m:
            continue
        base = slug(m.group(1))
        n = seen.get(base, 0)
        seen[base] = n + 1
        found.add(base if n == 0 else f"{base}-{n}")
    return frozenset(found)


# ------------------------------------------------------------------------------- links


@pytest.mark.parametrize("page", PAGES, ids=ids(PAGES))
def test_every_relative_link_resolves(page):
    prose, _ = split_fences(page.read_text(encoding="utf-8"))
    bad = []
    for target in links(prose):
        if re.match(r"[a-z][a-z0-9+.-]*:", target, re.I):  # http:, https:, mailto:
            continue
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists():
            bad.append(f"{target}: {dest.relative_to(ROOT) if dest.is_relative_to(ROOT) else dest} does not exist")
        elif anchor and (dest.suffix != ".md" or anchor not in anchors(dest)):
            bad.append(f"{target}: no heading in {dest.relative_to(ROOT)} has the anchor #{anchor}")
    assert not bad, f"{page.relative_to(ROOT)}:\n" + "\n".join(bad)


def test_the_slugs_are_githubs():
    assert slug("As many seeds as the question needs: `--seeds auto`") == \
        "as-many-seeds-as-the-question-needs---seeds-auto"
    assert slug("Each variant at its own setting: tuning") == "each-variant-at-its-own-setting-tuning"
    assert slug("Into the ecosystem: transformers, sampling, TensorBoard") == \
        "into-the-ecosystem-transformers-sampling-tensorboard"
    assert slug("One run on several processes (DDP)") == "one-run-on-several-processes-ddp"
    assert slug("`tiedlm data --config X`") == "tiedlm-data---config-x"


def linked_pages(page: Path) -> set[Path]:
    prose, _ = split_fences(page.read_text(encoding="utf-8"))
    return {(page.parent / t.partition("#")[0]).resolve() for t in links(prose)
            if not t.startswith("#") and not re.match(r"[a-z][a-z0-9+.-]*:", t, re.I)}


def test_every_docs_page_is_in_the_index_and_the_readme_links_the_index():
    """docs/README.md is the index: it links every page in docs/ and docs/studies/, and the README
    links it."""
    assert DOCS_INDEX.resolve() in linked_pages(README), "README.md does not link docs/README.md"
    indexed = linked_pages(DOCS_INDEX)
    missing = [str(p.relative_to(ROOT)) for p in PAGES[1:] if p != DOCS_INDEX and p.resolve() not in indexed]
    assert not missing, f"docs pages the index docs/README.md does not link: {missing}"


def test_the_index_splits_reference_from_studies():
    """The index has two headed lists: the reference pages (docs/*.md) under "Reference" and the
    studies (docs/studies/*.md) under "Studies"."""
    text = DOCS_INDEX.read_text(encoding="utf-8")
    heads = [m.start() for m in re.finditer(r"^## (Reference|Studies)\s*$", text, re.M)]
    assert len(heads) == 2, "docs/README.md needs a '## Reference' and a '## Studies' section"
    ref_at = text.index("## Reference")
    studies_at = text.index("## Studies")
    assert ref_at < studies_at
    reference, studies = text[ref_at:studies_at], text[studies_at:]
    for page in PAGES[1:]:
        if page == DOCS_INDEX:
            continue
        rel = page.relative_to(ROOT / "docs").as_posix()
        if rel.startswith("studies/"):
            assert f"]({rel})" in studies and f"]({rel})" not in reference, rel
        else:
            assert f"]({rel})" in reference and f"]({rel})" not in studies, rel


# ------------------------------------------------------------------------------- module references


@cache
def config_keys() -> frozenset[str]:
    from tiedlm.config import ALL_KEYS  # no torch

    return frozenset(ALL_KEYS)


def top_level_modules() -> set[str]:
    return {p.stem for p in PACKAGE.glob("*.py") if p.stem != "__init__"} | \
        {p.parent.name for p in PACKAGE.glob("*/__init__.py")}


@cache
def definitions(path: Path) -> dict[str, ast.AST]:
    """The names a module defines at its top level (inside top-level if/try blocks too): functions,
    classes, assignments, imports; a package's lazy exports (`_EXPORTS`, `__all__`)."""
    names: dict[str, ast.AST] = {}

    def visit(body):
        for node in body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names[node.name] = node
            elif isinstance(node, (ast.Assign, ast.AnnAssign)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                for t in targets:
                    for n in ast.walk(t):
                        if isinstance(n, ast.Name):
                            names[n.id] = node
                            if n.id in ("_EXPORTS", "__all__"):
                                for c in ast.walk(node.value):
                                    if isinstance(c, ast.Constant) and isinstance(c.value, str):
                                        names.setdefault(c.value, node)
            elif isinstance(node, (ast.Import, ast.ImportFrom)):
                for a in node.names:
                    names[(a.asname or a.name).split(".")[0]] = node
            elif isinstance(node, ast.If):
                visit(node.body)
                visit(node.orelse)
            elif isinstance(node, ast.Try):
                visit(node.body)
                for h in node.handlers:
                    visit(h.body)
                visit(node.orelse)
                visit(node.finalbody)

    visit(ast.parse(path.read_text(encoding="utf-8")).body)
    return names


def resolve(dotted: str) -> str | None:
    """None when `dotted` (tiedlm's own modules, below the package) names a module or a name
    defined in one; else why not."""
    parts = dotted.split(".")
    where = PACKAGE
    for i, part in enumerate(parts):
        if (where / part / "__init__.py").exists():
            where = where / part
            continue
        module = where / f"{part}.py"
        if module.exists():
            rest = parts[i + 1:]
        else:
            module, rest = where / "__init__.py", parts[i:]
        if not rest:
            return None
        defs = definitions(module)
        if rest[0] not in defs:
            return f"{module.relative_to(ROOT)} defines no {rest[0]!r}"
        node = defs[rest[0]]
        if len(rest) > 1 and isinstance(node, ast.ClassDef):
            members = set()
            for n in node.body:
                if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                    members.add(n.name)
                elif isinstance(n, (ast.Assign, ast.AnnAssign)):
                    targets = n.targets if isinstance(n, ast.Assign) else [n.target]
                    members |= {t.id for t in targets if isinstance(t, ast.Name)}
            if rest[1] not in members:
                return f"{rest[0]} in {module.relative_to(ROOT)} has no {rest[1]!r}"
        return None
    return None


DOTTED = re.compile(r"^([A-Za-z_]\w*(?:\.[A-Za-z_]\w*)+)(?:\(.*\))?$")


def module_references(span: str) -> str | None:
    """The dotted name a code span refers to in tiedlm, or None when it is something else: a config
    key (`train.lr`), a file name (`config.yaml`), another library (`torch.compile`)."""
    m = DOTTED.match(span)
    if not m:
        return None
    name = m.group(1)
    parts = name.split(".")
    if parts[-1] in FILE_SUFFIXES or parts[-1] == "py" or name in NOT_MODULE_REFS:
        return None
    if name in config_keys() or any(k.startswith(name + ".") for k in config_keys()):
        return None
    if parts[0] == "tiedlm":
        parts = parts[1:]
    elif parts[0] not in top_level_modules():
        return None
    return ".".join(parts) if parts else None


def test_config_keys_and_file_names_are_not_module_references():
    assert module_references("train.lr") is None
    assert module_references("model.n_embd") is None
    assert module_references("data.path") is None
    assert module_references("data.synthetic") is None
    assert module_references("config.yaml") is None
    assert module_references("model.safetensors") is None
    assert module_references("torch.compile") is None
    assert module_references("tokenizers.Tokenizer.from_file") is None
    assert module_references("experiment.jobs.train_jobs") == "experiment.jobs.train_jobs"
    assert module_references("model.lm_loss(fused=False)") == "model.lm_loss"
    assert module_references("tiedlm.config.ALL_KEYS") == "config.ALL_KEYS"
    assert module_references("compare.stats.paired_t") == "compare.stats.paired_t"


def test_resolve_tells_defined_from_undefined():
    assert resolve("experiment.jobs.train_jobs") is None
    assert resolve("config.checks.check_run_name") is None
    assert resolve("config.ALL_KEYS") is None
    assert resolve("load_config") is None  # tiedlm's lazy export
    assert resolve("compare.stats") is None
    assert resolve("runs.RunReport") is None
    assert resolve("train.train_jobs") is not None
    assert resolve("config.naming.check_run_name") is not None


def path_tokens(text: str) -> list[str]:
    """Repository paths (tiedlm/…, tests/…, scripts/…, configs/…, docs/…) in a piece of code."""
    found = []
    for token in re.split(r"[\s\"'`,;()]+", text):
        token = token.rstrip(".:")
        if re.match(rf"^(?:{'|'.join(REPO_DIRS)})/[\w./-]*$", token):
            found.append(token)
    return found


@pytest.mark.parametrize("page", PAGES, ids=ids(PAGES))
def test_every_module_function_and_path_named_resolves(page):
    prose, code = split_fences(page.read_text(encoding="utf-8"))
    spans = code_spans(prose)
    bad = []
    for span in spans:
        name = module_references(span)
        if name is not None and (why := resolve(name)):
            bad.append(f"`{span}`: {why}")
        if re.fullmatch(r"\w+\.py", span) and not any(
                (d / span).exists() for d in [PACKAGE, *PACKAGE.glob("*/"), ROOT / "scripts"]):
            bad.append(f"`{span}`: no such module in tiedlm/ (or script in scripts/)")
    for path in path_tokens(" ".join(spans) + "\n" + code):
        if not (ROOT / path).exists():
            bad.append(f"{path}: does not exist")
    assert not bad, f"{page.relative_to(ROOT)}:\n" + "\n".join(bad)


# ------------------------------------------------------------------------------- figures


@pytest.mark.parametrize("page", PAGES, ids=ids(PAGES))
def test_every_figure_keeps_its_provenance(page):
    """A figure's section, up to the figure, names the command or config that made it and the
    machine it ran on."""
    text = page.read_text(encoding="utf-8")
    prose, _ = split_fences(text)
    lines, prose_lines = text.split("\n"), prose.split("\n")
    bad = []
    for i, line in enumerate(prose_lines):
        for target in re.findall(r"!\[[^\]]*\]\(([^)\s]+)", line):
            start = max((j for j in range(i) if re.match(r"#{1,6} ", prose_lines[j])), default=0)
            section = "\n".join(lines[start:i])
            if not re.search(r"tiedlm \w+|configs/|python scripts/", section):
                bad.append(f"{target}: its section names no command or config")
            if not re.search(r"\bcores?\b|\bGPUs?\b|\bCPU\b", section):
                bad.append(f"{target}: its section names no machine")
    assert not bad, f"{page.relative_to(ROOT)}:\n" + "\n".join(bad)


# ------------------------------------------------------------------------------- the README


def test_the_readme_is_short():
    n = len(README.read_text(encoding="utf-8").splitlines())
    assert n <= README_MAX_LINES, f"README.md has {n} lines; move detail to docs/ (at most {README_MAX_LINES})"


def test_no_placeholders():
    for page in PAGES:
        assert not re.search(r"\bTODO\b|\bTBD\b|\bFIXME\b|XXX", page.read_text(encoding="utf-8")), page.name


def test_the_set_up_commands_are_the_ones_ci_runs():
    """The README's first code block, near its top, is the two set-up commands: the main job, and
    the test command, which is exactly what .ci/run runs after installing torch."""
    text = README.read_text(encoding="utf-8")
    m = re.search(r"^```(?:bash|sh)?\n(.*?)\n```", text, re.S | re.M)
    assert m, "README.md has no code block"
    assert text[:m.start()].count("\n") < 40, "the set-up commands must stay near the top of README.md"
    commands = [line.strip() for line in m.group(1).splitlines() if line.strip()]
    assert len(commands) == 2, commands
    assert commands[0] == MAIN_JOB
    # .ci/run may quieten pip (pip install -q ...); the command is otherwise the same, word for word
    ci = [re.sub(r"\bpip install -q ", "pip install ", line.strip())
          for line in (ROOT / ".ci" / "run").read_text().splitlines()
          if line.strip() and not line.lstrip().startswith("#")]
    assert commands[1] in ci, f".ci/run does not run the README's test command {commands[1]!r}"
    assert ci[-1] == commands[1], ".ci/run's last step must be the README's test command"
    assert "pytest" in commands[1]


def test_every_import_in_the_docs_python_examples_resolves():
    """A `from tiedlm... import ...` line in a ```python block of the README or docs/ names a module
    and names that exist (an example a user copies must not fail at its first line)."""
    import importlib

    pages = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    seen, missing = 0, []
    for page in pages:
        for block in re.findall(r"```python\n(.*?)```", page.read_text(encoding="utf-8"), re.S):
            for mod, names in re.findall(r"^\s*from (tiedlm[\w.]*) import ([\w, ]+)", block, re.M):
                module = importlib.import_module(mod)
                seen += 1
                missing += [f"{page.name}: {mod}.{n.strip()}" for n in names.split(",")
                            if n.strip() and not hasattr(module, n.strip())]
    assert seen >= 3 and not missing, missing
