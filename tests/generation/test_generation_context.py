"""What `generate.py` says carries from one context chunk to the next
(generation/context.py: configured_memory), read from the resolved model section."""

import ml_collections

from configs import passkey_memory
from longformer_jax.experiment_config import resolve_config
from longformer_jax.generation.context import configured_memory


def _model(memory: str, **model) -> ml_collections.ConfigDict:
  config = passkey_memory.get_config(memory)
  config['model'].update(model)
  return ml_collections.ConfigDict(resolve_config(config)['model'])


def test_sinks_name_their_window_and_sink_count():
  said = configured_memory(_model('sinks', streaming_sinks={'num_sinks': 2, 'window': 96}), 128)
  assert said == 'streaming_sinks layers: their rolling window of 96 tokens (2 sinks) carries on'


def test_the_section_default_is_the_one_used():
  """No num_sinks given: the StreamingSinksConfig default (4) is reported. (A second default
  at the read would not show here, as a resolved section always has the key: the scan of
  test_config_defaults_single_place.py keeps it out.)"""
  assert '(4 sinks)' in configured_memory(_model('sinks'), 128)


def test_vanilla_without_a_cache_says_each_chunk_starts_afresh():
  said = configured_memory(_model('none'), 128)
  assert said == 'vanilla layers: model.mem_len=0, no cache, each 128-token chunk starts afresh'
