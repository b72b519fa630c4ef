"""The shape the README's Architecture section promises, checked: imports point down the layers
(inside functions too) and form no cycle, no module is over 600 lines, no function over 100,
and `tiedlm --help` imports none of the heavy libraries."""

import ast
import subprocess
import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "tiedlm"

# Highest first, as in the README. A module may import its own layer's lower entries and any
# layer below; the order inside a layer is the order of the allowed imports.
LAYERS = [
    ["cli"],
    ["compare", "sweep", "tuning", "params"],
    ["analyze", "export", "generate", "jobs", "parallel"],
    ["train", "selection", "optim", "step"],
    ["evaluate"],
    ["checkpoints", "figures", "tensorboard", "runs", "process"],
    ["model", "loss", "counting", "distributed", "device"],
    ["data", "corpora"],
    ["naming", "config", "checks"],
    ["files", "formatting", "errors", "geometry"],
]
RANK = {name: (i, j) for i, layer in enumerate(LAYERS) for j, name in enumerate(layer)}


def modules() -> dict[str, Path]:
    return {".".join(p.relative_to(PACKAGE).with_suffix("").parts): p for p in PACKAGE.rglob("*.py")}


def top(name: str) -> str:
    return name.split(".")[0]


def imports_of(name: str, path: Path) -> set[str]:
    """tiedlm modules imported anywhere in the file (functions included), as dotted names."""
    pkg = name.split(".")[:-1] if path.name != "__init__.py" else name.split(".")
    found = set()
    tree = ast.parse(path.read_text())
    typing_only = {id(n) for block in ast.walk(tree) if isinstance(block, ast.If)
                   and getattr(block.test, "id", None) == "TYPE_CHECKING" for n in ast.walk(block)}
    for node in ast.walk(tree):
        if id(node) in typing_only:  # annotations only: never executed
            continue
        if isinstance(node, ast.ImportFrom) and node.level:
            base = pkg[: len(pkg) - node.level + 1]
            target = ".".join(base + ([node.module] if node.module else []))
            found.add(target)
            found.update(f"{target}.{a.name}" for a in node.names)  # `from . import runs`
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("tiedlm"):
            found.add(node.module.removeprefix("tiedlm").lstrip("."))
    mods = modules()
    return {t for t in found if t in mods and t and t != name}


def test_imports_point_down_the_layers_and_form_no_cycle():
    mods = modules()
    graph = {name: imports_of(name, path) for name, path in mods.items()}
    wrong = []
    for name, targets in graph.items():
        if top(name) not in RANK:
            continue
        for t in targets:
            a, b = RANK[top(name)], RANK.get(top(t), (99, 0))
            if top(t) != top(name) and b < a:
                wrong.append(f"{name} -> {t}")
    assert wrong == []
    # no cycle among modules (packages' own files included)
    state: dict[str, int] = {}

    def visit(n: str, stack: list[str]) -> None:
        state[n] = 1
        for t in graph.get(n, ()):
            if state.get(t) == 1:
                raise AssertionError("import cycle: " + " -> ".join(stack + [n, t]))
            if t not in state:
                visit(t, stack + [n])
        state[n] = 2

    for n in graph:
        if n not in state:
            visit(n, [])


def test_every_module_is_in_a_layer():
    assert {top(n) for n in modules()} - {"__init__", "__main__"} <= set(RANK)


def test_no_module_over_600_lines_and_no_function_over_100():
    long_modules = {n: len(p.read_text().splitlines()) for n, p in modules().items()}
    assert {n: k for n, k in long_modules.items() if k > 600} == {}
    long_functions = []
    for name, path in modules().items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                length = node.end_lineno - node.lineno + 1
                if length > 100:
                    long_functions.append(f"{name}.{node.name}: {length}")
    assert long_functions == []


def test_help_imports_no_heavy_library():
    code = ("import sys\nfrom typer.testing import CliRunner\nfrom tiedlm.cli import app\n"
            "CliRunner().invoke(app, ['--help'])\n"
            "print(sorted(m for m in ('torch', 'datasets', 'matplotlib', 'tokenizers', 'numpy') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
