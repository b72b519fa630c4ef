import importlib.util
import struct
import zlib
from pathlib import Path

import pytest

from tiedlm.device import keep_freed_memory, set_thread_env

set_thread_env()  # as the CLI does, before any test imports torch: MKL's reproducible mode, OpenMP's wait
keep_freed_memory()  # and glibc's malloc keeping freed memory for the next step

ROOT = Path(__file__).resolve().parents[1]
SHARED_DATA = ROOT.parent / "shared" / "data"


def script_module(name: str):
    """scripts/NAME.py as a module (the scripts run nothing on import)."""
    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(autouse=True)
def _isolated_cache(tmp_path_factory, monkeypatch):
    """Every test gets its own token cache and never touches the user's."""
    monkeypatch.setenv("TIEDLM_CACHE", str(tmp_path_factory.mktemp("cache")))
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    yield


# The modules whose tests start processes and take 5-25 s each: run first, so that under `-n 2` the
# two workers' queues end with the short tests and neither waits for the other's long one at the end.
PROCESS_MODULES = ("test_worker_pool", "test_jobs_lifecycle", "test_distributed", "test_parallel", "test_signals",
                   "test_output_lock", "test_run_safety", "test_fsdp", "test_trackers")


def pytest_collection_modifyitems(config, items):
    items.sort(key=lambda item: Path(str(item.fspath)).stem not in PROCESS_MODULES)  # a stable sort


def _png_1x1() -> bytes:
    """A valid 1x1 white PNG: what an unmarked test's figures hold (see _figures_drawn_only_where_looked_at)."""
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    header = struct.pack(">IIBBBBB", 1, 1, 8, 6, 0, 0, 0)  # 1x1, 8-bit RGBA
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(b"\x00\xff\xff\xff\xff"))
            + chunk(b"IEND", b""))


STUB_PNG = _png_1x1()


@pytest.fixture(autouse=True)
def _figures_drawn_only_where_looked_at(request, monkeypatch):
    """Drawing a comparison's four PNGs takes about 0.7 s, which over the suite's hundreds of
    comparisons was a fifth of its time. A test marked `figures` draws them (those tests look at
    what was drawn, and call every plot function); every other test builds each figure as tiedlm
    does and writes STUB_PNG where matplotlib would render it, so its files, paths and markdown
    are what tiedlm writes."""
    if request.node.get_closest_marker("figures"):
        yield
        return
    from matplotlib.figure import Figure

    def savefig(self, target, **kwargs):
        if hasattr(target, "write"):
            target.write(STUB_PNG)
        else:
            Path(target).write_bytes(STUB_PNG)

    monkeypatch.setattr(Figure, "savefig", savefig)
    yield


# A model and corpus small enough that a whole run takes about a second on one CPU core.
TINY = [
    "name=tiny",
    "data.synthetic.vocab_size=60", "data.synthetic.n_classes=6", "data.synthetic.successors=2",
    "data.synthetic.train_tokens=6000", "data.synthetic.validation_tokens=800",
    "data.synthetic.test_tokens=800",
    "tokenizer.kind=word",
    "model.n_layer=2", "model.n_head=2", "model.n_embd=16", "model.block_size=16",
    "train.batch_size=4", "train.max_steps=12", "train.warmup_steps=2", "train.log_every=1",
    "train.eval_every=4", "train.checkpoint_every=4", "train.eval_tokens=256", "train.threads=1",
    "eval.batch_size=16",
]


@pytest.fixture
def tiny():
    """A function returning the tiny config with extra overrides applied."""
    from tiedlm.config import load_config

    def make(*extra, seed=None):
        return load_config(None, TINY + list(extra), seed)

    return make


@pytest.fixture
def tiny_yaml(tmp_path):
    """The tiny config as a YAML file, for the CLI."""
    import yaml

    from tiedlm.config import apply_overrides

    path = tmp_path / "tiny.yaml"
    path.write_text(yaml.safe_dump(apply_overrides({}, TINY)))
    return path


def train_tied_untied(root: Path) -> Path:
    """The tiny config trained tied and untied into root/runs (runs `ttrue` and `tfalse`), with a
    token cache of its own: a pair for the tests that read a comparison's or a run's files."""
    from tiedlm.config import load_config
    from tiedlm.train import train_run

    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TIEDLM_CACHE", str(root / "cache"))
        for tie in ("true", "false"):
            train_run(load_config(None, TINY + [f"model.tie_embeddings={tie}"]), out=root / "runs", name=f"t{tie}",
                      progress=False)
    return root / "runs"


def comparison_dir(runs: Path) -> Path:
    """The one comparison folder compare wrote under `runs` (compare-NAME/, named for its runs)."""
    found = [p for p in Path(runs).iterdir() if p.is_dir() and (p / "comparison.json").exists()]
    assert len(found) == 1, f"expected one comparison folder in {runs}, found {[p.name for p in found]}"
    return found[0]
