#!/usr/bin/env bash
# Passkey retrieval trained with each memory in the loop (docs/passkey.md).
#
#   bash benchmarks/passkey_memories.sh MEMORY [MEMORY ...]
#
# For each MEMORY of configs/passkey_memory.py: trains it into workdirs/passkey_MEMORY
# (skipped when its last checkpoint, step 3000, exists), evaluates its passkey grid, and copies the grid's
# JSON to benchmarks/results/passkey/trained_MEMORY.json. `eval_time` instead evaluates the
# model trained without memory (`none`) with the eval-time memories of evaluation/memory_sweep.py
# and writes benchmarks/results/passkey/eval_time.json. The heat maps stay in
# workdirs/passkey_MEMORY/eval/. GRID_DOCUMENTS (default 16) and MAX_LENGTH (default 16384,
# the grids in docs/passkey.md; 65536 for the long ones) size the grids; LENGTHS (default:
# 256, 512, ... MAX_LENGTH) picks lengths, e.g. LENGTHS=256,1024,4096,16384.
set -euo pipefail
cd "$(dirname "$0")/.."
DOCS=${GRID_DOCUMENTS:-16}
MAX=${MAX_LENGTH:-16384}
OUT=benchmarks/results/passkey
if [[ -n ${LENGTHS:-} ]]; then SPAN="lengths=$LENGTHS"; else SPAN="max_length=$MAX"; fi
mkdir -p "$OUT"

grid_for() {   # the memories each model is scored with
  case "$1" in
    knn) echo "trained:$MAX,trained:512" ;;    # the whole document; a FIFO of 512
    # LRA-max as trained, and the same weights evicting FIFO or LFA (the eviction alone differs)
    attendre_lra_max) echo "trained,attendre_fifo:128,attendre_lfa:128" ;;
    attendre_lra_max_score) echo "trained,attendre_lra_max:128,attendre_fifo:128,attendre_lfa:128" ;;
    eval_time) echo "none,xl:128,sinks:128,attendre_fifo:128,attendre_lra_max:128,attendre_lfa:128,knn:2048" ;;
    *) echo "trained" ;;
  esac
}

for memory in "$@"; do
  model=$memory
  [[ $memory == eval_time ]] && model=none
  workdir=workdirs/passkey_$model
  if [[ ! -d $workdir/checkpoints/3000 ]]; then      # the config's last step: not yet trained
    /usr/bin/time -f "train $model: wall %e s, peak RSS %M KiB" \
        python train.py --config=configs/passkey_memory.py:$model --workdir="$workdir"
  fi
  python eval.py --config=configs/passkey_memory.py:$model --workdir="$workdir" \
      --config.eval.passkey_grid="$SPAN;documents=$DOCS;memories=$(grid_for "$memory")"
  if [[ $memory == eval_time ]]; then
    cp "$workdir/eval/passkey_grid.json" "$OUT/eval_time.json"
  else
    cp "$workdir/eval/passkey_grid.json" "$OUT/trained_$memory.json"
  fi
done
