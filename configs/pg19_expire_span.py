"""Expire-Span on PG-19 for a TPU pod slice: configs/pg19_xl.py with expiring memories.

Chunk 512, spans up to L = 8192 tokens, at most 2048 live entries per layer,
ramp R = 128, random memory shortening on. Data and tokenizer preparation as
in configs/pg19_xl.py.
"""

from configs import pg19_xl


def get_config():
  config = pg19_xl.get_config()
  config.model.update(attention='expire_span', mem_len=2048, expire_span_max=8192,
                      expire_span_ramp=128, expire_span_init_fraction=0.1,
                      expire_span_shorten=True)
  config.model.aux_loss_weights.expire_span_loss = 1e-6
  config.eval.mem_lens = '2048'
  return config
