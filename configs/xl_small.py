"""Transformer-XL at the small budget shared by the memory-variant comparison.

The default model (4 layers, d_model 256, chunk 256, memory 128) trained for
300 steps instead of 900: the budget every memory variant of the comparison
table in docs/results.md gets (configs/compressive.py, adaptive_span.py,
expire_span.py, gtrxl.py, universal_act.py start from this file).

  python train.py --config=configs/xl_small.py --workdir=runs/xl_small
  python eval.py --workdir=runs/xl_small
"""

from configs import default
from longformer_jax.config.overrides import merged


def get_config() -> dict:
  return merged(default.model_config(), {
      'optimizer': {'warmup_steps': 30},
      'train': {'num_steps': 300},       # evaluated and saved at the end (every 300)
  })
