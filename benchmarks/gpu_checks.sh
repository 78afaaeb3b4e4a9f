#!/usr/bin/env bash
# The GPU checks of docs/kernels.md and docs/benchmarks.md, in priority order, each under a
# time limit, for one GPU machine (at most 10 minutes; about 7 on an H200):
#
#   bash benchmarks/gpu_checks.sh [OUT_DIR]        # PYTHON=... to pick the interpreter
#
# 0. JAX's version and device; the float32 and bfloat16 matmul rates (8192^3).
# 1. tests/attention/test_block_sparse_flash.py (the Pallas kernel compiled by Triton:
#    interpret mode is off on a GPU) and tests/attention/test_cudnn_attention.py (cuDNN: dense
#    mask, sliding window with packed documents, the log-sum-exp gradient, the Longformer causal / two-sided and
#    StreamingLLM layers) against their float32 references, computed at full precision
#    (JAX_DEFAULT_MATMUL_PRECISION=highest: a GPU's default float32 matmul is TF32).
# 2. attention_scaling.py at 16k, forward + backward, median of 10: cuDNN's causal and window
#    rows, the Longformer layer's cuDNN window, the Pallas block-sparse kernel on the Sparse
#    Transformer's strided and BigBird's patterns, and the XLA blocked kernels of the same
#    patterns (what `auto` ran on a GPU before).
# 3. block_sparse_tuning.py: the Pallas kernel's tuning grid beside cuDNN, in one process
#    (about 45 s; docs/benchmarks.md, "Tuning the Pallas kernel"). The rows of 128 x 64
#    tiles, not yet timed, run right after the default, so the budget cuts old rows first;
#    their gradients against the default's are the compiled check of those tiles.
# 4. train_throughput.py: tokens/s and MFU of an XL model with pg19_xl.py's widths (4 layers)
#    on the built-in corpus, bfloat16 (the MFU over the float32 rate is printed; divide by
#    the bfloat16 rate of step 0 for the bfloat16 figure).
# Each step's output is in OUT_DIR (default gpu_checks_out); a step that fails does not stop
# the next.
set -u
cd "$(dirname "$0")/.."
OUT=${1:-gpu_checks_out}
PY=${PYTHON:-python3}
mkdir -p "$OUT"
export JAX_PLATFORMS=cuda PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
"$PY" - <<'EOF' 2>&1 | tee "$OUT/device.txt"
import jax, jax.numpy as jnp, flax
from benchmarks.matmul_rate import measure
print('jax', jax.__version__, 'flax', flax.__version__, jax.devices())
for dtype in (jnp.float32, jnp.bfloat16):
  rate = measure(dtype=dtype)
  print(f'matmul {jnp.dtype(dtype).name} {rate.size}^3: best {rate.best_flops_per_s / 1e12:.1f} '
        f'median {rate.median_flops_per_s / 1e12:.1f} TFLOP/s')
EOF
# 30 tests, about 7 s each to compile on a GPU: two workers (pytest.ini's -n 2).
JAX_DEFAULT_MATMUL_PRECISION=highest timeout 240 "$PY" -m pytest -q -p no:cacheprovider \
  tests/attention/test_block_sparse_flash.py tests/attention/test_cudnn_attention.py 2>&1 \
  | tee "$OUT/kernel_tests.log" | tail -25
timeout 180 "$PY" benchmarks/attention_scaling.py --no_peer --no_host_peak --repeats 10 \
  --seq_lens 16384 --modes fwd_bwd --timeout 60 --out "$OUT/attention_gpu.json" --variants \
  cudnn_causal,cudnn_window,longformer_cudnn_window,pallas_sparse_strided,pallas_bigbird,sparse_strided_blocked,bigbird_blocked \
  2>&1 | tee "$OUT/attention.log" | cut -c1-400
timeout 80 "$PY" benchmarks/block_sparse_tuning.py --budget_s 50 --out "$OUT/tuning.json" \
  2>&1 | tee "$OUT/tuning.log" | cut -c1-200
timeout 100 "$PY" benchmarks/train_throughput.py --config=configs/default.py --steps=200 \
  --config.model.num_layers=4 --config.model.d_model=1024 --config.model.num_heads=16 \
  --config.model.d_ff=4096 --config.model.dtype=bfloat16 --config.data.batch_size=16 \
  --config.data.chunk_len=512 --config.model.mem_len=512 2>&1 | tee "$OUT/throughput.log" | tail -4
