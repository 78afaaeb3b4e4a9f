"""Default: a small Transformer-XL byte-level LM on the built-in corpus.

Every other setting is the default of the section that owns it (see
docs/design.md, "Configuration"): 4 layers of d_model 256, chunks of 256
bytes, batch 8. 700 steps (validation and a checkpoint at 350 and 700), so
that `python train.py` then `python eval.py` (no flags) take about 10
minutes together on a 2-core CPU, with the learning rate's cosine ending at 0
(0.1 of the peak by default: 2.475 bits/byte instead of 2.507 on the whole
validation split); docs/results.md has the measured result.
"""


def model_config() -> dict:
  """The default model alone, for configs that build on it with their own budget."""
  return {
      'model': {
          'attention': 'xl',
          'mem_len': 128,       # XL memory length used in training
      },
  }


def get_config() -> dict:
  config = model_config()
  config['train'] = {'num_steps': 700, 'eval_every': 350, 'checkpoint_every': 350}
  config['optimizer'] = {'end_learning_rate_fraction': 0.0}
  return config
