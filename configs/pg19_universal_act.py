"""Universal Transformer with ACT on PG-19 for a TPU pod slice.

One shared block of configs/pg19_xl.py's width applied up to 8 times, each
step with its own XL memory. Data and tokenizer preparation as in
configs/pg19_xl.py.
"""

from configs import pg19_xl


def get_config():
  config = pg19_xl.get_config()
  config.model.update(stack='universal_act', act_max_steps=8, act_epsilon=0.01,
                      scan_layers=False)
  config.model.aux_loss_weights.ponder_loss = 0.01
  return config
