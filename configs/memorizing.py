"""Memorizing Transformer (Wu et al., 2022) on the built-in corpus.

The default model's size and budget; layer 3 of 4 is a Memorizing layer
(local RoPE attention over the chunk and a 128-token cache, plus the top-32
(key, value) pairs per head from a FIFO kNN memory of the document's last
2048 tokens, combined by the learned per-head gate), the other layers are
vanilla RoPE attention with the same 128-token cache.

  python train.py --config=configs/memorizing.py --workdir=workdirs/memorizing
  python eval.py --workdir=workdirs/memorizing     # the trained settings (DIR/config.json)

Evaluation-time kNN memory for a model trained with configs/vanilla.py
(the layer then uses `knn_gate='joint'`, `knn_normalize_qk=False`: no
parameter beyond vanilla's; see longformer_jax/attention/memorizing.py and
longformer_jax/evaluation/memory_sweep.py):
  python eval.py --workdir=workdirs/vanilla \
      --config.eval.memory_sweep='variant=memorizing;memory_size=512,2048;knn_top_k=32'
"""

from configs import default


def get_config():
  config = default.get_config()
  config.model.attention = 'vanilla'
  config.model.mem_len = 128                   # local cache (hidden states, RoPE) of every layer
  config.model.layer_schedule.attention = 'vanilla,vanilla,memorizing,vanilla'
  config.model.knn_memory_size = 2048          # (key, value) entries per row in the kNN layer
  config.model.knn_top_k = 32                  # retrieved per query and head
  config.model.knn_method = 'exact'            # exact (lax.top_k) | approx (lax.approx_max_k)
  config.model.knn_recall_target = 0.95        # approx only (exact on CPU anyway)
  config.model.knn_gate = 'learned'            # learned | fixed | memory_only | joint
  config.model.knn_gate_value = 0.5            # knn_gate='fixed'
  config.model.knn_normalize_qk = True         # L2-normalised q, k with a learned scale (the paper)
  config.model.knn_qk_scale_init = 16.0
  config.model.rope_max_distance = -1          # LM-Infinite cap of local RoPE distances (-1: off)
  return config
