r"""BP-Transformer (Ye et al., 2019) as a causal byte-level LM on the built-in corpus.

Fine-to-coarse attention within each chunk (no memory): the default's chunks
of 256 bytes under a binary tree of 8 levels; each byte attends to the k = 4
bytes before it and itself, then to up to 4 span nodes per level further back
(spans of 2, 4, ..., 256 bytes), 37 neighbours in all, with a learned relative
key per (level, offset). The optional argument after ':' sets k (e.g. `:8`).

  python train.py --config=configs/bp_transformer.py --workdir=workdirs/bp_transformer
  python train.py --config=configs/bp_transformer.py:8 --workdir=workdirs/bp_transformer_k8
  python eval.py  --config=configs/bp_transformer.py --workdir=workdirs/bp_transformer

Data and size as configs/default.py, 900 steps (the train section default) (compare with configs/vanilla.py).
"""

from longformer_jax.config.errors import require


def get_config(arg: str = '') -> dict:
  k = arg.strip() or '4'
  require(k.isdigit() and int(k) >= 1, '--config',
          f'bp_transformer.py:{arg}: the argument is k, an integer >= 1')
  section = {'k': int(k)} if int(k) != 4 else {}
  model = {'attention': 'bp_transformer'}
  if section:
    model['bp_transformer'] = section
  return {'model': model}
