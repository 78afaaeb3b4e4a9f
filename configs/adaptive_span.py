"""Adaptive-Span (Sukhbaatar et al., 2019) at the budget of configs/xl_small.py.

Memory of S = 256 hidden states per layer; each head starts with span
z = 128 (XL's memory) and learns to grow or shrink it under the L1 penalty.
Attention and key/value projections run over the newest
ceil(R + max z) entries, rounded up to 64 (the defaults: ramp R = 32,
block 64, learned per-head spans, `dynamic=False`).

  python train.py --config=configs/adaptive_span.py --workdir=runs/adaptive_span
  python eval.py --workdir=runs/adaptive_span     # also writes eval/spans.json and a plot
"""

from configs import xl_small
from longformer_jax.config.overrides import merged


def get_config() -> dict:
  return merged(xl_small.get_config(), {
      'model': {
          'attention': 'adaptive_span',
          'mem_len': 256,              # memory kept per layer
          'adaptive_span': {
              'max_span': 256,         # S, the largest span (fixed, so eval-time mem_len
                                       # changes do not rescale the learned spans)
              'init': 0.5,             # z / S at initialisation
          },
          'aux_loss_weights': {'span_loss': 1e-5},   # lambda of the L1 span penalty
      },
  })
