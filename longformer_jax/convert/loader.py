"""Mapping a Hugging Face checkpoint onto `DecoderLM` (or `MaskedLM`, `EncoderDecoder`): `load`
and its parts.

`longformer_jax.convert.hf` is the documented entry point (it re-exports
`load`); docs/import.md has the tensor mapping of each family.
"""

import ml_collections

from longformer_jax.config.errors import ConfigError
from longformer_jax.convert import gpt2, led, llama, longformer, longformer_heads, t5
from longformer_jax.convert.errors import ConversionError
from longformer_jax.convert.hf_config import read_hf_config, required
from longformer_jax.convert.hf_fields import check_fields
from longformer_jax.convert.safetensors_reader import DTYPES, SafetensorsFiles, TensorSource
from longformer_jax.models.decoder_lm import DecoderLM
from longformer_jax.models.resolved_model import encoder_model_config, lm_model_config
from longformer_jax.models.encoder_decoder import EncoderDecoder
from longformer_jax.models.model_config import resolve_model

FAMILIES = {name: module for module in (gpt2, llama, longformer, led, t5)
            for name in module.MODEL_TYPES}


def family(hf: dict):
  """The module that maps checkpoints of `hf['model_type']`."""
  model_type = hf['model_type']
  if model_type not in FAMILIES:
    raise ConversionError(f'config.json: model_type {model_type!r} is not supported; '
                          f'supported: {sorted(FAMILIES)}')
  return FAMILIES[model_type]


def vocab_multiple(model_vocab: int, tokenizer_vocab: int | None = None) -> int:
  """`model.vocab_multiple` that pads the tokenizer's vocabulary to exactly the model's.

  64 when that already does; else the model's vocabulary size itself (so the
  `vocab` axis is sharded only where the size allows).
  """
  tokenizer_vocab = model_vocab if tokenizer_vocab is None else tokenizer_vocab
  if tokenizer_vocab > model_vocab:
    raise ConversionError(f'tokenizer has {tokenizer_vocab} tokens but the model\'s '
                          f'vocab_size is {model_vocab}')
  if -(-tokenizer_vocab // 64) * 64 == model_vocab:
    return 64
  return model_vocab


def model_settings(hf_dir: str) -> tuple:
  """`(hf_config, settings)`: the checkpoint's config.json and its `config.model` settings."""
  hf = read_hf_config(hf_dir)
  module = family(hf)
  check_fields(hf)
  return hf, module.model_settings(hf)


def load_params(hf_dir: str, hf: dict, settings: dict, dtype: str | None = 'float32') -> dict:
  """The checkpoint's parameters (of the module `load_model` builds) as numpy arrays of
  `dtype` (None: each as its file stores it). Tensors are read one at a time as the
  mapping takes them (safetensors_reader.SafetensorsFiles)."""
  if dtype is not None and dtype not in DTYPES:
    raise ConversionError(f'dtype {dtype!r} is not supported; choose one of {sorted(DTYPES)}')
  module = family(hf)
  vocab_size = required(hf, 'vocab_size')
  source = TensorSource(SafetensorsFiles(hf_dir), dtype, module.IGNORED_SUFFIXES)
  if module is gpt2:
    gpt2.lm_head_check(source, vocab_size, settings['d_model'])
  params = module.convert_params(source, settings, vocab_size, hf)
  source.check_all_used()
  return params


def load(hf_dir: str, dtype: str = 'float32', tokenizer_vocab: int | None = None):
  """`(model_config, params)` of the Hugging Face checkpoint in `hf_dir`.

  Args:
    hf_dir: a directory with `config.json` and `*.safetensors` (one file or
      shards with `model.safetensors.index.json`).
    dtype: 'float32' or 'bfloat16', the dtype of the returned parameters and
      the model's compute dtype (`model.dtype`).
    tokenizer_vocab: the tokenizer's vocabulary size, if it differs from the
      model's (sets `model.vocab_multiple`, see `vocab_multiple`).
  Returns:
    `model_config`: the `ResolvedModel` of `config.model` with `vocab_size` set (what
    `DecoderLM` takes; for an encoder family, Longformer, the bidirectional
    config `MaskedLM` takes; for an encoder-decoder family, LED or T5, the same
    config with `decoder_layers`, which `EncoderDecoder` takes); `params`: a
    nested dict of numpy arrays, the parameters of `DecoderLM(model_config)`
    (or `MaskedLM(model_config)`, `EncoderDecoder(model_config)`).
  """
  hf, settings = model_settings(hf_dir)
  params = load_params(hf_dir, hf, settings, dtype)
  values = checkpoint_model_values(dict(settings, **head_settings(hf)), hf, dtype,
                                   tokenizer_vocab)
  model = ml_collections.ConfigDict(values)
  vocab = hf['vocab_size'] if tokenizer_vocab is None else tokenizer_vocab
  if is_encoder(hf) or is_encoder_decoder(hf):
    return encoder_model_config(model, vocab), params
  return lm_model_config(model, vocab), params


def head_settings(hf: dict) -> dict:
  """The model settings the checkpoint's head fixes (a Longformer classifier's `num_classes`),
  beyond `model_settings` (which every task fine-tuning the checkpoint must keep)."""
  return getattr(family(hf), 'head_settings', lambda _: {})(hf)


def is_encoder(hf: dict) -> bool:
  """Whether the family of `hf['model_type']` imports as an encoder (`MaskedLM`)."""
  return getattr(family(hf), 'ENCODER', False)


def is_encoder_decoder(hf: dict) -> bool:
  """Whether the family of `hf['model_type']` imports as an encoder-decoder (`EncoderDecoder`)."""
  return getattr(family(hf), 'ENCODER_DECODER', False)


def load_model(hf_dir: str, dtype: str = 'float32'):
  """`(model, params)`: the Flax module (`DecoderLM`, `MaskedLM` for Longformer, or its
  `SequenceClassifier` / `SpanExtractor` for a classification / QA checkpoint,
  `EncoderDecoder` for LED and T5) and its parameters as `load` returns them;
  `model.apply({'params': params}, ...)` runs it."""
  model_config, params = load(hf_dir, dtype)
  if is_encoder_decoder(read_hf_config(hf_dir)):
    return EncoderDecoder(model_config), params
  if model_config.causal:
    return DecoderLM(model_config), params
  return longformer_heads.model_class(params)(model_config), params


def checkpoint_model_values(settings: dict, hf: dict, dtype: str,
                            tokenizer_vocab: int | None) -> dict:
  """The complete, checked `config.model` dict of the checkpoint."""
  values = dict(settings, dtype=dtype,
                vocab_multiple=vocab_multiple(hf['vocab_size'], tokenizer_vocab))
  try:
    return resolve_model(values)
  except ConfigError as e:
    raise ConversionError(f'config.json maps to an invalid model: {e}') from None
