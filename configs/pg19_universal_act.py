"""Universal Transformer with ACT on PG-19 for a TPU pod slice.

One shared block of configs/pg19_xl.py's width applied up to 8 times, each
step with its own XL memory. The stack loops over its steps itself: no
`scan_layers`, and no rematerialisation (`remat_policy='none'`). Data and
tokenizer preparation as in configs/pg19_xl.py.
"""

from configs import pg19_xl
from longformer_jax.config.overrides import merged


def get_config() -> dict:
  return merged(pg19_xl.get_config(), {
      'model': {
          'stack': 'universal_act',                  # models/universal_stack.py
          'scan_layers': False,
          'remat_policy': 'none',
          'universal_act': {'max_steps': 8},         # epsilon: the default 0.01
          'aux_loss_weights': {'ponder_loss': 0.01},  # tau of the ponder cost
      },
  })
