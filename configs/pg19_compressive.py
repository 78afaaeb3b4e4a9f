"""Compressive Transformer on PG-19 for a TPU pod slice (cf. Rae et al., 2019, PG-19 experiments).

configs/pg19_xl.py with a compressed memory: chunk 512, memory 512,
compressed memory 512 at rate 2 (1D convolution, the default function). The
paper's PG-19 model has 36 layers and window, memory and compressed memory
of 512; this one keeps pg19_xl's 16 layers so that the two compare at equal
size. Data and tokenizer preparation as in configs/pg19_xl.py.
"""

from configs import pg19_xl
from longformer_jax.config.overrides import merged


def get_config() -> dict:
  return merged(pg19_xl.get_config(), {
      'model': {
          'attention': 'compressive',
          'compressive': {'compressed_mem_len': 512,   # n_cm
                          'rate': 2},                  # c
          'aux_loss_weights': {'reconstruction_loss': 1.0},
      },
      'eval': {'mem_lens': '512'},           # the compressed memory keeps its training size
  })
