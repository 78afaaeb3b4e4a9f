"""The tokenizer named by `config.data.tokenizer`."""

import ml_collections

from longformer_jax.config.errors import ConfigError
from longformer_jax.data.data_config import TOKENIZERS
from longformer_jax.data.byte_tokenizer import ByteTokenizer
from longformer_jax.data.hf_tokenizer import HfTokenizer
from longformer_jax.data.lra.listops_tokenizer import ListOpsTokenizer
from longformer_jax.data.sentencepiece_tokenizer import SentencePieceTokenizer
from longformer_jax.data.tokenizer_interface import Tokenizer



def make_tokenizer(data_config: ml_collections.ConfigDict, *, needs_bos: bool = True,
                   task: str = 'lm') -> Tokenizer:
  """The tokenizer named by `data_config.tokenizer` ('byte' |
  'sentencepiece', which loads `data_config.sentencepiece_model` | 'hf', which
  loads the Hugging Face `tokenizer.json` at `data_config.tokenizer_file` | 'listops',
  ListOps' fixed vocabulary, data/lra/listops_tokenizer.py).

  A tokenizer without a beginning-of-text token (T5's) is a `ConfigError`
  naming its file when `needs_bos` (the task's `needs_bos`, tasks/base.py; `task`
  is its name, for the message): most tasks write BOS before each document (lm:
  the streams) or example ([CLS]); seq2seq starts its source with the text and
  its decoder with `bos_id`, which is the pad token without a BOS (T5's convention).
  """
  tokenizer = _load(data_config)
  if needs_bos and not getattr(tokenizer, 'has_bos', True):
    key, missing = tokenizer.missing_bos()
    raise ConfigError(key, f'{missing}, which task {task!r} writes before every document or '
                      f'example; only a task without BOS (seq2seq) takes it')
  return tokenizer


def _load(data_config: ml_collections.ConfigDict) -> Tokenizer:
  name = data_config.tokenizer
  if name == 'byte':
    return ByteTokenizer()
  if name == 'sentencepiece':
    return SentencePieceTokenizer.load(data_config.sentencepiece_model)
  if name == 'hf':
    return HfTokenizer.load(data_config.tokenizer_file)
  if name == 'listops':
    return ListOpsTokenizer()
  raise ConfigError('data.tokenizer',
                    f'unknown tokenizer {name!r}; expected one of {TOKENIZERS}')
