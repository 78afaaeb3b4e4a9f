"""Expire-Span on PG-19 for a TPU pod slice: configs/pg19_xl.py with expiring memories.

Chunk 512, spans up to L = 8192 tokens, at most 2048 live entries per layer,
ramp R = 128, random memory shortening on. Data and tokenizer preparation as
in configs/pg19_xl.py.
"""

from configs import pg19_xl
from longformer_jax.config.overrides import merged


def get_config() -> dict:
  return merged(pg19_xl.get_config(), {
      'model': {
          'attention': 'expire_span',
          'mem_len': 2048,                   # capacity (an upper bound)
          'expire_span': {
              'max_span': 8192,              # L
              'ramp': 128,                   # R
              'init_fraction': 0.1,          # initial e_i / L
              'shorten': True,               # random memory shortening in training
          },
          'aux_loss_weights': {'expire_span_loss': 1e-6},
      },
      'eval': {'mem_lens': '2048'},
  })
