#!/usr/bin/env bash
# The GPU checks of docs/kernels.md and docs/benchmarks.md, in priority order, each under a
# time limit, for one GPU machine (about 10 minutes in all):
#
#   bash benchmarks/gpu_checks.sh [OUT_DIR]
#
# 1. tests/test_cudnn_attention.py: cuDNN (dense mask, sliding window with packed documents,
#    the log-sum-exp gradient, the Longformer causal / two-sided and StreamingLLM layers)
#    against XLA on the GPU.
# 2. tests/test_block_sparse_flash.py: the Pallas kernel compiled by Triton (interpret mode is off on a GPU).
# 3. attention_scaling.py at 16k, forward + backward: cuDNN's own window and causal rows, the
#    layers' cuDNN window paths, and the Pallas block-sparse kernel.
# 4. train_throughput.py: tokens/s and MFU of an XL model with pg19_xl.py's widths (4 layers)
#    on the built-in corpus, bfloat16.
# Each step's output is in OUT_DIR (default gpu_checks_out); a step that fails does not stop
# the next.
set -u
cd "$(dirname "$0")/.."
OUT=${1:-gpu_checks_out}
mkdir -p "$OUT"
export JAX_PLATFORMS=cuda PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
python -c "import jax; print(jax.__version__, jax.devices())" | tee "$OUT/device.txt"
timeout 180 python -m pytest -q -p no:cacheprovider tests/test_cudnn_attention.py \
  2>&1 | tee "$OUT/cudnn_tests.log" | tail -5
timeout 150 python -m pytest -q -p no:cacheprovider tests/test_block_sparse_flash.py \
  -k "equals_dense" 2>&1 | tee "$OUT/pallas_tests.log" | tail -5
timeout 240 python benchmarks/attention_scaling.py --no_peer --repeats 5 --seq_lens 16384 \
  --modes fwd_bwd --timeout 60 --out "$OUT/attention_gpu.json" --variants \
  cudnn_causal,cudnn_window,longformer_cudnn_window,longformer_cudnn_window_docs,longformer_cudnn_window_lse,pallas_sparse_strided,pallas_bigbird \
  2>&1 | tee "$OUT/attention.log" | cut -c1-300
timeout 180 python benchmarks/train_throughput.py --config=configs/default.py --steps=40 \
  --config.model.num_layers=4 --config.model.d_model=1024 --config.model.num_heads=16 \
  --config.model.d_ff=4096 --config.model.dtype=bfloat16 --config.data.batch_size=16 \
  --config.data.chunk_len=512 --config.model.mem_len=512 2>&1 | tee "$OUT/throughput.log" | tail -3
