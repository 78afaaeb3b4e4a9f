"""Memorizing Transformer (Wu et al., 2022) on the built-in corpus.

The default model's size and budget; layer 3 of 4 is a Memorizing layer
(local RoPE attention over the chunk and a 128-token cache, plus the top-32
(key, value) pairs per head from a FIFO kNN memory of the document's last
2048 tokens, combined by the learned per-head gate), the other layers are
vanilla RoPE attention with the same 128-token cache. The other settings of
`model.memorizing` keep their defaults: `top_k` 32, exact top-k
(`method='exact'`; 'approx' is lax.approx_max_k), `gate='learned'`, the
learned q.k scale starting at `qk_scale_init` 16, plain RoPE
(`rope_max_distance` -1).

  python train.py --config=configs/memorizing.py --workdir=workdirs/memorizing
  python eval.py --workdir=workdirs/memorizing     # the trained settings (DIR/config.json)

Evaluation-time kNN memory for a model trained with configs/vanilla.py
(the layer then uses `gate='joint'`, `normalize_qk=False`: no parameter
beyond vanilla's; see longformer_jax/attention/memorizing.py and
longformer_jax/evaluation/memory_sweep.py):
  python eval.py --workdir=workdirs/vanilla \
      --config.eval.memory_sweep='variant=memorizing;memory_size=512,2048;top_k=32'
"""

from configs import default
from longformer_jax.config.overrides import merged


def get_config() -> dict:
  return merged(default.model_config(), {
      'model': {
          'attention': 'vanilla',
          'mem_len': 128,                # local cache (hidden states, RoPE) of every layer
          'layer_schedule': {'attention': 'vanilla,vanilla,memorizing,vanilla'},
          'memorizing': {
              'memory_size': 2048,       # (key, value) entries per row in the kNN layer
              'normalize_qk': True,      # L2-normalised q, k with a learned scale (the paper)
          },
      },
  })
