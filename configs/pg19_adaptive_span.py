"""Adaptive-Span on PG-19 for a TPU pod slice: configs/pg19_xl.py with spans up to 4096.

Spans start at 0 and use the default ramp R = 32. Data and tokenizer
preparation as in configs/pg19_xl.py. Layers are unrolled
(`scan_layers=False`): `jax.lax.switch` picks the trimmed size per layer.
"""

from configs import pg19_xl
from longformer_jax.config.overrides import merged


def get_config() -> dict:
  return merged(pg19_xl.get_config(), {
      'model': {
          'attention': 'adaptive_span',
          'mem_len': 4096,                     # memory kept per layer; S = mem_len
          'scan_layers': False,
          'adaptive_span': {'block': 256},     # trimming granularity
          'aux_loss_weights': {'span_loss': 2e-6},
      },
      'eval': {'mem_lens': '4096'},
  })
