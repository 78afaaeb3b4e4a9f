"""ETC (Ainslie et al., 2020) encoder for extractive QA: longformer_qa.py with ETC attention.

The task's global flags make the global input: [CLS], the question and [SEP]
(up to question_len + 2 = 66 tokens, so `model.etc.max_global = 66`); the
long input is the context, each token seeing its neighbours within the radius
k = 64 (as Longformer's one-sided window of 64) and every global token
(`structure='all'`: the question is one global segment, as the question
tokens of the paper's global input; `structure='sentence'` links a long token
to the latest global token before it, here [SEP]). Relative position labels
clipped at k replace RoPE. Same data, size and budget as the Longformer QA
config, so the two compare directly.

  python train.py --config=configs/etc.py --workdir=workdirs/etc_qa
  python eval.py  --config=configs/etc.py --workdir=workdirs/etc_qa
"""

from configs import longformer_qa
from configs.longformer_classification import LONGFORMER_ENCODER
from longformer_jax.config.overrides import merged


def get_config() -> dict:
  encoder = {k: v for k, v in LONGFORMER_ENCODER.items() if k != 'longformer'}
  model = merged(encoder, {'attention': 'etc',
                           'etc': {'radius': 64, 'max_global': 66, 'structure': 'all'}})
  return dict(longformer_qa.get_config(), model=model)
