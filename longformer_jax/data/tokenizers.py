"""The tokenizer named by `config.data.tokenizer`."""

import ml_collections

from longformer_jax.config.errors import ConfigError
from longformer_jax.data.byte_tokenizer import ByteTokenizer
from longformer_jax.data.sentencepiece_tokenizer import SentencePieceTokenizer
from longformer_jax.data.tokenizer_interface import Tokenizer

TOKENIZERS = ('byte', 'sentencepiece', 'hf')


def make_tokenizer(data_config: ml_collections.ConfigDict) -> Tokenizer:
  """The tokenizer named by `data_config.tokenizer` ('byte' |
  'sentencepiece', which loads `data_config.sentencepiece_model` | 'hf', which
  loads the Hugging Face `tokenizer.json` at `data_config.tokenizer_file`)."""
  name = data_config.tokenizer
  if name == 'byte':
    return ByteTokenizer()
  if name == 'sentencepiece':
    return SentencePieceTokenizer.load(data_config.sentencepiece_model)
  if name == 'hf':
    from longformer_jax.data.hf_tokenizer import HfTokenizer  # pylint: disable=g-import-not-at-top
    return HfTokenizer.load(data_config.get('tokenizer_file', ''))
  raise ConfigError('data.tokenizer',
                    f'unknown tokenizer {name!r}; expected one of {TOKENIZERS}')
