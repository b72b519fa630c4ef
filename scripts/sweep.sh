#!/usr/bin/env bash
# A tied-vs-untied sweep as a plain shell loop: N seeds x {tied, untied}, then one comparison.
# `tiedlm sweep GRID.yaml` does the same from a grid file; this is the version to copy and edit.
#
# usage: scripts/sweep.sh [CONFIG] [SEEDS] [OUT] [extra tiedlm train options...]
#   scripts/sweep.sh configs/base.yaml 3 runs --set train.max_steps=200
#
# Re-running is safe: `tiedlm train` skips finished runs and resumes interrupted ones.
# Runs that fail do not stop the loop; the script exits 1 at the end if any failed.
set -u

config=${1:-configs/base.yaml}
seeds=${2:-3}
out=${3:-runs}
shift $(( $# < 3 ? $# : 3 ))
extra=("$@")                      # e.g. --set train.max_steps=200
stem=$(basename "$config" .yaml)

failed=()
for seed in $(seq 0 $((seeds - 1))); do
  for tie in true false; do
    if [ "$tie" = true ]; then variant=tied; else variant=untied; fi
    name="$stem-$variant-s$seed"
    echo "== $name" >&2
    if ! tiedlm train --config "$config" --set "model.tie_embeddings=$tie" ${extra[@]+"${extra[@]}"} \
        --seed "$seed" --name "$name" --out "$out"; then
      failed+=("$name")
    fi
  done
done

# the globs are quoted so that tiedlm expands them (and says so when nothing matches);
# the comparison goes to $out/compare-NAME/, NAME the name its runs share
tiedlm compare "$out/$stem-tied-s*" "$out/$stem-untied-s*" --out "$out" || failed+=(compare)

if [ ${#failed[@]} -gt 0 ]; then
  echo "failed: ${failed[*]}" >&2
  exit 1
fi
