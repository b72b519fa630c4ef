"""The training loop: a plain function, `train_run`, readable in one sitting.

AdamW with parameter groups in which a tied matrix appears once; linear warmup then cosine decay;
gradient clipping and accumulation; a budget in tokens or steps; periodic evaluation on a fixed
validation slice; checkpoints that resume bit-identically on CPU; SIGINT/SIGTERM handled at a
step boundary; a non-finite loss or gradient norm stops the run as `diverged`.
"""

from __future__ import annotations

import math
import os
import platform
import random
import signal
import subprocess
import sys
import threading
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np

from . import __version__, runs
from .config import Config, config_hash, to_dict, to_yaml
from .errors import ConfigError, DivergedError, Interrupted, RunError, TiedlmError


class _Stderr:
    """stderr that survives its reader going away (`tiedlm train ... 2>&1 | head -1`): once a write
    fails because the pipe is closed, output is dropped and training carries on, since a progress
    line nobody reads is no reason to lose a run. Progress bars write through it too."""

    closed_pipe = False

    def write(self, text: str) -> int:
        if not self.closed_pipe:
            try:
                sys.stderr.write(text)
            except (BrokenPipeError, ValueError):  # ValueError: the stream was closed
                self.closed_pipe = True
        return len(text)

    def flush(self) -> None:
        if not self.closed_pipe:
            try:
                sys.stderr.flush()
            except (BrokenPipeError, ValueError):
                self.closed_pipe = True

    def isatty(self) -> bool:
        return not self.closed_pipe and sys.stderr.isatty()

    def __getattr__(self, name: str) -> Any:  # encoding, fileno, ... as the real stderr has them
        return getattr(sys.stderr, name)


STDERR = _Stderr()


def log(msg: str) -> None:
    STDERR.write(msg + "\n")
    STDERR.flush()


# ------------------------------------------------------------------------- optimizer and schedule


def build_optimizer(model, tcfg) -> Any:
    """AdamW over each unique parameter once (a tied matrix is one entry). Matrices are decayed;
    biases and LayerNorm gains never are; the embedding matrices (E, W_out, positions) follow
    train.decay_embeddings. W_out goes last in its group so that a model untied late
    (`untie_at`) and one built untied have the same parameter order for optimizer state."""
    import torch

    embed_names = {"transformer.wte.weight", "transformer.wpe.weight", "lm_head.weight"}
    decay, no_decay = [], []
    for name, p in model.named_parameters():  # yields a shared Parameter once
        is_embed = name in embed_names
        wants_decay = tcfg.decay_embeddings if is_embed else p.dim() >= 2
        (decay if wants_decay else no_decay).append((name, p))
    last = lambda item: item[0] == "lm_head.weight"  # noqa: E731
    decay.sort(key=last)
    no_decay.sort(key=last)
    groups = [
        {"params": [p for _, p in decay], "weight_decay": tcfg.weight_decay},
        {"params": [p for _, p in no_decay], "weight_decay": 0.0},
    ]
    return torch.optim.AdamW(groups, lr=tcfg.lr, betas=(tcfg.beta1, tcfg.beta2), eps=1e-8)


def lr_at(step: int, total: int, tcfg) -> float:
    """Linear warmup from 0 to lr over warmup_steps, then cosine decay to min_lr at `total`."""
    if step < tcfg.warmup_steps:
        return tcfg.lr * (step + 1) / tcfg.warmup_steps
    if total <= tcfg.warmup_steps:
        return tcfg.lr
    progress = min(1.0, (step - tcfg.warmup_steps) / (total - tcfg.warmup_steps))
    return tcfg.min_lr + 0.5 * (tcfg.lr - tcfg.min_lr) * (1.0 + math.cos(math.pi * progress))


def budget_steps(cfg: Config) -> int:
    t = cfg.train
    if t.max_steps is not None:
        return t.max_steps
    per_step = t.batch_size * t.grad_accum * cfg.model.block_size
    return max(1, math.ceil(t.max_tokens / per_step))


def untie_step(cfg: Config, total: int) -> int | None:
    if cfg.model.untie_at is None:
        return None
    return max(1, min(total - 1, round(cfg.model.untie_at * total))) if total > 1 else None


def untie_with_optimizer(model, optimizer) -> None:
    """Split the tied matrix in two; W_out gets an identical copy of E's AdamW state."""
    old = model.transformer.wte.weight
    new = model.untie()
    for group in optimizer.param_groups:
        if any(p is old for p in group["params"]):
            group["params"].append(new)
            break
    state = optimizer.state.get(old)
    if state:
        optimizer.state[new] = {k: (v.clone() if hasattr(v, "clone") else v) for k, v in state.items()}


# ------------------------------------------------------------------------- RNG state


def rng_state(sampler: np.random.Generator) -> dict:
    import torch

    state = {
        "torch": torch.get_rng_state(),
        "numpy": _np_state_to_plain(np.random.get_state()),
        "python": random.getstate(),
        "sampler": sampler.bit_generator.state,
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def _np_state_to_plain(st: tuple) -> list:
    # the legacy tuple holds a uint32 array: store it as a tensor-free list for weights_only load
    return [st[0], st[1].tolist(), int(st[2]), int(st[3]), float(st[4])]


def set_rng_state(state: dict, sampler: np.random.Generator) -> None:
    import torch

    torch.set_rng_state(state["torch"])
    st = state["numpy"]
    np.random.set_state((st[0], np.array(st[1], dtype=np.uint32), st[2], st[3], st[4]))
    random.setstate(_tuplify(state["python"]))
    sampler.bit_generator.state = state["sampler"]
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def _tuplify(x: Any) -> Any:
    return tuple(_tuplify(v) for v in x) if isinstance(x, (list, tuple)) else x


# ------------------------------------------------------------------------- signals


class Terminated(KeyboardInterrupt):
    """SIGTERM before training started (data preparation): handled exactly like Ctrl-C there,
    unwinding so that nothing half-made is left, but ending with SIGTERM's exit code."""


class StopSignals:
    """SIGINT / SIGTERM set a flag that the loop reads at the next step boundary, where it writes
    a checkpoint and stops. A second signal gets the default action: the process ends at once,
    and the previous checkpoint (written atomically) stays intact.

    Before install() (the lock, the data preparation) there is nothing to save: SIGINT raises
    KeyboardInterrupt as Python does by default, and SIGTERM raises Terminated, so both unwind the
    same way (the lock released, a new run folder removed) instead of SIGTERM killing the process
    on the spot and leaving a folder holding only `.lock`."""

    def __init__(self):
        self.received: int | None = None
        self._old: dict = {}
        self._early: Any = None

    @staticmethod
    def _terminate(signum, frame):
        raise Terminated()

    def _handler(self, signum, frame):
        self.received = signum
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, signal.SIG_DFL)
        log(f"\n{signal.Signals(signum).name} received: stopping after this step and writing a checkpoint "
            "(send it again to stop at once)")

    def install(self) -> None:
        """From here on a signal stops the run at the next step boundary (or between the final
        evaluation's splits). Before it (data preparation) Ctrl-C stops at once: nothing to save."""
        if threading.current_thread() is threading.main_thread() and not self._old:
            for sig in (signal.SIGINT, signal.SIGTERM):
                self._old[sig] = signal.signal(sig, self._handler)

    def __enter__(self) -> "StopSignals":
        if threading.current_thread() is threading.main_thread():
            self._early = signal.signal(signal.SIGTERM, self._terminate)
        return self

    def __exit__(self, *exc: Any) -> None:
        for sig, old in self._old.items():
            signal.signal(sig, old)
        if self._early is not None:  # SIGTERM's handler from before __enter__
            signal.signal(signal.SIGTERM, self._early)


# ------------------------------------------------------------------------- facts for the report


def versions() -> dict:
    import torch

    out = {"tiedlm": __version__, "torch": torch.__version__, "python": platform.python_version(),
           "numpy": np.__version__}
    for mod in ("datasets", "tokenizers"):
        m = sys.modules.get(mod)
        if m is not None:
            out[mod] = getattr(m, "__version__", "?")
    return out


def git_commit() -> str | None:
    """The commit of the repository the experiment is run from (with '-dirty' for local changes)."""
    try:
        sha = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5)
        if sha.returncode != 0:
            return None
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=5)
        return sha.stdout.strip() + ("-dirty" if dirty.stdout.strip() else "")
    except (OSError, subprocess.SubprocessError):
        return None


def peak_memory(device) -> tuple[int, str]:
    import torch

    if device.type == "cuda":
        return int(torch.cuda.max_memory_allocated(device)), "cuda max_memory_allocated"
    import resource

    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(rss * (1 if sys.platform == "darwin" else 1024)), "process peak RSS"


def now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


# ------------------------------------------------------------------------- the entry point


def train_run(cfg: Config, out: Path = Path("runs"), name: str | None = None, overwrite: bool = False,
              progress: bool = True, stop_after_step: int | None = None) -> Path:
    """Train one run into `out/<name>` (default name: `<cfg.name>-s<seed>`) and return its folder.

    An existing folder with the same config is resumed from its last checkpoint, or left alone if
    finished; a different config is refused unless `overwrite`. `stop_after_step` stops the run
    as an interrupt would, after that step (used to test exact resume)."""
    run_name = name or f"{cfg.name}-s{cfg.seed}"
    run_dir = runs.run_dir_for(Path(out), run_name)
    config_dict = to_dict(cfg)
    if not overwrite:  # refuse a conflicting folder before taking its lock
        state = runs.existing_state(run_dir, config_dict)
        if state == "finished":
            log(f"{run_dir} is already finished with this config: nothing to do (--overwrite to retrain)")
            return run_dir
    from .model import check_fits, resolve_device

    # The vocabulary is known only once the data are prepared (that check follows in _train):
    # here the model without its embeddings, which is what an absurd depth or width is about.
    check_fits(cfg.model, None, max(cfg.train.batch_size, cfg.eval.batch_size), resolve_device(cfg.train.device))
    created = not run_dir.exists()
    try:
        with StopSignals() as signals, runs.RunLock(run_dir) as lock:
            if lock.took_over:
                log(f"took over the lock of {run_dir}, left by process {lock.took_over.get('pid')} which is gone")
            state = "new" if overwrite else runs.existing_state(run_dir, config_dict)
            if state == "finished":
                log(f"{run_dir} is already finished with this config: nothing to do")
                return run_dir
            _train(cfg, run_dir, progress, stop_after_step, fresh=overwrite, signals=signals)
    except Terminated:
        raise Interrupted("terminated (SIGTERM) before training started; nothing of the run was written — "
                          "run the same command again", exit_code=143) from None
    finally:
        if created:  # a run that failed before writing anything leaves no empty folder behind
            try:
                run_dir.rmdir()
            except OSError:
                pass
    return run_dir


def _train(cfg: Config, run_dir: Path, progress: bool, stop_after_step: int | None, fresh: bool,
           signals: StopSignals) -> None:
    import torch
    from torch.nn import functional as F

    from .data import data_identity, prepare_data
    from .evaluate import evaluate_split, perplexity
    from .model import (GPT, autocast_ctx, check_fits, count_params, flops_per_token, load_model_tensors,
                        model_tensors, resolve_device, resolve_dtype)

    t_start = time.time()
    tcfg = cfg.train
    # Everything that can refuse the run happens before anything is written to its folder:
    # the device, the data, and (resuming) a verified checkpoint trained on the same tokens.
    if tcfg.threads:
        torch.set_num_threads(tcfg.threads)
    device = resolve_device(tcfg.device)
    dtype = resolve_dtype(tcfg.dtype, device)
    amp = autocast_ctx(device, dtype)
    total = budget_steps(cfg)
    if cfg.model.untie_at is not None and total < 2:
        raise ConfigError(f"model.untie_at needs at least 2 training steps, the budget gives {total} — "
                          "raise train.max_steps / train.max_tokens or drop model.untie_at")
    ckpt, ckpt_note = (None, None) if fresh else runs.resolve_checkpoint(run_dir)
    loaded = runs.load_checkpoint(ckpt) if ckpt is not None else None
    old = None if fresh else runs.read_report(run_dir)
    data = prepare_data(cfg, progress=progress)
    identity = data_identity(data)
    for split in cfg.eval.splits:
        if split not in data.splits:
            raise TiedlmError(f"eval.splits names {split!r} but the data has no such split (it has "
                              f"{', '.join(data.splits)}) — set eval.splits to the splits there are, "
                              "or give the data that split", exit_code=2)
    n_train = data.splits["train"].tokens.size
    if n_train < cfg.model.block_size + 1:
        raise TiedlmError(f"the training split has {n_train} tokens, fewer than model.block_size + 1 = "
                          f"{cfg.model.block_size + 1} — use more data or a smaller model.block_size")
    if loaded is not None and old and old.get("data_identity") not in (None, identity):
        raise RunError(f"the data or tokenizer of {run_dir} changed since the run started (source fingerprint "
                       "or tokenizer key differ), so its checkpoint no longer fits the tokens — restore the "
                       "data, or start afresh with --overwrite")
    check_fits(cfg.model, data.model_vocab_size, max(tcfg.batch_size, cfg.eval.batch_size), device)
    if fresh:
        runs.clear_run_dir(run_dir)
    signals.install()
    runs.clean_temporary_files(run_dir)
    if ckpt_note:
        log(f"{run_dir}: {ckpt_note}")

    runs.atomic_write_text(run_dir / runs.CONFIG, to_yaml(cfg))
    report: dict[str, Any] = {
        "format": runs.FORMAT, "tiedlm_version": __version__, "name": run_dir.name, "status": "running",
        "error": None, "seed": cfg.seed, "config_hash": config_hash(cfg), "config": to_dict(cfg),
        "started_at": now(), "device": str(device), "dtype": dtype, "versions": versions(),
        "git_commit": git_commit(), "command": " ".join(sys.argv), "data_identity": identity,
    }
    if old and loaded is not None:  # a resumed run keeps its history
        for key in ("started_at", "resumed_at_steps", "wall_time_s"):
            if key in old:
                report[key] = old[key]

    def write_report(**updates: Any) -> None:
        report.update(updates)
        runs.atomic_write_json(run_dir / runs.REPORT, report)
        runs.atomic_write_text(run_dir / runs.REPORT_MD, render_report_md(report))

    write_report()
    try:
        tok_dir = run_dir / runs.TOKENIZER
        with runs.writing(tok_dir):  # the Rust tokenizer reports a full disk as a plain Exception
            tok_dir.mkdir(exist_ok=True)
            data.tokenizer.save(tok_dir)

        torch.manual_seed(cfg.seed)
        np.random.seed(cfg.seed % 2**32)
        random.seed(cfg.seed)
        sampler = np.random.default_rng(cfg.seed)
        model = GPT(cfg.model, data.model_vocab_size).to(device)
        model.check_tie(cfg.model.tie_embeddings)

        def params_now() -> dict:
            """The model's parameter breakdown, with the tokenizer's and the padded vocabulary."""
            return {**count_params(model), "model_vocab_size": data.model_vocab_size,
                    "vocab_size": data.vocab_size, "vocab_padding": data.model_vocab_size - data.vocab_size}

        def wall_time() -> float:  # over every attempt of a resumed run
            return report.get("wall_time_s", 0) + time.time() - t_start

        def interrupted(message: str) -> Interrupted:
            write_report(status="interrupted", interrupted_at_step=step, wall_time_s=wall_time())
            return Interrupted(message, exit_code=143 if signals.received == signal.SIGTERM else 130)

        params = params_now()
        split_at = untie_step(cfg, total)
        optimizer = build_optimizer(model, tcfg)

        step, tokens_seen, skipped, train_time = 0, 0, 0, 0.0
        untied_at: int | None = None
        if loaded is not None:
            tensors, st, manifest = loaded
            if st["untied"]:
                untie_with_optimizer(model, optimizer)
            load_model_tensors(model, tensors, tied=not st["untied"] and cfg.model.tie_embeddings)
            optimizer.load_state_dict(st["optimizer"])
            set_rng_state(st["rng"], sampler)
            step, tokens_seen, skipped = st["step"], st["tokens"], st["skipped"]
            train_time, untied_at = st["train_time"], st["untied_at"]
            runs.trim_metrics(run_dir, step)
            report["resumed_at_steps"] = report.get("resumed_at_steps", []) + [step]
            log(f"resuming {run_dir} from its checkpoint at step {step} of {total}")
        else:
            (run_dir / runs.METRICS).unlink(missing_ok=True)
            if run_dir.joinpath(runs.CHECKPOINTS).exists():
                runs.clear_checkpoints(run_dir)

        fwd = torch.compile(model) if tcfg.compile else model
        fpt = flops_per_token(cfg.model, data.model_vocab_size)
        write_report(params=params, flops_per_token=fpt, total_steps=total,
                     data=data.info, floor=data.floor, untie_step=split_at,
                     decay_embeddings=tcfg.decay_embeddings)

        train_tokens = data.splits["train"].tokens
        T, B = cfg.model.block_size, tcfg.batch_size
        offsets = np.arange(T + 1)
        high = len(train_tokens) - T - 1

        def get_batch():
            starts = sampler.integers(0, high + 1, size=B)
            xy = torch.from_numpy(np.asarray(train_tokens[starts[:, None] + offsets], dtype=np.int64))
            xy = xy.to(device, non_blocking=True)
            return xy[:, :-1], xy[:, 1:]  # (B, T) inputs, (B, T) targets

        val = data.splits["validation"]

        def quick_eval() -> dict:
            return evaluate_split(model, val, T, T, cfg.eval.batch_size, device, amp,
                                  max_tokens=tcfg.eval_tokens)

        def checkpoint() -> None:
            tensors, meta = model_tensors(model)
            state = {"optimizer": optimizer.state_dict(), "step": step, "tokens": tokens_seen,
                     "skipped": skipped, "untied": not model.is_tied and cfg.model.tie_embeddings,
                     "untied_at": untied_at, "train_time": train_time, "rng": rng_state(sampler)}
            runs.save_checkpoint(run_dir, step, tensors, meta, state)

        tokens_per_step = B * tcfg.grad_accum * T
        params_list = list(model.parameters())
        bar = None
        if progress:
            from tqdm import tqdm

            bar = tqdm(total=total, initial=step, desc=run_dir.name, unit="step", file=STDERR,
                       dynamic_ncols=True, disable=None, mininterval=0.5)
        pending: list[dict] = []
        while step < total:
            t0 = time.perf_counter()
            lr = lr_at(step, total, tcfg)
            for group in optimizer.param_groups:
                group["lr"] = lr
            loss_sum = 0.0
            for _ in range(tcfg.grad_accum):
                x, y = get_batch()
                with amp:
                    logits = fwd(x)  # (B, T, V)
                loss = F.cross_entropy(logits.float().view(-1, logits.size(-1)), y.reshape(-1))
                (loss / tcfg.grad_accum).backward()
                loss_sum += loss.item()
            loss_val = loss_sum / tcfg.grad_accum
            grad_norm = float(torch.nn.utils.clip_grad_norm_(
                params_list, tcfg.grad_clip if tcfg.grad_clip > 0 else float("inf")))
            finite = math.isfinite(loss_val) and math.isfinite(grad_norm)
            if finite:
                optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            step += 1
            tokens_seen += tokens_per_step
            train_time += time.perf_counter() - t0
            if not finite:
                skipped += 1
                pending.append({"kind": "skipped", "step": step, "tokens": tokens_seen,
                                "loss": loss_val if math.isfinite(loss_val) else str(loss_val),
                                "grad_norm": grad_norm if math.isfinite(grad_norm) else str(grad_norm)})
                if skipped > tcfg.max_skipped:
                    runs.append_metrics(run_dir, pending)
                    last = runs.latest_checkpoint(run_dir)
                    keep = f"the last good checkpoint ({last.name}) is kept" if last else "no checkpoint was written yet"
                    write_report(status="diverged", diverged_at_step=step,
                                 error=f"non-finite loss ({loss_val}) or gradient norm ({grad_norm}) at step {step}")
                    raise DivergedError(
                        f"training diverged at step {step} (loss {loss_val}, gradient norm {grad_norm}); "
                        f"{keep} — lower train.lr, lengthen train.warmup_steps or set train.grad_clip")
                log(f"step {step}: non-finite loss or gradient, step skipped ({skipped}/{tcfg.max_skipped})")
            if split_at is not None and step == split_at and model.is_tied:
                untie_with_optimizer(model, optimizer)
                params_list = list(model.parameters())
                fwd = torch.compile(model) if tcfg.compile else model
                untied_at = step
                pending.append({"kind": "untie", "step": step, "tokens": tokens_seen})
            if step % tcfg.log_every == 0 or step == total:
                pending.append({"kind": "train", "step": step, "tokens": tokens_seen, "loss": loss_val,
                                "lr": lr, "grad_norm": grad_norm,
                                "tokens_per_s": tokens_seen / train_time if train_time else None,
                                "time": round(train_time, 3)})
            if tcfg.eval_every and (step % tcfg.eval_every == 0 or step == total):
                ev = quick_eval()
                pending.append({"kind": "eval", "step": step, "tokens": tokens_seen, "split": "validation",
                                "loss": ev["loss"], "perplexity": ev["perplexity"]})
                if bar is None or bar.disable:
                    log(f"step {step}/{total}  val loss {ev['loss']:.4f}  val ppl {ev['perplexity']:.2f}")
            if bar is not None:
                bar.update(1)
                bar.set_postfix(loss=f"{loss_val:.3f}", ppl=f"{perplexity(loss_val, 1):.1f}",
                                tok_s=f"{tokens_seen / max(train_time, 1e-9):.0f}", refresh=False)
            stopping = signals.received is not None or (stop_after_step is not None and step >= stop_after_step)
            if stopping or step == total or (tcfg.checkpoint_every and step % tcfg.checkpoint_every == 0):
                runs.append_metrics(run_dir, pending)
                pending = []
                checkpoint()
            if stopping:
                if bar is not None:
                    bar.close()
                raise interrupted(f"interrupted at step {step} of {total}; a checkpoint was written — run "
                                  "the same command again to resume")
        if bar is not None:
            bar.close()
        runs.append_metrics(run_dir, pending)

        # final full evaluation of every requested split; a signal here stops between splits, and
        # the same command then redoes the evaluation from the final checkpoint
        final = {}
        for split in cfg.eval.splits:
            if signals.received is not None:
                raise interrupted("interrupted during the final evaluation (training is complete and "
                                  "checkpointed) — run the same command again to evaluate")
            res = evaluate_split(model, data.splits[split], T, cfg.eval.stride, cfg.eval.batch_size, device,
                                 amp, train_counts=data.train_counts, fractions=cfg.eval.buckets)
            final[split] = res
            runs.append_metrics(run_dir, [{"kind": "final", "step": step, "tokens": tokens_seen, "split": split,
                                           "loss": res["loss"], "perplexity": res["perplexity"]}])
        mem, mem_kind = peak_memory(device)
        write_report(status="finished", final=final, steps=step, tokens_seen=tokens_seen,
                     train_time_s=train_time, wall_time_s=wall_time(),
                     tokens_per_s=tokens_seen / train_time if train_time else None,
                     peak_memory_bytes=mem, peak_memory_kind=mem_kind, untied_at_step=untied_at,
                     skipped_steps=skipped, finished_at=now(),
                     params_after_untie=params_now() if untied_at is not None else None,
                     checkpoint=str(runs.latest_checkpoint(run_dir).relative_to(run_dir)))
        log(f"finished {run_dir}: " + ", ".join(f"{s} ppl {r['perplexity']:.2f}" for s, r in final.items()))
    except (Interrupted, DivergedError):
        raise
    except KeyboardInterrupt:
        _best_effort(write_report, status="interrupted", error="interrupted outside a training step")
        raise
    except Exception as exc:
        err = _as_tiedlm_error(exc)
        _best_effort(write_report, status="failed", error=str(err) if err else f"{type(exc).__name__}: {exc}")
        if err is not None and err is not exc:
            raise err from exc
        raise


def _best_effort(fn, **kwargs: Any) -> None:
    """Record a failure in the report if the disk allows; never hide the original error."""
    try:
        fn(**kwargs)
    except Exception:  # the disk that failed the run may fail this write too
        pass


def _as_tiedlm_error(exc: BaseException) -> TiedlmError | None:
    """Expected runtime failures as one-line errors: out of memory (GPU or CPU), a failed write."""
    import torch

    if isinstance(exc, TiedlmError):
        return exc
    # The CPU allocator raises a plain RuntimeError; its message is the only sign of what it is.
    cpu_oom = isinstance(exc, RuntimeError) and "DefaultCPUAllocator" in str(exc)
    if isinstance(exc, (torch.OutOfMemoryError, MemoryError)) or cpu_oom:
        where = "the device" if isinstance(exc, torch.OutOfMemoryError) else "this machine (CPU memory)"
        return RunError(f"out of memory on {where} — lower train.batch_size (raise train.grad_accum to keep "
                        "the same batch), model.block_size or the model size; the last checkpoint is kept")
    if isinstance(exc, OSError):
        return runs.write_failure(exc, exc.filename or "the run folder")
    return None


# ------------------------------------------------------------------------- report.md


def _fmt(x: Any, nd: int = 3) -> str:
    if x is None:
        return "—"
    if isinstance(x, float):
        if not math.isfinite(x):
            return str(x)
        return f"{x:,.{nd}f}"
    if isinstance(x, int) and not isinstance(x, bool):
        return f"{x:,}"
    return str(x)


def render_report_md(r: dict) -> str:
    """report.json for people."""
    cfg = r.get("config", {})
    m = cfg.get("model", {})
    lines = [f"# {r.get('name')}", "",
             f"Status: **{r.get('status')}**" + (f" — {r['error']}" if r.get("error") else ""), "",
             f"Tying: **{'tied' if m.get('tie_embeddings') else 'untied'}**"
             + (f", untied at {m.get('untie_at')} of training (step {r.get('untied_at_step') or r.get('untie_step')})"
                if m.get("untie_at") else "")
             + f"; embed_scale {m.get('embed_scale')}; lm_head_bias {m.get('lm_head_bias')}; "
               f"decay_embeddings {r.get('decay_embeddings')}", ""]
    p = r.get("params")
    if p:
        lines += ["## Parameters", "", "| piece | parameters |", "| --- | ---: |",
                  f"| total (unique) | {_fmt(p['total'])} |",
                  f"| E (wte, V×d) | {_fmt(p['wte'])} |",
                  f"| W_out extra (lm_head; 0 when tied) | {_fmt(p['lm_head'])} |",
                  f"| lm_head bias | {_fmt(p['lm_head_bias'])} |",
                  f"| position embeddings (wpe) | {_fmt(p['wpe'])} |",
                  f"| non-embedding | {_fmt(p['non_embedding'])} |",
                  f"| saved by tying (V·d) | {_fmt(p['saved_by_tying'])} |",
                  f"| vocabulary (tokenizer / model, padding) | {_fmt(p.get('vocab_size'))} / "
                  f"{_fmt(p.get('model_vocab_size'))} ({_fmt(p.get('vocab_padding'))}) |", ""]
    final = r.get("final") or {}
    floor = r.get("floor")
    if final:
        lines += ["## Final evaluation", "",
                  "| split | tokens | loss | perplexity | bits/byte | perplexity/word |"
                  + (" floor ppl/word | floor bits/byte |" if floor else ""),
                  "| --- | ---: | ---: | ---: | ---: | ---: |" + (" ---: | ---: |" if floor else "")]
        for split, res in final.items():
            row = (f"| {split} | {_fmt(res['tokens'])} | {_fmt(res['loss'], 4)} | {_fmt(res['perplexity'], 2)} | "
                   f"{_fmt(res.get('bits_per_byte'), 4)} | {_fmt(res.get('word_perplexity'), 2)} |")
            if floor:
                row += (f" {_fmt(floor.get('perplexity_per_word'), 2)} | "
                        f"{_fmt((floor.get('bits_per_byte') or {}).get(split), 4)} |")
            lines.append(row)
        lines.append("")
        if floor and floor.get("note"):
            lines += [f"The floor is the synthetic language's true entropy rate: no model can do better on "
                      f"average. Note: {floor['note']}.", ""]
        first = next(iter(final.values()))
        if first.get("buckets"):
            lines += ["### Loss by training-set frequency of the target token", "",
                      "| split | " + " | ".join(b["name"] for b in first["buckets"]) + " |",
                      "| --- |" + " ---: |" * len(first["buckets"])]
            for split, res in final.items():
                cells = [f"{_fmt(b['loss'], 3)} ({_fmt(b['tokens'])} tok)" for b in res.get("buckets", [])]
                lines.append(f"| {split} loss | " + " | ".join(cells) + " |")
            lines.append("")
    lines += ["## Training", "",
              f"- steps {_fmt(r.get('steps'))} of {_fmt(r.get('total_steps'))}, tokens seen {_fmt(r.get('tokens_seen'))}",
              f"- tokens/s {_fmt(r.get('tokens_per_s'), 0)}, train time {_fmt(r.get('train_time_s'), 1)} s, "
              f"wall time {_fmt(r.get('wall_time_s'), 1)} s",
              f"- peak memory {_fmt((r.get('peak_memory_bytes') or 0) / 2**20, 1)} MiB ({r.get('peak_memory_kind')})",
              f"- device {r.get('device')}, dtype {r.get('dtype')}, FLOPs/token (train) "
              f"{_fmt((r.get('flops_per_token') or {}).get('train'))}",
              f"- seed {r.get('seed')}, config hash {r.get('config_hash')}, git {r.get('git_commit')}",
              f"- versions {r.get('versions')}"]
    for key in ("resumed_at_steps", "interrupted_at_step", "diverged_at_step", "skipped_steps"):
        if r.get(key):
            lines.append(f"- {key.replace('_', ' ')}: {r[key]}")
    return "\n".join(lines) + "\n"
