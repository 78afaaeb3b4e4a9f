"""GTrXL on PG-19 for a TPU pod slice: configs/pg19_xl.py with GRU-gated blocks.

The gates are the defaults of `model.gtrxl` (GRU, b_g = 2.0, ReLU). Data and
tokenizer preparation as in configs/pg19_xl.py.
"""

from configs import pg19_xl
from longformer_jax.config.overrides import merged


def get_config() -> dict:
  return merged(pg19_xl.get_config(), {
      'model': {'block': 'gtrxl'},   # gated residuals (models/gtrxl_block.py)
  })
