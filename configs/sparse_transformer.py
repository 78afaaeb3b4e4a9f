r"""Sparse Transformer (Child et al., 2019) as a causal byte-level LM on the built-in corpus.

Factorized attention within each chunk (no memory): the default's chunks of
256 bytes, stride / block l = 16 = sqrt(256) (the paper picks l ~ sqrt(n));
the fixed pattern keeps c = 2 summary positions per block. The optional argument
after ':' picks the pattern and the integration (section 4.3), comma-separated:

  strided | fixed                      the factorized pattern (default strided)
  merged | multihead | interleaved     one head over the union (default); heads
                                       split between the two components; or one
                                       component per layer, alternating, via
                                       model.layer_schedule.sparse_pattern

  python train.py --config=configs/sparse_transformer.py --workdir=workdirs/sparse_strided
  python train.py --config=configs/sparse_transformer.py:fixed,multihead \
      --workdir=workdirs/sparse_fixed_multihead
  python train.py --config=configs/sparse_transformer.py:strided,interleaved \
      --workdir=workdirs/sparse_interleaved
  python eval.py  --config=configs/sparse_transformer.py --workdir=workdirs/sparse_strided

Data, size and budget as configs/default.py (compare with configs/vanilla.py).
With `interleaved`, changing --config.model.num_layers needs a schedule of the
new length (--config.model.layer_schedule.sparse_pattern=...).
"""

import ml_collections

from configs import default
from longformer_jax.config_errors import require

PATTERNS = ('strided', 'fixed')
INTEGRATIONS = ('merged', 'multihead', 'interleaved')


def get_config(arg: str = '') -> ml_collections.ConfigDict:
  choices = [item.strip() for item in arg.split(',') if item.strip()]
  pattern = next((c for c in choices if c in PATTERNS), 'strided')
  integration = next((c for c in choices if c in INTEGRATIONS), 'merged')
  unknown = [c for c in choices if c not in PATTERNS + INTEGRATIONS]
  require(not unknown, 'config', f'unknown choices {unknown}; use {PATTERNS} and {INTEGRATIONS}')

  c = default.get_config()
  c.model.attention = 'sparse_transformer'
  c.model.causal = True
  c.model.mem_len = 0                 # stateless: attends within the chunk
  c.model.sparse_pattern = pattern
  c.model.sparse_stride = 16
  c.model.sparse_summary_len = 2
  c.model.sparse_integration = 'merged'
  if integration == 'multihead':
    c.model.sparse_integration = 'multihead'
  elif integration == 'interleaved':
    local, summary = f'{pattern}_local', f'{pattern}_summary'
    c.model.layer_schedule.sparse_pattern = ','.join(
        local if i % 2 == 0 else summary for i in range(c.model.num_layers))
  return c
