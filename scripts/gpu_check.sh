#!/usr/bin/env bash
# The CUDA path in at most five minutes, on a machine with a GPU, from the repository root:
#   bash scripts/gpu_check.sh            (OUT=folder to keep the outputs; default a temporary one)
# 1. the bench on CUDA in bf16 (tiedlm and transformers, tied and untied);
# 2. a short base.yaml run on CUDA (bf16 autocast, TF32, fused AdamW, pinned batches);
# 3. the same run interrupted with SIGINT and resumed (CUDA RNG state in the checkpoint);
# 4. compile: true;
# 5. the tests that need CUDA.
# Then a summary: what each step printed last and its exit code.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-$(mktemp -d)}"
mkdir -p "$OUT"
RUNS="$OUT/runs"
STEPS=300
summary=()

step() {  # step NAME COMMAND...: run it with a time limit, keep its output, note the result
  local name="$1"; shift
  echo "== $name"
  timeout 150 "$@" >"$OUT/$name.log" 2>&1
  local rc=$?
  tail -n 3 "$OUT/$name.log"
  summary+=("$name: exit $rc — $(tail -n 1 "$OUT/$name.log")")
}

python -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 'no CUDA device visible to torch')" || exit 1
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader || true

step bench python scripts/bench.py --device cuda --dtype bf16 --steps 10 --rounds 3 --real-steps 50 \
  --json "$OUT/bench-cuda.json"
step train tiedlm train -c configs/base.yaml --set train.device=cuda --set "train.max_steps=$STEPS" \
  --out "$RUNS" --name cuda -q
python - "$RUNS/cuda/report.json" <<'EOF' | tee -a "$OUT/train.log"
import json, sys
r = json.load(open(sys.argv[1]))
print(f"status {r['status']}, device {r['device']}, dtype {r['dtype']}, {r['tokens_per_s']:,.0f} tok/s, "
      f"peak {r['peak_memory_bytes'] / 2**20:,.0f} MiB ({r['peak_memory_kind']}), "
      f"validation ppl {r['final']['validation']['perplexity']:.2f}")
EOF

echo "== resume"
tiedlm train -c configs/base.yaml --set train.device=cuda --set "train.max_steps=$STEPS" \
  --set train.checkpoint_every=50 --out "$RUNS" --name resume -q >"$OUT/resume.log" 2>&1 &
pid=$!
for _ in $(seq 600); do  # interrupt once the first checkpoint exists (at most a minute)
  [ -f "$RUNS/resume/checkpoints/LATEST" ] && break
  sleep 0.1
done
kill -INT "$pid" 2>/dev/null
wait "$pid"
echo "interrupted: exit $?" >>"$OUT/resume.log"
step resume-again tiedlm train -c configs/base.yaml --set train.device=cuda --set "train.max_steps=$STEPS" \
  --set train.checkpoint_every=50 --out "$RUNS" --name resume -q
python - "$RUNS/resume/report.json" "$RUNS/cuda/report.json" <<'EOF' | tee -a "$OUT/resume-again.log"
import json, sys
a, b = (json.load(open(p)) for p in sys.argv[1:3])
assert a.get("resumed_at_steps"), "the run was not interrupted before it finished: no resume was tested"
print(f"resumed at {a.get('resumed_at_steps')}; status {a['status']}; validation loss {a['final']['validation']['loss']:.6f} "
      f"vs uninterrupted {b['final']['validation']['loss']:.6f} (CUDA kernels need not be bit-identical)")
EOF

step compile tiedlm train -c configs/base.yaml --set train.device=cuda --set train.compile=true \
  --set "train.max_steps=$STEPS" --out "$RUNS" --name compiled -q
step tests python -m pytest -q tests/test_performance.py tests/test_device.py -k "cuda or fused"

echo
echo "== summary (outputs in $OUT)"
printf '%s\n' "${summary[@]}"
