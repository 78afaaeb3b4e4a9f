#!/usr/bin/env bash
# The 1B-parameter training steps of docs/benchmarks.md ("1B parameters on one GPU"), in
# priority order, each under a time limit, for one GPU machine (at most 10 minutes):
#
#   bash benchmarks/gpu_1b_steps.sh [OUT_DIR]      # PYTHON=..., STEPS=..., XL_BATCH=... to change
#
# Each is benchmarks/train_throughput.py on the 1B widths of configs/pod_sizes.py (20 layers,
# d_model 2,048, 16 heads of 128, d_ff 8,192), bfloat16, remat 'full', the byte tokenizer on
# the built-in corpus (no data to fetch), one device: tokens/s, MFU over the measured bfloat16
# matmul rate, and the device's peak bytes against memory_check.py's prediction:
# 1. Transformer-XL, chunks of 8,192 with a memory of 2,048 (configs/pod_xl.py);
# 2. Longformer, chunks of 16,384, window 512 (configs/pod_longformer.py; the cuDNN window);
# 3. BigBird, chunks of 16,384 in blocks of 64 (configs/pod_bigbird.py; the Pallas block-sparse kernel).
# Batches (XL_BATCH, LONGFORMER_BATCH, BIGBIRD_BATCH) are the largest that memory_check.py
# puts under 100 GiB of one device (docs/benchmarks.md). Each step's output is in OUT_DIR
# (default gpu_1b_out); a step that fails does not stop the next.
set -u
cd "$(dirname "$0")/.."
OUT=${1:-gpu_1b_out}
PY=${PYTHON:-python3}
STEPS=${STEPS:-12}
mkdir -p "$OUT"
export JAX_PLATFORMS=${JAX_PLATFORMS:-cuda} PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
COMMON=(--steps="$STEPS" --windows=2 --rate_dtype=bfloat16 --peak_memory
        --config.data.corpus=stdlib --config.data.tokenizer=byte
        --config.parallel.mesh_shape='(1,1,1)' --config.train.log_every=1)
step() {  # name, seconds, config, batch, then overrides
  local name=$1 limit=$2 config=$3 batch=$4
  shift 4
  timeout "$limit" "$PY" benchmarks/train_throughput.py --config="$config" "${COMMON[@]}" \
    --config.data.batch_size="$batch" --config.data.eval_batch_size="$batch" "$@" 2>&1 \
    | tee "$OUT/$name.log" | tail -5
}
step xl_1b 240 configs/pod_xl.py:1b_v5p128 "${XL_BATCH:-4}" \
  --config.data.chunk_len=8192 --config.data.chunks_per_step=1 ${XL_EXTRA:-}
step longformer_1b 180 configs/pod_longformer.py:1b_32k_v5p128 "${LONGFORMER_BATCH:-8}" \
  --config.data.chunk_len=16384 ${LONGFORMER_EXTRA:-}
step bigbird_1b 180 configs/pod_bigbird.py:1b_32k_v5p128 "${BIGBIRD_BATCH:-8}" \
  --config.data.chunk_len=16384 ${BIGBIRD_EXTRA:-}
