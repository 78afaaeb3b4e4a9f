"""GTrXL on PG-19 for a TPU pod slice: configs/pg19_xl.py with GRU-gated blocks.

Data and tokenizer preparation as in configs/pg19_xl.py.
"""

from configs import pg19_xl


def get_config():
  config = pg19_xl.get_config()
  config.model.update(block='gtrxl', gtrxl_gate='gru', gtrxl_gate_bias=2.0, gtrxl_relu=True)
  return config
