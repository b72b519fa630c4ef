"""tiedlm: measure whether weight tying (W_out = E) helps a small GPT on your data.

The library is usable without the CLI:

    from tiedlm import load_config, train_run, compare_runs
    cfg = load_config("configs/base.yaml", ["model.tie_embeddings=false"], seed=1)
    run_dir = train_run(cfg)
    result = compare_runs(["runs/*"])
    table = load_results("runs/compare-shakespeare")  # a pandas DataFrame, one row per run (tiedlm[pandas])

Names are resolved lazily, so `import tiedlm` (and `tiedlm --help`) does not import torch.
"""

__version__ = "0.1.0"

_EXPORTS = {
    "load_config": "config",
    "train_run": "train",
    "compare_runs": "compare",
    "compare_config": "experiment",
    "prepare_data": "data",
    "evaluate_run": "evaluate",
    "count_params_config": "model.counting",
    "params_report": "model.params_report",
    "load_results": "results",
}
__all__ = ["__version__", *_EXPORTS]


def __getattr__(name: str):
    if name in _EXPORTS:
        import importlib

        return getattr(importlib.import_module(f".{_EXPORTS[name]}", __name__), name)
    raise AttributeError(f"module 'tiedlm' has no attribute {name!r}")
