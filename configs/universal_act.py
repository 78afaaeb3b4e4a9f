"""Universal Transformer with ACT (Dehghani et al., 2019): one shared XL block, up to 4 steps.

Same width, memory and budget as configs/xl_small.py; the block's parameters
are shared across the steps (a quarter of the 4-layer model's). Ponder cost
weight 0.01 as in the UT code.

  python train.py --config=configs/universal_act.py --workdir=runs/universal_act
"""

from configs import xl_small


def get_config():
  config = xl_small.get_config()
  config.model.stack = 'universal_act'
  config.model.act_max_steps = 4
  config.model.act_epsilon = 0.01
  config.model.aux_loss_weights.ponder_loss = 0.01
  return config
