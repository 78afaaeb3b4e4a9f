"""The default model with vanilla (RoPE, causal) attention and no memory.

The baseline for Transformer-XL: same size, data and budget as
configs/default.py, but each chunk sees only itself.
"""

from configs import default


def get_config():
  config = default.get_config()
  config.model.attention = 'vanilla'
  config.model.mem_len = 0
  return config
