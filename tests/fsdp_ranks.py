"""What each rank of tests/test_fsdp.py's one torchrun launch does: several sharded runs one after
another (a process group per run, as a command has), then checks of a model sharded by hand.
Usage: python -m torch.distributed.run --standalone --nproc_per_node=2 tests/fsdp_ranks.py OUT CONFIG...
Each CONFIG trains into OUT/<its stem>; a config whose stem ends in "-stop" stops after step 10 and
is resumed by the same call again. The process group is the launch's, kept from run to run. OUT/checks-<rank>.json holds the hand-made checks' results."""

import json

import sys
from pathlib import Path

import torch

import tiedlm.train
from tiedlm.config import load_config
from tiedlm.errors import Interrupted
from tiedlm.train import train_run

# one process group for every run of this launch (a command starts and ends its own: train_run's stop)
tiedlm.train.stop = lambda d: None


def train_all(out: Path, configs: list[str]) -> None:
    for path in map(Path, configs):
        cfg = load_config(path)
        if path.stem.endswith("-stop"):
            try:
                train_run(cfg, out / path.stem, progress=False, stop_after_step=10)
            except Interrupted:
                pass
        train_run(cfg, out / path.stem, progress=False)


def hand_checks(out: Path, config: str) -> None:
    """A model built on the meta device, sharded and drawn (fsdp_init: meta), and a tied model whose
    head is sharded in a unit of its own, which check_sharded_tie must refuse."""
    import torch.distributed as td
    from torch.distributed.fsdp import fully_shard

    from tiedlm import fsdp
    from tiedlm.distributed import Dist, from_env, start, stop
    from tiedlm.model.blocks import build_model

    d: Dist = from_env()
    start(d, torch.device("cpu"))
    cfg = load_config(Path(config))
    with fsdp.parameters_on_meta():
        model = build_model(cfg.model, 512)
    sharding = fsdp.shard(model, d, torch.device("cpu"), "fp32")
    fsdp.materialise(model, torch.device("cpu"), seed=0, rank=d.rank)
    E = model.get_input_embeddings().weight.full_tensor()
    proj = model.transformer.h[0].attn.c_proj.weight.full_tensor()
    checks = {"tied": model.is_tied, "units": sharding.units, "e_std": float(E.std()), "proj_std": float(proj.std()),
              "halves_differ": not torch.equal(E[:256], E[256:]),
              "ln_ones": bool((model.transformer.ln_f.weight.full_tensor() == 1).all())}
    with fsdp.parameters_on_meta():
        wrong = build_model(cfg.model, 512)
    fully_shard(wrong.lm_head)  # E and W_out in two units: the tie sharded apart
    for block in wrong.blocks():
        fully_shard(block)
    fully_shard(wrong)
    try:
        fsdp.check_sharded_tie(wrong, True)
        checks["apart_refused"] = ""
    except AssertionError as exc:
        checks["apart_refused"] = str(exc)
    td.barrier()
    stop(d)
    (out / f"checks-{d.rank}.json").write_text(json.dumps(checks))


if __name__ == "__main__":
    target, configs = Path(sys.argv[1]), sys.argv[2:]
    train_all(target, configs)
    hand_checks(target, configs[0])
