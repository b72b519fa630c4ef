#!/usr/bin/env python3
"""How long `tiedlm analyze` takes on GPT-2-sized matrices (V = 50,257, d = 768), tied and untied.

    python scripts/bench_analyze.py            # trains two one-step runs in a temporary folder first

The runs are GPT-2 small's width on the synthetic language with a 50,255-word vocabulary (+ <unk>
and <eot>: V = 50,257), one layer (analyze reads the two matrices and LN_f; the depth only costs
the rebuild) and one training step: the matrices are near their initialisation, which costs the
analysis as much as trained ones. Each analysis is timed in a fresh process (`tiedlm analyze`),
so the time includes importing torch, preparing the data (a token-cache hit) and rebuilding the model.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

GPT2 = ["data.path=builtin:synthetic", "data.synthetic.vocab_size=50255", "data.synthetic.n_classes=256",
        "data.synthetic.train_tokens=400000", "data.synthetic.validation_tokens=200000",
        "data.synthetic.test_tokens=20000", "tokenizer.kind=word", "tokenizer.vocab_size=50257",
        "model.n_layer=1", "model.n_head=12", "model.n_embd=768", "model.block_size=64",
        "train.batch_size=4", "train.max_steps=1", "train.eval_every=0", "train.device=cpu", "eval.splits=[test]"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        config = Path(tmp) / "gpt2-width.yaml"
        config.write_text("name: gpt2-width\n")
        for tag, tie in (("tied", "true"), ("untied", "false")):
            sets = [a for kv in GPT2 + [f"model.tie_embeddings={tie}"] for a in ("--set", kv)]
            subprocess.run([sys.executable, "-m", "tiedlm", "train", "--config", str(config), *sets, "--out", tmp,
                            "--name", tag, "--quiet"], check=True)
        rows = []
        for tag in ("tied", "untied"):
            times = []
            for _ in range(args.repeats):
                t = time.perf_counter()
                subprocess.run([sys.executable, "-m", "tiedlm", "analyze", str(Path(tmp) / tag)], check=True,
                               stdout=subprocess.DEVNULL)
                times.append(time.perf_counter() - t)
            rows.append((tag, sorted(times)[len(times) // 2], min(times), max(times)))
    print("| run (V = 50,257, d = 768) | median s | min s | max s |")
    print("| --- | ---: | ---: | ---: |")
    for tag, med, lo, hi in rows:
        print(f"| {tag} | {med:.1f} | {lo:.1f} | {hi:.1f} |")


if __name__ == "__main__":
    main()
