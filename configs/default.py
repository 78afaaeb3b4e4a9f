"""Default: a small Transformer-XL byte-level LM on the built-in corpus.

Every other setting is the default of the section that owns it (see
docs/design.md, "Configuration"): 4 layers of d_model 256, chunks of 256
bytes, batch 8, 900 steps. Sized so that `python train.py` (no flags)
finishes in about 10 minutes on a 2-core CPU; docs/results.md has the
measured result.
"""


def get_config() -> dict:
  return {
      'model': {
          'attention': 'xl',
          'mem_len': 128,       # XL memory length used in training
      },
  }
