"""The model as its Flax modules receive it: a `ResolvedModel` built from `config.model`.

`resolve_model` (models/model_config.py) checks `config.model` and returns the
complete plain dict that `config.json` stores. Between it and the modules,
`resolved_model(values, vocab_size, **overrides)` turns that dict into one frozen
`ResolvedModel` (models/resolved_model_type.py, re-exported here: every shared setting as
the fields of `ModelConfig` that it inherits, every registered section typed and read by
its key, and the derived `vocab_size` and `layer_index`).

Every field beyond `ModelConfig`'s is required (no default is restated here). Its
dict-typed settings (`layer_schedule`, `aux_loss_weights`, `rope_scaling`) and
`sections` are `FrozenMapping`s, so the object hashes like the `FrozenConfigDict` it
replaces. The sections are looked up when it is built (not fixed when this module is
imported), so a variant registered later (a test's) has its section too. A variation
of a model is `dataclasses.replace(cfg, ...)` (the encoder-decoder's decoder layers, a
stack of another depth). `lm_model_config` and `encoder_model_config` give the decoder
LM's and the encoders' model from a run's `config.model`; `model_values()` gives back
the plain `config.model` dict (to check an evaluation's variation with `resolve_model`).
"""

from typing import Mapping

from longformer_jax.config.errors import ConfigError
from longformer_jax.config.section import coerce, unknown_key_error
from longformer_jax.models.decoder_lm import padded_vocab_size
from longformer_jax.models.hibert import HibertConfig
from longformer_jax.models.model_config import ModelConfig, section_classes
from longformer_jax.models.resolved_model_type import DERIVED, ResolvedModel


def resolved_model(values, vocab_size: int = 0, **overrides) -> ResolvedModel:
  """The `ResolvedModel` of a resolved `config.model` (a dict, a `ConfigDict`, or a
  `ResolvedModel`), with `vocab_size` (already padded; 0: none) and `overrides` (shared
  settings, whole sections as mappings) applied.

  Every shared setting and every section must be in `values` (the output of
  `resolve_model` has them all): nothing falls back to a default here. The sections are
  built as their classes build them; the shared settings are typed, not checked again
  (an override such as an evaluation's `mem_len` is the caller's to choose).
  """
  values = _plain(values)
  values.update({name: _plain(value) if _is_mapping(value) else value
                 for name, value in overrides.items()})
  values.setdefault('layer_index', 0)
  values['vocab_size'] = vocab_size or values.get('vocab_size') or 0   # 0: no embedding
  sections = section_classes()
  known = ModelConfig.field_names() + tuple(sections) + ('hibert',) + DERIVED
  for key in values:
    if key not in known:
      raise unknown_key_error('model', key, known)
  fields = {}
  for name in ModelConfig.field_names() + DERIVED:
    if name not in values:
      raise ConfigError(f'model.{name}', 'missing: a resolved model has every setting '
                        '(models/model_config.resolve_model)')
    kind = int if name in DERIVED else ModelConfig.field_type(name)
    fields[name] = coerce(values[name], kind, f'model.{name}')
  built = {}
  for name, cls in sections.items():
    if name not in values:
      raise ConfigError(f'model.{name}', 'missing: a resolved model has every section '
                        '(models/model_config.resolve_model)')
    built[name] = _section(cls, values[name], f'model.{name}')
  if values.get('hibert') is not None:
    built['hibert'] = _section(HibertConfig, values['hibert'], 'model.hibert')
  return ResolvedModel(sections=built, **fields)


def lm_model_config(model_config, tokenizer_vocab_size: int, **overrides) -> ResolvedModel:
  """The decoder LM's model: `config.model` with `vocab_size` (padded) and `overrides`."""
  return resolved_model(model_config, _padded(model_config, tokenizer_vocab_size), **overrides)


def encoder_model_config(model_config, tokenizer_vocab_size: int,
                         **overrides) -> ResolvedModel:
  """An encoder's model: `config.model` made bidirectional (`causal=False`), with
  `vocab_size` (padded) and `overrides`."""
  return resolved_model(model_config, _padded(model_config, tokenizer_vocab_size),
                        **{'causal': False, **overrides})


def _padded(model_config, tokenizer_vocab_size: int) -> int:
  """The vocabulary rounded up to `model.vocab_multiple`, so that the `vocab` axis shards."""
  return padded_vocab_size(tokenizer_vocab_size, _plain(model_config)['vocab_multiple'])


def _section(cls, values: Mapping, path: str):
  """`cls` built from `values`, which must hold every one of its fields (no default applies)."""
  missing = [name for name in cls.field_names() if name not in values]
  if missing:
    raise ConfigError(f'{path}.{missing[0]}', 'missing: a resolved model has every field of '
                      'every section (models/model_config.resolve_model)')
  return cls.of(values, path)


def _is_mapping(value) -> bool:
  return isinstance(value, Mapping) or hasattr(value, 'to_dict')


def _plain(values) -> dict:
  """A plain dict of `values` (a mapping, a `ConfigDict`, or a `ResolvedModel`)."""
  if hasattr(values, 'to_dict'):
    return values.to_dict()
  return dict(values)
