"""tiedlm: measure whether weight tying (W_out = E) helps a small GPT on your data."""

__version__ = "0.1.0"

# Heavy imports (torch, datasets) stay inside the functions, so `import tiedlm` is instant.


def load_config(*args, **kwargs):
    from .config import load_config as _load

    return _load(*args, **kwargs)


def train(*args, **kwargs):
    from .train import train_run

    return train_run(*args, **kwargs)


def compare(*args, **kwargs):
    from .compare import compare_runs

    return compare_runs(*args, **kwargs)
