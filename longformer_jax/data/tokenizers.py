"""The tokenizer named by `config.data.tokenizer`."""

import ml_collections

from longformer_jax.config.errors import ConfigError
from longformer_jax.data.byte_tokenizer import ByteTokenizer
from longformer_jax.data.sentencepiece_tokenizer import SentencePieceTokenizer
from longformer_jax.data.tokenizer_interface import Tokenizer

TOKENIZERS = ('byte', 'sentencepiece', 'hf')
# Tasks whose sequences need no beginning-of-text token: seq2seq starts its source with the
# text and its decoder with `bos_id`, which is the pad token without a BOS (T5's convention).
# Every other task writes BOS before each document (lm: the streams) or example ([CLS]).
BOS_FREE_TASKS = ('seq2seq',)


def make_tokenizer(data_config: ml_collections.ConfigDict, task: str = 'lm') -> Tokenizer:
  """The tokenizer named by `data_config.tokenizer` ('byte' |
  'sentencepiece', which loads `data_config.sentencepiece_model` | 'hf', which
  loads the Hugging Face `tokenizer.json` at `data_config.tokenizer_file`).

  A tokenizer without a beginning-of-text token (T5's) is a `ConfigError`
  naming its file unless `task` is in `BOS_FREE_TASKS`.
  """
  tokenizer = _load(data_config)
  if task not in BOS_FREE_TASKS and not getattr(tokenizer, 'has_bos', True):
    key, missing = tokenizer.missing_bos()
    raise ConfigError(key, f'{missing}, which task {task!r} writes before every document or '
                      f'example; only task {" or ".join(BOS_FREE_TASKS)} needs none')
  return tokenizer


def _load(data_config: ml_collections.ConfigDict) -> Tokenizer:
  name = data_config.tokenizer
  if name == 'byte':
    return ByteTokenizer()
  if name == 'sentencepiece':
    return SentencePieceTokenizer.load(data_config.sentencepiece_model)
  if name == 'hf':
    from longformer_jax.data.hf_tokenizer import HfTokenizer  # pylint: disable=g-import-not-at-top
    return HfTokenizer.load(data_config.tokenizer_file)
  raise ConfigError('data.tokenizer',
                    f'unknown tokenizer {name!r}; expected one of {TOKENIZERS}')
