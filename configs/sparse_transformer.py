r"""Sparse Transformer (Child et al., 2019) as a causal byte-level LM on the built-in corpus.

Factorized attention within each chunk (no memory): the default's chunks of
256 bytes, stride / block l = 16 = sqrt(256) (`model.sparse_transformer.stride`,
the default; the paper picks l ~ sqrt(n)); the fixed pattern keeps c = 2
summary positions per block. The optional argument after ':' picks the
pattern and the integration (section 4.3), comma-separated:

  strided | fixed                      the factorized pattern (default strided)
  merged | multihead | interleaved     one head over the union (default); heads
                                       split between the two components; or one
                                       component per layer, alternating, via
                                       model.layer_schedule.sparse_transformer.pattern

  python train.py --config=configs/sparse_transformer.py --workdir=workdirs/sparse_strided
  python train.py --config=configs/sparse_transformer.py:fixed,multihead \
      --workdir=workdirs/sparse_fixed_multihead
  python train.py --config=configs/sparse_transformer.py:strided,interleaved \
      --workdir=workdirs/sparse_interleaved
  python eval.py  --config=configs/sparse_transformer.py --workdir=workdirs/sparse_strided

Data and size as configs/default.py, 900 steps (the train section default) (compare with configs/vanilla.py).
With `interleaved`, changing --config.model.num_layers needs a schedule of the
new length (--config.model.layer_schedule.sparse_transformer.pattern=...).
"""

from longformer_jax.config.errors import require
from longformer_jax.models.model_config import ModelConfig

PATTERNS = ('strided', 'fixed')
INTEGRATIONS = ('merged', 'multihead', 'interleaved')


def get_config(arg: str = '') -> dict:
  choices = [item.strip() for item in arg.split(',') if item.strip()]
  pattern = next((c for c in choices if c in PATTERNS), 'strided')
  integration = next((c for c in choices if c in INTEGRATIONS), 'merged')
  unknown = [c for c in choices if c not in PATTERNS + INTEGRATIONS]
  require(not unknown, '--config', f'sparse_transformer.py:{arg}: unknown choices {unknown}; '
          f'use {PATTERNS} and {INTEGRATIONS}')

  section = {'pattern': pattern}
  if pattern == 'fixed':
    section['summary_len'] = 2        # c: the last 2 positions of every block
  if integration == 'multihead':
    section['integration'] = 'multihead'
  model = {'attention': 'sparse_transformer', 'sparse_transformer': section}
  if integration == 'interleaved':
    local, summary = f'{pattern}_local', f'{pattern}_summary'
    model['layer_schedule'] = {'sparse_transformer': {'pattern': ','.join(
        local if i % 2 == 0 else summary for i in range(ModelConfig.num_layers))}}
  return {'model': model}
