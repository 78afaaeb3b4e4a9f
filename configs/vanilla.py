"""The default model with vanilla (RoPE, causal) attention and no memory.

The baseline for Transformer-XL: same size, data and budget as
configs/default.py, but each chunk sees only itself.
"""

def get_config() -> dict:
  return {'model': {'attention': 'vanilla'}}
