"""Compressive Transformer (Rae et al., 2019) at the small budget of configs/xl_small.py.

Same size, data and steps as xl_small; the XL memory of 128 is kept and a
compressed memory of 128 entries is added: each chunk's 256 evicted entries
become 64 (rate 4, 1D convolution), so the layer sees 128 + 4 * 128 = 640
past tokens at the attention cost of 256 memory entries.

  python train.py --config=configs/compressive.py --workdir=runs/compressive
"""

from configs import xl_small


def get_config():
  config = xl_small.get_config()
  config.model.attention = 'compressive'
  config.model.compressed_mem_len = 128   # n_cm
  config.model.compression = 'conv'       # max_pool | mean_pool | conv | dilated_conv | most_used
  config.model.compression_rate = 4       # c
  config.model.compression_kernel = 4     # dilated_conv only: window length
  config.model.compression_dilation = 2   # dilated_conv only
  # The attention-reconstruction loss trains only the compression network.
  config.model.aux_loss_weights.reconstruction_loss = 1.0
  return config
