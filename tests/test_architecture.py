"""The shape docs/architecture.md promises, checked: imports point down the layers
(inside functions too) and form no cycle, no module is over 900 lines, no function over 100,
and `tiedlm --help` imports none of the heavy libraries.

The import graph is read from the source (ast), not by importing: `import_graph(root)` takes any
package folder, so a small fixture package below pins down what the resolver must see."""

import ast
import subprocess
import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "tiedlm"

# Highest first, as in docs/architecture.md. A module may import its own layer's lower entries and any
# layer below; the order inside a layer is the order of the allowed imports.
LAYERS = [
    ["cli"],
    ["experiment"],
    ["compare", "model.memory_plan", "model.params_report"],
    ["analyze", "export", "generate", "results"],
    ["train"],
    ["evaluate"],
    ["runs.sharded", "runs.checkpoints", "figures", "trackers", "runs", "runs.human_report", "process"],
    ["fsdp", "model.blocks", "model.counting", "model.hf_model", "model.hf_config", "model.tie_layer", "model.norms",
     "model.loss", "distributed", "device", "threads", "runs.ledger"],
    ["data", "data.builtin"],
    ["config.naming", "config", "config.layers", "config.identity", "config.checks", "model.pretrained", "model.tie",
     "model.arch", "config.yamlsafe"],
    ["files", "formatting", "errors", "analyze.geometry", "perplexity", "model"],
]
RANK = {name: (i, j) for i, layer in enumerate(LAYERS) for j, name in enumerate(layer)}


def modules(root: Path = PACKAGE) -> dict[str, Path]:
    """Every module of the package in folder `root`, by its full dotted name: `tiedlm.runs` for
    runs/, and a package by its own name (`tiedlm.analyze` for analyze/__init__.py, `tiedlm` for
    the root's), as Python names them."""
    found = {}
    for path in sorted(root.rglob("*.py")):
        parts = path.relative_to(root.parent).with_suffix("").parts
        found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def layer(name: str) -> str:
    """The LAYERS entry of a module: the longest of its dotted names below the root package that
    LAYERS holds (`model.blocks` for tiedlm.model.blocks, `analyze` for tiedlm.analyze.render), so
    that a package may hold modules of several layers; the root package is its own."""
    parts = name.split(".")
    if len(parts) == 1:
        return parts[0]
    for end in range(len(parts), 1, -1):
        if ".".join(parts[1:end]) in RANK:
            return ".".join(parts[1:end])
    return parts[1]


def _typing_only(tree: ast.AST) -> set[int]:
    """The nodes under `if TYPE_CHECKING:` (or `typing.TYPE_CHECKING`): annotations only, never
    run. Its else branch does run, and counts."""
    skip = set()
    for node in ast.walk(tree):
        test = getattr(node, "test", None)
        if isinstance(node, ast.If) and "TYPE_CHECKING" in (getattr(test, "id", None), getattr(test, "attr", None)):
            skip.update(id(n) for statement in node.body for n in ast.walk(statement))
    return skip


def imports_of(name: str, path: Path, mods: dict[str, Path]) -> set[str]:
    """The modules of `mods` that module `name` (the file `path`) imports anywhere, inside
    functions included: each module an import statement runs, bar the importer's own packages
    (they ran before it), and the module it reads names from.

    `from M import n` is an edge to M.n where that is a module, else to M (a name of M: for
    `from . import CONST`, the importer's own package); the packages on the way to M
    (`from .x.y import z` runs x too) are edges as well. Relative imports start from the
    importer's package, which for an __init__.py is the package itself."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    ancestors = {".".join(name.split(".")[:i]) for i in range(1, name.count(".") + 1)}

    def chain(module: str) -> set[str]:  # a.b.c -> a, a.b, a.b.c: what importing it runs
        parts = module.split(".")
        return {".".join(parts[:i]) for i in range(1, len(parts) + 1)} - ancestors

    tree = ast.parse(path.read_text())
    skip = _typing_only(tree)
    found: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.Import):  # import a.b.c
            for alias in node.names:
                found |= chain(alias.name) | {alias.name}
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # from . import x, from ..y import z
                base = package.split(".")
                if node.level > len(base):  # above the root package: fails when run
                    continue
                module = ".".join(base[: len(base) - node.level + 1] + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            submodules = {f"{module}.{a.name}" for a in node.names} & mods.keys()
            found |= chain(module) | submodules
            if len(submodules) < len(node.names):  # some name defined in M itself (or `*`)
                found.add(module)
    return {t for t in found if t in mods and t != name}


def import_graph(root: Path = PACKAGE) -> dict[str, set[str]]:
    """Each module of the package in `root` -> the modules of that package it imports."""
    mods = modules(root)
    return {name: imports_of(name, path, mods) for name, path in mods.items()}


def wrong_way(graph: dict[str, set[str]]) -> list[str]:
    """The imports that point up the layers (or up a layer's order), as `a -> b`."""
    wrong = []
    for name, targets in graph.items():
        if layer(name) not in RANK:
            continue
        for t in targets:
            a, b = RANK[layer(name)], RANK.get(layer(t), (99, 0))
            if layer(t) != layer(name) and b < a:
                wrong.append(f"{name} -> {t}")
    return sorted(wrong)


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle, as the modules round it (the first repeated at the end), or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done, no cycle through it

    def visit(n: str, path: list[str]) -> list[str] | None:
        state[n] = 1
        for t in sorted(graph.get(n, ())):
            if state.get(t) == 1:
                return path[path.index(t):] + [t]
            if t not in state and (cycle := visit(t, path + [t])):
                return cycle
        state[n] = 2
        return None

    for n in sorted(graph):
        if n not in state and (cycle := visit(n, [n])):
            return cycle
    return None


def test_imports_point_down_the_layers_and_form_no_cycle():
    graph = import_graph()
    assert wrong_way(graph) == []
    assert find_cycle(graph) is None  # among modules, packages' own __init__ included


def test_every_module_is_in_a_layer():
    assert {layer(n) for n in modules()} - {PACKAGE.name, "__main__"} <= set(RANK)


def test_no_module_over_900_lines_and_no_function_over_100():
    """A module's length is a judgement (split by what it does, never mid-thought to meet a count);
    900 lines is the ceiling past which one surely holds more than one thing."""
    long_modules = {n: len(p.read_text().splitlines()) for n, p in modules().items()}
    assert {n: k for n, k in long_modules.items() if k > 900} == {}
    long_functions = []
    for name, path in modules().items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                length = node.end_lineno - node.lineno + 1
                if length > 100:
                    long_functions.append(f"{name}.{node.name}: {length}")
    assert long_functions == []


HEAVY = ('torch', 'datasets', 'matplotlib', 'tokenizers', 'numpy')


def test_help_imports_no_heavy_library():
    code = ("import sys\nfrom typer.testing import CliRunner\nfrom tiedlm.cli import app\n"
            "CliRunner().invoke(app, ['--help'])\n"
            f"print(sorted(m for m in {HEAVY} if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_python_m_tiedlm_help_imports_no_heavy_library():
    """`python -m tiedlm` (what --jobs children and the bench run) goes through __main__.py, whose
    set-up imports tiedlm.process before the CLI: it too must stay free of them."""
    code = ("import runpy, sys\nsys.argv = ['tiedlm', '--help']\n"
            "try:\n    runpy.run_module('tiedlm', run_name='__main__')\nexcept SystemExit:\n    pass\n"
            f"print(sorted(m for m in {HEAVY} if m in sys.modules), file=sys.stderr)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert "Usage" in out.stdout and out.stderr.strip().splitlines()[-1] == "[]"


# A package with each form of import once, and the graph the resolver must return for it: a
# resolver that goes blind to one form (as it once did to relative imports in an __init__.py and
# to `from . import x`) fails here, whatever the real package happens to import.
FIXTURE = {
    "arch_pkg/__init__.py": "from .low import VALUE  # relative, in a package's __init__\n",
    "arch_pkg/low.py": "import os  # not the package's: no edge\n\nVALUE = 1\n",
    "arch_pkg/hidden.py": "",
    "arch_pkg/sub/__init__.py": "from . import leaf  # a module, from the package itself\n",
    "arch_pkg/sub/leaf.py": "from .. import low  # a module, one package up\n",
    "arch_pkg/sub/name.py": "from .. import VALUE  # a name of the package above: that package\n",
    "arch_pkg/sibling.py": "from . import low\n",
    "arch_pkg/deep.py": "from .sub import leaf  # runs sub, then leaf\n",
    "arch_pkg/absolute.py": "import arch_pkg.sub.leaf\nfrom arch_pkg.low import VALUE\nfrom arch_pkg import sibling\n",
    "arch_pkg/lazy.py": "def later():\n    from . import sibling  # inside a function\n    return sibling\n",
    "arch_pkg/typed.py": (
        "import typing\nfrom typing import TYPE_CHECKING\n\n"
        "if TYPE_CHECKING:\n    from . import hidden  # annotations only: no edge\n"
        "else:\n    from . import low  # the else branch runs\n"
        "if typing.TYPE_CHECKING:\n    from .sub import leaf\n"
    ),
}
FIXTURE_GRAPH = {
    "arch_pkg": {"arch_pkg.low"},
    "arch_pkg.low": set(),
    "arch_pkg.hidden": set(),
    "arch_pkg.sub": {"arch_pkg.sub.leaf"},
    "arch_pkg.sub.leaf": {"arch_pkg.low"},
    "arch_pkg.sub.name": {"arch_pkg"},
    "arch_pkg.sibling": {"arch_pkg.low"},
    "arch_pkg.deep": {"arch_pkg.sub", "arch_pkg.sub.leaf"},
    "arch_pkg.absolute": {"arch_pkg.sub", "arch_pkg.sub.leaf", "arch_pkg.low", "arch_pkg.sibling"},
    "arch_pkg.lazy": {"arch_pkg.sibling"},
    "arch_pkg.typed": {"arch_pkg.low"},
}


def write_package(root: Path, files: dict[str, str]) -> Path:
    """The files under `root`; returns the package's folder (the first file's top folder)."""
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    return root / next(iter(files)).split("/")[0]


def test_the_resolver_sees_every_form_of_import(tmp_path):
    graph = import_graph(write_package(tmp_path, FIXTURE))
    assert graph == FIXTURE_GRAPH
    assert find_cycle(graph) is None


def test_a_cycle_through_an_import_inside_a_function_is_found(tmp_path):
    root = write_package(tmp_path, {"ring/__init__.py": "",
                                    "ring/a.py": "from . import b\n\nCONST = 1\n",
                                    "ring/b.py": "def f():\n    from .a import CONST\n    return CONST\n"})
    graph = import_graph(root)
    assert find_cycle(graph) == ["ring.a", "ring.b", "ring.a"]
    graph["ring.b"].clear()  # without the import inside f: none
    assert find_cycle(graph) is None


# ------------------------------------------------------------ configs are read as Config (issue 23)

def config_dict_reads(source: str) -> list[str]:
    """Where `source` reads or writes a config as a dict by a string key, as `expression (why)`:
    a section (name, seed, data, tokenizer, model, train, eval) of something named *config* or
    *cfg*; a section whose value is then read by one of that section's keys (`x["model"]["n_embd"]`),
    or walked into by a computed key (`x.get("data", {}).get(k)`); a dotted config key
    (`flat["model.n_embd"]`, also through a module constant). Split names (`final["train"]["loss"]`)
    and other dicts' keys pass."""
    from tiedlm.config import ALL_KEYS

    sections = {k for k in ALL_KEYS if "." not in k}
    leaves = {s: {k.split(".")[1] for k in ALL_KEYS if k.startswith(s + ".")} for s in sections}
    tree = ast.parse(source)
    consts = {t.id: n.value.value for n in tree.body if isinstance(n, ast.Assign) and isinstance(n.value, ast.Constant)
              and isinstance(n.value.value, str) for t in n.targets if isinstance(t, ast.Name)}
    parent = {id(c): n for n in ast.walk(tree) for c in ast.iter_child_nodes(n)}

    def keyed(node: ast.AST | None) -> tuple[ast.AST, str | None] | None:
        """X["k"], X.get("k", ...) -> (X, "k"); (X, None) for a key computed at run time."""
        if isinstance(node, ast.Subscript):
            recv, key = node.value, node.slice
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.args
              and node.func.attr in ("get", "setdefault", "pop")):
            recv, key = node.func.value, node.args[0]
        else:
            return None
        if isinstance(key, ast.Name) and key.id in consts:
            return recv, consts[key.id]
        return recv, key.value if isinstance(key, ast.Constant) and isinstance(key.value, str) else None

    found = []
    for node in ast.walk(tree):
        if (hit := keyed(node)) is None or hit[1] is None:
            continue
        recv, key = hit
        outer = parent.get(id(node))
        if isinstance(outer, ast.Attribute):  # x.get("model").get("n_embd"): the call around the attribute
            outer = parent.get(id(outer))
        read = keyed(outer)
        read = read[1] if read is not None and read[0] is node else ""  # the key its value is read by
        why = None
        if "." in key and key in ALL_KEYS:
            why = "a dotted config key"
        elif key in sections and any(w in ast.unparse(recv).lower() for w in ("config", "cfg")):
            why = "a config section"
        elif key in sections and read in leaves[key]:
            why = f"a section read by its key {read}"
        elif key in sections and read is None and isinstance(node, ast.Call) and len(node.args) > 1:
            why = "a section walked into by a computed key"  # x.get("data", {}).get(k)
        if why:
            found.append(f"{ast.unparse(node)} ({why})")
    return found


def test_no_module_but_runs_and_config_reads_a_config_as_a_dict():
    """A config is a Config from the command line to the report: runs/ rebuilds stored ones
    (read_report, read_config) and config/__init__.py and config/layers.py own the dict forms; every other module reads
    attributes, so a setting has one type and a label can never show null for a key that is set."""
    old_forms = """
TIE_KEY = "model.tie_embeddings"
a = run.config.get("model", {}).get("tie_embeddings")
b = config.get("seed")
c = run.data.get("data", {}).get(k)
d = flat.get(TIE_KEY)
e = stored["model"]["n_layer"]
f = report.config["train"]
"""
    assert len(config_dict_reads(old_forms)) == 6
    others = """
splits["train"].tokens
final.get("train", {}).get("loss")
b["name"] + report.flops_per_token.get("train")
out["model"] = write_json(cfg)
data.info.get("tokenizer", {}).get("key")
by_split = {s: final["train"][s] for s in splits}
"""
    assert config_dict_reads(others) == []
    found = [f"{path.relative_to(PACKAGE)}: {f}" for name, path in modules().items()
             if name not in ("tiedlm.runs.record", "tiedlm.runs.layout", "tiedlm.config", "tiedlm.config.layers") for f in config_dict_reads(path.read_text())]
    assert found == []


def callbacks_and_closures(source: str) -> list[str]:
    """The parameters annotated as callables and the functions defined inside functions: the two
    ways one layer calls back into another's code."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            args = node.args.posonlyargs + node.args.args + node.args.kwonlyargs
            found += [f"{node.name}({a.arg}: Callable)" for a in args
                      if a.annotation is not None and "Callable" in ast.unparse(a.annotation)]
            found += [f"{node.name} defines {inner.name}" for inner in ast.walk(node)
                      if inner is not node and isinstance(inner, (ast.FunctionDef, ast.AsyncFunctionDef))]
    return found


def test_tuning_and_the_sequential_design_call_nothing_of_their_callers():
    """Data down, not callbacks up: tuning (TuningSearch) and the sequential design (SeedDesign)
    return the next stage of runs and are told what was trained; the comparison's plan hands each
    stage to an executor. None of them takes a callable or builds a closure for another to call."""
    assert callbacks_and_closures("def f(train: Callable[[int], bool]):\n    def g():\n        pass\n") == [
        "f(train: Callable)", "f defines g"]
    found = {path: callbacks_and_closures((PACKAGE / path).read_text())
             for path in ("experiment/tuning.py", "experiment/tuning_spec.py", "experiment/plan.py",
                          "experiment/seeds.py", "experiment/driver.py", "experiment/request.py",
                          "experiment/__init__.py", "compare/sequential.py", "compare/__init__.py")}
    assert {path: f for path, f in found.items() if f} == {}


def test_the_judging_side_imports_nothing_of_the_experiment_side():
    """compare/ takes finished run folders and returns a Comparison: no module of it imports
    experiment/ (which sits above it in LAYERS), not even inside a function or for annotations."""
    graph = import_graph()
    assert sorted(f"{n} -> {t}" for n, ts in graph.items() if n.startswith("tiedlm.compare")
                  for t in ts if t.startswith("tiedlm.experiment")) == []
    text = [f"{p.relative_to(PACKAGE)}" for p in (PACKAGE / "compare").rglob("*.py") if "experiment" in
            "".join(line for line in p.read_text().splitlines() if line.lstrip().startswith(("from ", "import ")))]
    assert text == []


def test_only_arch_py_decides_by_the_family_s_name():
    """The block family is one value (arch.Arch): no module but model/arch.py compares model.arch with a
    name, and none reads a `.llama` flag; model/blocks.py's table of blocks is keyed by the names."""
    import re

    decides = re.compile(r"""\barch\s*(==|!=)|(==|!=)\s*["'](gpt2|llama)["']|\.llama\b|\barch\s+(not\s+)?in\s+\(""")
    found = [f"{name}:{i}: {line.strip()}" for name, path in modules().items() if name != "tiedlm.model.arch"
             for i, line in enumerate(path.read_text().splitlines(), 1)
             if decides.search(line.split("#", 1)[0])]
    assert found == []
