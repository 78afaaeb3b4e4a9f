"""Universal Transformer with ACT (Dehghani et al., 2019): one shared XL block, up to 4 steps.

Same width, memory and budget as configs/xl_small.py; the block's parameters
are shared across the steps (a quarter of the 4-layer model's). The ACT
settings are the defaults of `model.universal_act` (max_steps 4, epsilon
0.01). Ponder cost weight 0.01 as in the UT code.

  python train.py --config=configs/universal_act.py --workdir=runs/universal_act
"""

from configs import xl_small
from longformer_jax.config.overrides import merged


def get_config() -> dict:
  return merged(xl_small.get_config(), {
      'model': {
          'stack': 'universal_act',                  # models/universal_stack.py
          'aux_loss_weights': {'ponder_loss': 0.01},  # tau of the ponder cost
      },
  })
