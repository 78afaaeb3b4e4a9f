"""Adaptive-Span (Sukhbaatar et al., 2019) at the budget of configs/xl_small.py.

Memory of S = 256 hidden states per layer; each head starts with span
z = 128 (XL's memory) and learns to grow or shrink it under the L1 penalty.
Attention and key/value projections run over the newest
ceil(R + max z) entries, rounded up to 64.

  python train.py --config=configs/adaptive_span.py --workdir=runs/adaptive_span
  python eval.py --workdir=runs/adaptive_span     # also writes eval/spans.json and a plot
"""

from configs import xl_small


def get_config():
  config = xl_small.get_config()
  config.model.attention = 'adaptive_span'
  config.model.mem_len = 256             # memory kept per layer
  config.model.span_max = 256            # S, the largest span (fixed, so eval-time mem_len
                                         # changes do not rescale the learned spans)
  config.model.span_init = 0.5           # z / S at initialisation
  config.model.span_ramp = 32.0          # R, the soft mask's ramp
  config.model.span_block = 64           # trimming granularity
  config.model.span_dynamic = False      # True: z_t = S sigmoid(v.x_t + b) per token
  config.model.aux_loss_weights.span_loss = 1e-5   # lambda of the L1 span penalty
  return config
