"""Adaptive-Span on PG-19 for a TPU pod slice: configs/pg19_xl.py with spans up to 4096.

Data and tokenizer preparation as in configs/pg19_xl.py. Layers are
unrolled (`scan_layers=False`): `jax.lax.switch` picks the trimmed size
per layer.
"""

from configs import pg19_xl


def get_config():
  config = pg19_xl.get_config()
  config.model.update(attention='adaptive_span', mem_len=4096, span_init=0.0, span_ramp=32.0,
                      span_block=256, span_dynamic=False, scan_layers=False)
  config.model.aux_loss_weights.span_loss = 2e-6
  config.eval.mem_lens = '4096'
  return config
