"""Expire-Span (Sukhbaatar et al., 2021) at the small budget of configs/xl_small.py.

Same size, data and steps as xl_small. Each memory entry lives at most
L = 512 tokens (soft phase-out over the default R = 32; initial spans
e_i = L / 2, no random memory shortening); the memory holds at most 256
entries (`mem_len` is the capacity: expired entries are dropped, the oldest
go first if more are alive).

  python train.py --config=configs/expire_span.py --workdir=runs/expire_span
"""

from configs import xl_small
from longformer_jax.config.overrides import merged


def get_config() -> dict:
  return merged(xl_small.get_config(), {
      'model': {
          'attention': 'expire_span',
          'mem_len': 256,                    # capacity (an upper bound)
          'expire_span': {'max_span': 512},  # L
          # alpha of the penalty alpha * sum_i e_i / T (e_i in tokens).
          'aux_loss_weights': {'expire_span_loss': 1e-6},
      },
  })
