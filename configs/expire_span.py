"""Expire-Span (Sukhbaatar et al., 2021) at the small budget of configs/xl_small.py.

Same size, data and steps as xl_small. Each memory entry lives at most
L = 512 tokens (soft phase-out over R = 32); the memory holds at most 256
entries (`mem_len` is the capacity: expired entries are dropped, the oldest
go first if more are alive).

  python train.py --config=configs/expire_span.py --workdir=runs/expire_span
"""

from configs import xl_small


def get_config():
  config = xl_small.get_config()
  config.model.attention = 'expire_span'
  config.model.mem_len = 256                   # capacity (an upper bound)
  config.model.expire_span_max = 512           # L
  config.model.expire_span_ramp = 32           # R
  config.model.expire_span_init_fraction = 0.5  # initial e_i / L
  config.model.expire_span_shorten = False     # random memory shortening in training
  # alpha of the penalty alpha * sum_i e_i / T (e_i in tokens).
  config.model.aux_loss_weights.expire_span_loss = 1e-6
  return config
