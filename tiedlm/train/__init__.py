"""The training loop: a plain function, `train_run`, readable in one sitting.

AdamW with parameter groups in which a tied matrix appears once; linear warmup then cosine decay;
gradient clipping and accumulation; a budget in tokens or steps; periodic evaluation on a fixed
validation slice, with the best tracked and, optionally, kept or used to stop early
(train/selection.py); checkpoints that resume bit-identically on CPU; SIGINT/SIGTERM handled at a
step boundary (with gradient accumulation also between micro-batches, the partial step abandoned);
a non-finite loss or gradient norm stops the run as `diverged`.
"""

from __future__ import annotations

import contextlib
import math
import random
import signal
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

import numpy as np

from .. import __version__, runs
from ..runs import checkpoints
from ..runs.checkpoints import rng_state, set_rng_state
from ..config import Config, TrainConfig, to_yaml
from ..config.identity import config_hash
from ..files import atomic_write_text
from ..errors import ConfigError, DivergedError, Interrupted
from .step import BatchSampler, build_optimizer, lr_at, train_step, untie_with_optimizer
from ..distributed import Dist, check_in_step, is_main_process
from .selection import BestTracker, evaluate_best, keep_best_weights, stop_reason
from ..process import STDERR, StopSignals, Terminated, git_commit, log, now, versions
from ..runs.ledger import ledger_of
from ..runs.human_report import overtrained_text
from .old_domain import also_record, score_also
from .preflight import Preflight, preflight
from ..trackers.live import TrainingTrackers
from ..model.counting import check_fits, flops_per_token
from ..model.hf_config import start_files
from ..device import autocast_ctx, cpu_threads, peak_memory, resolve_device, tf32_matmuls, threads_used
from ..distributed import all_mean, allreduce_bytes, any_rank, barrier, from_env, stop, sum_arrays, wrap
from .. import fsdp
from ..runs.sharded import load_sharded, save_sharded
from ..formatting import fmt
from ..perplexity import MAX_LOSS, perplexity, representable

if TYPE_CHECKING:
    import torch

# ------------------------------------------------------------------------- the entry point


def train_run(cfg: Config, out: Path = Path("runs"), name: str | None = None, overwrite: bool = False,
              progress: bool = True, stop_after_step: int | None = None) -> Path:
    """Train one run into `out/<name>` (default name: `<cfg.name>-s<seed>`) and return its folder.

    An existing folder with the same config is resumed from its last checkpoint, or left alone if
    finished; a different config is refused unless `overwrite`. `stop_after_step` stops the run
    as an interrupt would, after that step (used to test exact resume)."""

    d = from_env()
    run_name = name or f"{cfg.name}-s{cfg.seed}"
    run_dir = runs.run_dir_for(Path(out), run_name)
    if not overwrite:  # refuse a conflicting folder before taking its lock
        if runs.existing_state(run_dir, cfg) == "finished":
            log(f"{run_dir} is already finished with this config: nothing to do (--overwrite to retrain)")
            return run_dir
    device = resolve_device(cfg.train.device)  # once: the checks, the TF32 setting and the run use it
    # The vocabulary is known only once the data are prepared (that check follows in preflight):
    # here the model without its embeddings, which is what an absurd depth or width is about.
    if not (d.active and cfg.train.parallel == "fsdp"):  # sharded: planned per rank (train --dry-run)
        check_fits(cfg.model, None, max(cfg.train.batch_size, cfg.eval.batch_size), device)
    created = not run_dir.exists() and d.main
    try:  # in a distributed run, rank 0 alone holds the lock and writes the folder
        with StopSignals() as signals, (runs.RunLock(run_dir) if d.main else contextlib.nullcontext()) as lock:
            if lock is not None and lock.took_over:
                log(f"took over the lock of {run_dir}, left by process {lock.took_over.get('pid')} which is gone")
            if not overwrite and runs.existing_state(run_dir, cfg) == "finished":
                log(f"{run_dir} is already finished with this config: nothing to do")
                return run_dir
            _train(cfg, run_dir, device, progress and d.main, stop_after_step, fresh=overwrite, signals=signals, d=d)
        # Every rank reaches the teardown together: a rank that destroyed its process group while the
        # other still held connections to it aborted the other one now and then (gloo, on the CPU).
        barrier(d)
    except Terminated:
        raise Interrupted("terminated (SIGTERM) before training started; nothing of the run was written — "
                          "run the same command again", exit_code=143) from None
    finally:
        stop(d)
        if created:  # a run that failed before writing anything leaves no empty folder behind
            try:
                run_dir.rmdir()
            except OSError:
                pass
    return run_dir


@dataclass
class TrainState:
    """What the loop advances, and a checkpoint stores beside the weights, optimizer and RNGs."""

    step: int = 0
    tokens: int = 0  # training tokens seen
    skipped: int = 0  # non-finite steps skipped (train.max_skipped)
    train_time: float = 0.0  # seconds inside training steps, over every attempt
    untied_at_step: int | None = None  # the step at which an untie_at run did split
    best: BestTracker = field(default_factory=BestTracker)  # the best validation evaluation, early stopping

    def to_checkpoint(self) -> dict:
        # "untied" says, before the weights are loaded, whether they are two matrices
        return {"step": self.step, "tokens": self.tokens, "skipped": self.skipped, "train_time": self.train_time,
                "untied_at": self.untied_at_step, "untied": self.untied_at_step is not None,
                "best": self.best.to_state()}

    def restore(self, st: dict) -> None:
        """Take the counters and the best evaluation of a checkpoint's state (what to_checkpoint wrote)."""
        self.step, self.tokens, self.skipped = st["step"], st["tokens"], st["skipped"]
        self.train_time, self.untied_at_step = st["train_time"], st["untied_at"]
        self.best = BestTracker.from_state(st["best"])


def _train(cfg: Config, run_dir: Path, device: torch.device, progress: bool, stop_after_step: int | None,
           fresh: bool, signals: StopSignals, d: Dist | None = None) -> None:

    t_start = time.time()
    with cpu_threads(cfg.train.threads), tf32_matmuls(device):
        pre = preflight(cfg, run_dir, device, fresh, progress, d)
        main = pre.dist.main
        if fresh and main:
            runs.clear_run_dir(run_dir)
        signals.install()
        if main:
            runs.clean_temporary_files(run_dir)
        if pre.checkpoint_note:
            log(f"{run_dir}: {pre.checkpoint_note}")
        record = _start_record(cfg, run_dir, pre) if main else _Unwritten(run_dir, runs.RunReport())
        wall_before = record.report.wall_time_s or 0.0
        state = TrainState()

        def interrupted(message: str) -> Interrupted:
            record.write(status="interrupted", interrupted_at_step=state.step,
                         wall_time_s=wall_before + time.time() - t_start)
            return Interrupted(message, exit_code=143 if signals.received == signal.SIGTERM else 130)

        try:
            model = _train_loop(cfg, run_dir, pre, record, state, signals, interrupted, progress, stop_after_step)
            if not pre.fsdp:  # sharded, each rank holds other weights by design
                check_in_step(pre.dist, model, pre.device)
            final = final_evaluation(cfg, run_dir, pre, model, state, signals, interrupted)
            also = [score_also(cfg, pre, model)] if pre.also is not None else None
            final_best = _best_evaluation(cfg, run_dir, pre, model, state, signals, interrupted, final, also)
            if also is not None and main:  # the start's score, unless the first attempt's report was lost
                record.write(also=also_record(cfg, (record.report.also or {}).get("before"), *also))
            _finish(record, cfg, pre, model, state, final, final_best, wall_before + time.time() - t_start)
        except (Interrupted, DivergedError):
            raise
        except KeyboardInterrupt:
            _best_effort(record.write, status="interrupted", error="interrupted outside a training step")
            raise
        except Exception as exc:
            err = runs.as_tiedlm_error(exc, pre.dist.active)
            _best_effort(record.write, status="failed", error=str(err) if err else f"{type(exc).__name__}: {exc}")
            if err is not None and err is not exc:
                raise err from exc
            raise
        finally:
            if pre.tb is not None:
                pre.tb.close()


class _Unwritten(runs.RunRecord):
    """The record of a rank other than 0: kept in memory, never written (rank 0 writes the folder)."""

    def write(self, **changes: Any) -> None:
        self.report.update(**changes)


def _start_record(cfg: Config, run_dir: Path, pre: Preflight) -> runs.RunRecord:
    """config.yaml and the first report.json of this attempt (a resumed run keeps its history)."""
    from ..data import data_identity

    text = to_yaml(cfg)
    with runs.writing(run_dir / runs.CONFIG):
        atomic_write_text(run_dir / runs.CONFIG, text)
    with runs.writing(run_dir / runs.START):  # what eval, sample and export rebuild the model from
        runs.keep_start(run_dir, start_files(cfg.model))
    report = runs.RunReport(
        name=run_dir.name, status="running", seed=cfg.seed, config_hash=config_hash(cfg), config=cfg,
        tiedlm_version=__version__, started_at=now(), device=str(pre.device), dtype=pre.dtype,
        versions=versions(), git_commit=git_commit(), command=" ".join(sys.argv),
        data_identity=data_identity(pre.data), start_identity=pre.start)
    if pre.old_report is not None and pre.loaded is not None:
        report.update(also=pre.old_report.also,
                      started_at=pre.old_report.started_at or report.started_at,
                      resumed_at_steps=list(pre.old_report.resumed_at_steps),
                      wall_time_s=pre.old_report.wall_time_s)
    record = runs.RunRecord(run_dir, report)
    record.write()
    return record


def _params(model, data) -> dict:
    """The model's parameter breakdown, with the tokenizer's and the padded vocabulary."""
    from ..model.blocks import count_params
    from ..model.tie_layer import block_biases

    out = {**count_params(model), "model_vocab_size": data.model_vocab_size, "vocab_size": data.vocab_size,
           "vocab_padding": data.model_vocab_size - data.vocab_size,
           "trainable": sum(p.numel() for p in model.parameters() if p.requires_grad),
           "block_biases": block_biases(model)}  # the built model's, which the ledger compares
    if model.family.built_by_transformers:  # the size fields its config has, as the model has them
        out["family_sizes"] = model.family_sizes()
    if getattr(model, "start", None):  # a pretrained start (model.init_from): the checkpoint and its tie
        out["start"] = model.start
    if getattr(model, "family_scale", None) not in (None, 1.0):  # Gemma's √d on E's rows, measured on the model
        out["family_embed_scale"] = model.family_scale
    return out


def _build(cfg: Config, run_dir: Path, pre: Preflight, record: runs.RunRecord, state: TrainState):
    """The tokenizer saved into the run, the seeded RNGs, the model and its optimizer, and (resuming)
    the checkpoint's weights, optimizer, RNG and counters applied. Returns (model, optimizer, sampler)."""
    import torch

    from ..model.blocks import build_model, freeze_all_but, init_new_rows

    main = pre.dist.main
    tok_dir = run_dir / runs.TOKENIZER
    if main:
        with runs.writing(tok_dir):  # the Rust tokenizer reports a full disk as a plain Exception
            tok_dir.mkdir(exist_ok=True)
            pre.data.tokenizer.save(tok_dir)
    torch.manual_seed(cfg.seed)
    np.random.seed(cfg.seed % 2**32)
    random.seed(cfg.seed)
    sampler = np.random.default_rng(cfg.seed)
    on_meta = pre.fsdp and cfg.train.fsdp_init == "meta"
    if on_meta:  # no weights yet: each rank draws its shards once the model is sharded
        with fsdp.parameters_on_meta():
            model = build_model(cfg.model, pre.data.model_vocab_size)
    else:
        model = build_model(cfg.model, pre.data.model_vocab_size).to(pre.device)
    model.check_tie(not cfg.model.tie.two_matrices)
    if not on_meta:
        init_new_rows(model, getattr(pre.data.tokenizer, "added_ids", []))  # before freezing: a row, not a step
    freeze_all_but(model, cfg.train.trainable)
    if pre.also is not None and pre.loaded is None and not on_meta:  # the start's score (a resume keeps the first's)
        before = score_also(cfg, pre, model)
        if main:
            record.write(also=also_record(cfg, before))
    params = _params(model, pre.data)
    if pre.fsdp:  # sharded before the optimizer sees its parameters; drawn shard by shard from the meta device
        sharding = fsdp.shard(model, pre.dist, pre.device, pre.dtype)
        if on_meta:
            fsdp.materialise(model, pre.device, cfg.seed, pre.dist.rank)
        record.report.extra["fsdp"] = sharding.to_json()  # beside the report's fields, as a newer tiedlm's are
        record.write(world_size=pre.dist.world)
    optimizer = build_optimizer(model, cfg.train)
    if pre.loaded is not None:
        tensors, st, manifest = pre.loaded
        if pre.fsdp:  # each rank its own shards of the weights and the optimizer
            load_sharded(pre.checkpoint, manifest, model, optimizer)
        else:
            if manifest.get("sharded"):
                raise ConfigError(f"{pre.checkpoint} is sharded (train.parallel: fsdp) — resume it with the same "
                                  "config under torchrun: torchrun --standalone --nproc_per_node=N -m tiedlm train ...")
            if st["untied"]:  # before the optimizer's state is loaded: W_out has a place in it
                untie_with_optimizer(model, optimizer)
            checkpoints.load_weights(model, tensors, manifest)
            optimizer.load_state_dict(st["optimizer"])
        set_rng_state(st["rng"], sampler)
        state.restore(st)
        if main:
            runs.trim_metrics(run_dir, state.step)
            # kept best weights newer than the checkpoint belong to steps this attempt trains again
            checkpoints.prune_best_weights(run_dir, keep={state.best.weights})
        record.report.resumed_at_steps.append(state.step)
        log(f"resuming {run_dir} from its checkpoint at step {state.step} of {pre.total_steps}")
    elif main:
        (run_dir / runs.METRICS).unlink(missing_ok=True)
        if run_dir.joinpath(runs.CHECKPOINTS).exists():
            checkpoints.clear_checkpoints(run_dir)
    if pre.dist.active and pre.dist.rank:  # other dropout masks on each rank's slice (rank 0 keeps the run's stream)
        torch.manual_seed(int(torch.randint(2**62, (1,))) + pre.dist.rank)
    per_forward = cfg.train.batch_size * cfg.model.block_size
    record.write(params=params, flops_per_token=flops_per_token(cfg.model, pre.data.model_vocab_size, per_forward,
                                                                per_forward * cfg.train.grad_accum),
                 total_steps=pre.total_steps, data=pre.data.info, floor=pre.data.floor,
                 untie_step=pre.untie_step, decay_embeddings=cfg.train.decay_embeddings)
    return model, optimizer, sampler


def _train_loop(cfg: Config, run_dir: Path, pre: Preflight, record: runs.RunRecord, state: TrainState,
                signals: StopSignals, interrupted: Callable, progress: bool, stop_after_step: int | None):
    """Steps until the budget is spent or early stopping ends training: logging, periodic
    evaluation (the best tracked, its weights kept), the untie split, checkpoints, and a stop at a
    step boundary on a signal (or between micro-batches, the partial step abandoned). Returns the
    trained model."""
    from ..model.blocks import model_tensors

    tcfg, total, T = cfg.train, pre.total_steps, cfg.model.block_size
    model, optimizer, sampler = _build(cfg, run_dir, pre, record, state)
    d = pre.dist
    if d.active and all_mean(d, [float(state.step)], pre.device)[0] != state.step:
        raise ConfigError("the processes of this run resumed from different checkpoints — put the run folder on a "
                          "file system every machine shares")
    if tcfg.log_to and d.main:  # tb/ rewritten, the trackers' runs resumed, from metrics.jsonl trimmed to the checkpoint
        pre.tb = TrainingTrackers(tcfg.log_to, run_dir, record.report, resumed=pre.loaded is not None)
    amp = autocast_ctx(pre.device, pre.dtype)
    fwd = _forward(model, tcfg, pre, record)
    next_batch = BatchSampler(pre.data.splits["train"].tokens, T, tcfg.batch_size, pre.device, sampler,
                              (d.rank, d.world))
    tokens_per_step = tcfg.batch_size * tcfg.grad_accum * T
    params = list(model.parameters())
    bar = _progress_bar(progress, total, state.step, run_dir.name)
    pending: list[dict] = []
    covered = state.best.weights  # the kept best weights the last checkpoint names
    saved_at = state.step if pre.loaded is not None else None  # the step of the checkpoint on disk

    def checkpoint(rng: dict) -> None:
        nonlocal pending, covered, saved_at
        _append_metrics(run_dir, pre.tb, pending)
        pending = []
        covered = state.best.weights
        if pre.fsdp:  # every rank writes its shards, rank 0 the rest
            save_sharded(run_dir, state.step, model, optimizer, {
                "tied": model.is_tied, "vocab_size": model.vocab_size, "tiedlm_version": __version__},
                {**state.to_checkpoint(), "rng": rng}, d)
        elif d.main:  # one checkpoint, by rank 0: the weights, optimizer and sampler are the same on every rank
            tensors, meta = model_tensors(model)
            checkpoints.save_checkpoint(run_dir, state.step, tensors, meta, {
                "optimizer": optimizer.state_dict(), **state.to_checkpoint(), "rng": rng})
            checkpoints.prune_best_weights(run_dir, keep={covered})
        saved_at = state.step

    # With train.grad_accum > 1 one step can be long (many micro-batches), so a signal is also
    # heeded between micro-batches: the partial step is abandoned, the last completed step is
    # checkpointed with the RNG state from before the abandoned step (the sampler and dropout
    # draws it made are undone), and the resumed run is the uninterrupted one. Under torchrun
    # the ranks agree on stopping only at step boundaries (one all-reduce a step, not a micro-batch).
    mid_step = tcfg.grad_accum > 1 and not d.active
    heed = (lambda: signals.received is not None) if mid_step else None
    while state.step < total and state.best.stopped_at is None:
        t0 = time.perf_counter()
        lr = lr_at(state.step, total, tcfg)
        rng_before = rng_state(sampler) if mid_step else None
        result = train_step(fwd, optimizer, params, next_batch, amp, tcfg, lr, stop=heed)
        if result is None:  # a signal between micro-batches: the step is abandoned (its time not counted)
            if saved_at != state.step:
                checkpoint(rng_before)
            _close(bar)
            raise interrupted(f"interrupted during step {state.step + 1} of {total} (abandoned: no update "
                              f"made); the run is checkpointed at step {state.step} — run the same command "
                              "again to resume")
        loss, grad_norm = result
        if d.active:  # each rank's loss is its slice's: the run's is their mean (the gradients are already)
            loss = all_mean(d, [loss], pre.device)[0]
        state.step += 1
        state.tokens += tokens_per_step
        state.train_time += time.perf_counter() - t0
        step = state.step
        if not (representable(loss) and math.isfinite(grad_norm)):
            _skip_or_diverge(run_dir, record, state, tcfg, pending, loss, grad_norm, pre.tb)
        if pre.untie_step is not None and step == pre.untie_step and model.is_tied:
            untie_with_optimizer(model, optimizer)
            params = list(model.parameters())
            fwd = _forward(model, tcfg, pre, record)  # under torchrun, a new wrapper for the new Parameter
            state.untied_at_step = step
            pending.append({"kind": "untie", "step": step, "tokens": state.tokens})
        if step % tcfg.log_every == 0 or step == total:
            pending.append({"kind": "train", "step": step, "tokens": state.tokens, "loss": loss, "lr": lr,
                            "grad_norm": grad_norm, "time": round(state.train_time, 3),
                            "tokens_per_s": state.tokens / state.train_time if state.train_time else None,
                            **_soft_metrics(model)})
        if tcfg.eval_every and (step % tcfg.eval_every == 0 or step == total):
            _periodic_eval(cfg, run_dir, pre, model, state, amp, pending, covered, quiet_bar=bar is None or bar.disable)
        if bar is not None:
            bar.update(1)
            bar.set_postfix(loss=f"{loss:.3f}", ppl=fmt(perplexity(loss), 1),
                            tok_s=f"{state.tokens / max(state.train_time, 1e-9):.0f}", refresh=False)
        stopping = any_rank(d, signals.received is not None or (stop_after_step is not None and step >= stop_after_step),
                            pre.device)  # every rank stops at the same step
        last = step == total or state.best.stopped_at is not None
        if stopping or last or (tcfg.checkpoint_every and step % tcfg.checkpoint_every == 0):
            checkpoint(rng_state(sampler))
        if stopping:
            _close(bar)
            raise interrupted(f"interrupted at step {step} of {total}; a checkpoint was written — run "
                              "the same command again to resume")
    _close(bar)
    _append_metrics(run_dir, pre.tb, pending)
    return model


def _soft_metrics(model) -> dict:
    """A soft or pull run's train row adds ‖W_out − E‖_F (`w_out_minus_e`, what λ pulls to 0), and
    soft's the penalty λ/2·‖W_out − E‖² (`tie_penalty`, not in `loss`, the cross-entropy alone)."""
    distance = model.tie_distance()
    if distance is None:
        return {}
    dist = float(distance)
    if model.built_tie.mode != "soft":  # pull: no term in any loss
        return {"w_out_minus_e": dist}
    return {"w_out_minus_e": dist, "tie_penalty": 0.5 * model.built_tie.strength * dist * dist}


def _close(bar) -> None:
    if bar is not None:
        bar.close()


def _forward(model, tcfg: TrainConfig, pre: Preflight, record: runs.RunRecord):
    """What the step calls: the model, in DistributedDataParallel under torchrun (the tie asserted
    and the bytes it all-reduces recorded), compiled with train.compile."""
    import torch

    if pre.fsdp:  # sharded in _build: FSDP's hooks gather each unit in its forward
        return model
    fwd = wrap(model, pre.dist, pre.device)
    if pre.dist.active:
        record.write(world_size=pre.dist.world, allreduce_bytes_per_step=allreduce_bytes(fwd))
    return torch.compile(fwd) if tcfg.compile else fwd


def _append_metrics(run_dir: Path, tb: TrainingTrackers | None, records: list[dict]) -> None:
    if not is_main_process():  # the ranks of a distributed run other than 0 never write the folder
        return
    runs.append_metrics(run_dir, records)  # the record; TensorBoard only shows it
    if tb is not None:
        tb.append(records)


def _periodic_eval(cfg: Config, run_dir: Path, pre: Preflight, model, state: TrainState,
                   amp: contextlib.AbstractContextManager, pending: list, covered: str | None, quiet_bar: bool) -> None:
    """The validation slice scored; the best evaluation tracked (its weights kept with
    train.keep_best); early stopping decided."""
    from ..evaluate import evaluate_split

    tcfg, step, T = cfg.train, state.step, cfg.model.block_size
    ev = evaluate_split(model, pre.data.splits["validation"], T, T, cfg.eval.batch_size, pre.device, amp,
                        max_tokens=tcfg.eval_tokens)
    if pre.dist.active:  # one number on every rank, so that keep_best and early stopping decide alike
        ev["loss"] = all_mean(pre.dist, [ev["loss"]], pre.device)[0]
        ev["perplexity"] = perplexity(ev["loss"])
    pending.append({"kind": "eval", "step": step, "tokens": state.tokens, "split": "validation",
                    "loss": ev["loss"], "perplexity": ev["perplexity"]})
    if quiet_bar:
        log(f"step {step}/{pre.total_steps}  val loss {ev['loss']:.4f}  val ppl {fmt(ev['perplexity'], 2)}")
    state.best.slice_tokens = ev["tokens"]
    if state.best.observe(step, state.tokens, ev["loss"], tcfg.early_stop_min_delta) and tcfg.keep_best:
        keep_best_weights(run_dir, state.best, step, model, covered, write=pre.dist.main)
    if state.best.should_stop(tcfg.early_stop_patience) and step < pre.total_steps:
        state.best.stopped_at = step
        pending.append({"kind": "early_stop", "step": step, "tokens": state.tokens, "best_step": state.best.step,
                        "best_loss": state.best.loss})
        log(f"{run_dir.name}: stopped at step {step} of {pre.total_steps} — "
            + stop_reason(state.best, tcfg.early_stop_patience, tcfg.early_stop_min_delta))


def _progress_bar(progress: bool, total: int, initial: int, desc: str):
    if not progress:
        return None
    from tqdm import tqdm

    return tqdm(total=total, initial=initial, desc=desc, unit="step", file=STDERR, dynamic_ncols=True,
                disable=None, mininterval=0.5)


def _skip_or_diverge(run_dir: Path, record: runs.RunRecord, state: TrainState, tcfg: TrainConfig, pending: list,
                     loss: float, grad_norm: float, tb: TrainingTrackers | None = None) -> None:
    """A loss without a perplexity (not finite, or past exp()'s range: nats.representable) or a
    non-finite gradient norm: the step was not taken. Up to train.max_skipped such steps are
    skipped and logged; one more stops the run as diverged."""
    state.skipped += 1
    step = state.step
    pending.append({"kind": "skipped", "step": step, "tokens": state.tokens,
                    "loss": loss if math.isfinite(loss) else str(loss),  # kept: a huge loss is finite
                    "grad_norm": grad_norm if math.isfinite(grad_norm) else str(grad_norm)})
    if state.skipped <= tcfg.max_skipped:
        log(f"step {step}: loss {loss:.6g} or gradient norm {grad_norm:.6g} unusable, step skipped "
            f"({state.skipped}/{tcfg.max_skipped})")
        return
    _append_metrics(run_dir, tb, pending)
    last = checkpoints.latest_checkpoint(run_dir)
    keep = f"the last good checkpoint ({last.name}) is kept" if last else "no checkpoint was written yet"
    record.write(status="diverged", diverged_at_step=step,
                 error=f"loss {loss} or gradient norm {grad_norm} at step {step}: {_why_unusable(loss)}")
    raise DivergedError(f"training diverged at step {step} (loss {loss}, gradient norm {grad_norm}); "
                        f"{keep} — lower train.lr, lengthen train.warmup_steps or set train.grad_clip")


def _why_unusable(loss: float) -> str:

    return (f"a loss of {MAX_LOSS:.2f} nats or more has no perplexity (exp overflows)" if loss >= MAX_LOSS
            else "not finite")


def final_evaluation(cfg: Config, run_dir: Path, pre: Preflight, model, state: TrainState, signals: StopSignals,
                     interrupted: Callable, weights: str = "last") -> dict:
    """Every eval.splits split scored whole. A signal here stops between splits, and the same
    command then redoes the evaluation from the final checkpoint. `weights` names what is scored
    in metrics.jsonl: the last weights, or the kept best ones."""
    from ..evaluate import evaluate_split

    d = pre.dist
    final = {}
    for split in cfg.eval.splits:
        if any_rank(d, signals.received is not None, pre.device):
            raise interrupted("interrupted during the final evaluation (training is complete and "
                              "checkpointed) — run the same command again to evaluate")
        res = evaluate_split(model, pre.data.splits[split], cfg.model.block_size, cfg.eval.stride,
                             cfg.eval.batch_size, pre.device, autocast_ctx(pre.device, pre.dtype),
                             train_counts=pre.data.train_counts, fractions=cfg.eval.buckets,
                             unk_id=pre.data.tokenizer.unk_id, shard=(0, 1) if pre.fsdp else (d.rank, d.world),
                             # each token scored once; sharded, every rank runs every window (a forward gathers)
                             reduce=(lambda nll: nll) if pre.fsdp else (lambda nll: sum_arrays(d, nll, pre.device)),
                             new_ids=getattr(pre.data.tokenizer, "added_ids", None))
        final[split] = res
        record = {"kind": "final", "step": state.step, "tokens": state.tokens, "split": split,
                  "loss": res["loss"], "perplexity": res["perplexity"]}
        if weights != "last":
            record.update(weights=weights, step=state.best.step, tokens=state.best.tokens)
        if d.main:
            runs.append_metrics(run_dir, [record])  # TensorBoard shows the final evaluation from the report
    return final


def _best_evaluation(cfg: Config, run_dir: Path, pre: Preflight, model, state: TrainState, signals: StopSignals,
                     interrupted: Callable, final: dict, also: list | None = None) -> dict | None:
    """With train.keep_best, the kept best weights scored like the last ones (the same numbers,
    without a second pass, when the best evaluation is the last one). With eval.also, `also` holds
    its score of the last weights, and gets that of the best ones appended."""
    best = state.best
    if not cfg.train.keep_best or best.weights is None:
        return None
    if best.step == state.step:
        if also is not None:
            also.append(also[0])
        return final
    log(f"{run_dir.name}: scoring the best weights (step {best.step}) too")

    def score(m):
        result = final_evaluation(cfg, run_dir, pre, m, state, signals, interrupted, weights="best")
        if also is not None:
            also.append(score_also(cfg, pre, m))
        return result

    return evaluate_best(run_dir, model, best, score)


def _finish(record: runs.RunRecord, cfg: Config, pre: Preflight, model, state: TrainState, final: dict,
            final_best: dict | None, wall_time: float) -> None:

    mem, mem_kind = peak_memory(pre.device)
    run_dir = record.run_dir
    best = state.best.summary()
    if best is not None and final_best is not None:
        best["final_is_last"] = state.best.step == state.step
    stopped = None if state.best.stopped_at is None else {
        "step": state.best.stopped_at, "of_steps": pre.total_steps,
        "reason": stop_reason(state.best, cfg.train.early_stop_patience, cfg.train.early_stop_min_delta)}
    if best and best.get("overtrained"):
        log(f"{run_dir.name}: {overtrained_text(best)}")
    record.write(status="finished", final=final, best=best, final_best=final_best, stopped_early=stopped,
                 steps=state.step, tokens_seen=state.tokens,
                 train_time_s=state.train_time, wall_time_s=wall_time,
                 tokens_per_s=state.tokens / state.train_time if state.train_time else None,
                 peak_memory_bytes=mem, peak_memory_kind=mem_kind, untied_at_step=state.untied_at_step,
                 skipped_steps=state.skipped, finished_at=now(),
                 params_after_untie=_params(model, pre.data) if state.untied_at_step is not None else None,
                 checkpoint=str(checkpoints.latest_checkpoint(run_dir).relative_to(run_dir)),
                 threads=threads_used(pre.device), ledger=ledger_of(cfg, record.report.params).to_json())
    if pre.tb is not None:
        pre.tb.finish(record.report)
    train_tokens = len(pre.data.splits["train"].tokens) if "train" in pre.data.splits else 0
    epochs = (f" ({state.tokens / train_tokens:.1f} epochs of its {train_tokens:,} training tokens)"
              if train_tokens else "")
    log(f"finished {run_dir}{epochs}: " + ", ".join(f"{s} ppl {r['perplexity']:.2f}" for s, r in final.items()))


def _best_effort(fn, **kwargs: Any) -> None:
    """Record a failure in the report if the disk allows; never hide the original error."""
    try:
        fn(**kwargs)
    except Exception:  # the disk that failed the run may fail this write too
        pass
