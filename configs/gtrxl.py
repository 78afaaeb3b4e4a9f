"""GTrXL (Parisotto et al., 2019): Transformer-XL with GRU gates in place of residuals.

Same size and budget as configs/xl_small.py. The gates are the defaults of
`model.gtrxl`: gate 'gru' (others: output | highway), gate_bias b_g = 2.0
(> 0: each block starts near the identity) and a ReLU on the sub-layer
outputs, as in the paper.

  python train.py --config=configs/gtrxl.py --workdir=runs/gtrxl
"""

from configs import xl_small
from longformer_jax.config.overrides import merged


def get_config() -> dict:
  return merged(xl_small.get_config(), {
      'model': {'block': 'gtrxl'},   # gated residuals (models/gtrxl_block.py)
  })
