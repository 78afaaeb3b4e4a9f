"""Compressive Transformer on PG-19 for a TPU pod slice (cf. Rae et al., 2019, PG-19 experiments).

configs/pg19_xl.py with a compressed memory: chunk 512, memory 512,
compressed memory 512 at rate 2 (1D convolution). The paper's PG-19 model
has 36 layers and window, memory and compressed memory of 512; this one
keeps pg19_xl's 16 layers so that the two compare at equal size. Data and tokenizer
preparation as in configs/pg19_xl.py.
"""

from configs import pg19_xl


def get_config():
  config = pg19_xl.get_config()
  config.model.update(attention='compressive', compressed_mem_len=512, compression='conv',
                      compression_rate=2, compression_kernel=2, compression_dilation=2)
  config.model.aux_loss_weights.reconstruction_loss = 1.0
  config.eval.mem_lens = '512'            # the compressed memory keeps its training size
  return config
