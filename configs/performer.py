r"""Performer (Choromanski et al., 2021), FAVOR+ attention: a byte-level LM on the stdlib corpus.

Causal linear attention with m = 256 positive orthogonal random features of
the softmax kernel (`model.performer.num_features`, the default), fixed per
layer from `model.performer.seed`; exact attention inside blocks of 64
positions and prefix sums S = sum phi(k) v^T, z = sum phi(k) across them
(`block_len`). Causal Performer is an RNN: S and z of the current document
are carried from chunk to chunk (`carry_state`, the default), so a query
sees its whole document so far, at a cost independent of its length.

The optional argument after ':' picks, comma-separated:

  relu        the ReLU kernel of generalised attention (relu(Wx) + eps)
  redraw      fresh features every 100 training steps (evaluation: the fixed ones)
  stateless   no carry: attention within the chunk only

  python train.py --config=configs/performer.py --workdir=workdirs/performer
  python train.py --config=configs/performer.py:relu --workdir=workdirs/performer_relu
  python eval.py  --config=configs/performer.py --workdir=workdirs/performer

Data and size as configs/default.py, 900 steps (the train section default) (compare with configs/vanilla.py).
"""

from longformer_jax.config.errors import require

CHOICES = ('relu', 'redraw', 'stateless')


def get_config(arg: str = '') -> dict:
  choices = [item.strip() for item in arg.split(',') if item.strip()]
  unknown = [c for c in choices if c not in CHOICES]
  require(not unknown, '--config', f'performer.py:{arg}: unknown choices {unknown}; use {CHOICES}')
  section = {}
  if 'relu' in choices:
    section['kernel'] = 'relu'
  if 'redraw' in choices:
    section['redraw_every'] = 100
  if 'stateless' in choices:
    section['carry_state'] = False
  return {'model': {'attention': 'performer', 'performer': section}}
