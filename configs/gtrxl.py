"""GTrXL (Parisotto et al., 2019): Transformer-XL with GRU gates in place of residuals.

Same size and budget as configs/xl_small.py.

  python train.py --config=configs/gtrxl.py --workdir=runs/gtrxl
"""

from configs import xl_small


def get_config():
  config = xl_small.get_config()
  config.model.block = 'gtrxl'
  config.model.gtrxl_gate = 'gru'        # gru | output | highway
  config.model.gtrxl_gate_bias = 2.0     # b_g > 0: each block starts near the identity
  config.model.gtrxl_relu = True         # ReLU on the sub-layer outputs, as in the paper
  return config
