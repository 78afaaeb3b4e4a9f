"""Compressive Transformer (Rae et al., 2019) at the small budget of configs/xl_small.py.

Same size, data and steps as xl_small; the XL memory of 128 is kept and a
compressed memory of 128 entries is added: each chunk's 256 evicted entries
become 64 (rate 4, the default 1D convolution `function='conv'`; others:
max_pool | mean_pool | dilated_conv | most_used), so the layer sees
128 + 4 * 128 = 640 past tokens at the attention cost of 256 memory entries.

  python train.py --config=configs/compressive.py --workdir=runs/compressive
"""

from configs import xl_small
from longformer_jax.config.overrides import merged


def get_config() -> dict:
  return merged(xl_small.get_config(), {
      'model': {
          'attention': 'compressive',
          'compressive': {
              'compressed_mem_len': 128,   # n_cm
              'rate': 4,                   # c
          },
          # The attention-reconstruction loss trains only the compression network.
          'aux_loss_weights': {'reconstruction_loss': 1.0},
      },
  })
