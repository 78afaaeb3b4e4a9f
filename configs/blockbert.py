r"""BlockBERT (Qiu et al., 2020) blockwise attention: a causal byte-level LM on the built-in corpus.

Blockwise attention within each chunk (no memory): the default's chunks of
256 bytes cut into b = 2 blocks of 128; half the heads attend within their
own block (identity), half to the previous block (the shift i -> i - 1, the
causal form of the paper's permutation (1, 0); the first block's queries of
those heads get zeros). The optional argument after ':' sets the number of
blocks b (identity + shift by one, e.g. `:4` gives '0,1,2,3;3,0,1,2').

  python train.py --config=configs/blockbert.py --workdir=workdirs/blockbert
  python train.py --config=configs/blockbert.py:4 --workdir=workdirs/blockbert_4
  python eval.py  --config=configs/blockbert.py --workdir=workdirs/blockbert

Data and size as configs/default.py, 900 steps (the train section default) (compare with configs/default.py's
Transformer-XL and configs/vanilla.py).
"""

from longformer_jax.config.errors import require


def get_config(arg: str = '') -> dict:
  blocks = arg.strip() or '2'
  require(blocks.isdigit() and int(blocks) >= 1, '--config',
          f'blockbert.py:{arg}: the argument is the number of blocks, an integer >= 1')
  b = int(blocks)
  identity = ','.join(str(i) for i in range(b))
  shift = ','.join(str((i - 1) % b) for i in range(b))
  return {'model': {'attention': 'blockbert', 'blockbert': {'permutations': f'{identity};{shift}'}}}
