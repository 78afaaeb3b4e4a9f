"""Every config file under configs/ loads, validates, and sets only what differs from defaults.

The memory state of every layer is built abstractly (`jax.eval_shape`: nothing
is allocated, also for the PG-19 models), so a variant's own shapes are checked too.
"""

import pathlib

import jax
import pytest

from longformer_jax.command_line import experiment_config
from longformer_jax.config.overrides import load_config_file
from longformer_jax.config_validation import resolve_config, validate_mesh
from longformer_jax.models.decoder_lm import DecoderLM, lm_model_config

CONFIG_DIR = pathlib.Path(__file__).resolve().parents[1] / 'configs'
NAMES = sorted(p.stem for p in CONFIG_DIR.glob('*.py') if p.stem != '__init__')


def test_every_variant_has_configs():
  assert {'default', 'attendre', 'memorizing', 'streaming_llm', 'short_context',
          'pg19_attendre', 'pg19_memorizing', 'pg19_streaming_llm', 'longformer_lm',
          'sparse_transformer', 'bigbird', 'reformer'} <= set(NAMES)


@pytest.mark.parametrize('name', NAMES)
def test_config_validates(name):
  """CPU configs on this machine's one device; PG-19 configs on a 64-chip slice."""
  config = experiment_config(str(CONFIG_DIR / f'{name}.py'), [])
  validate_mesh(config, 64 if name.startswith('pg19_') else 1)
  if config.task == 'lm':
    model_config = lm_model_config(config.model, 259)
    jax.eval_shape(lambda: DecoderLM.init_state(model_config, 1))


@pytest.mark.parametrize('name', NAMES)
def test_config_sets_only_what_differs_from_the_defaults(name):
  """A value equal to its default hides nothing; a written-out default is noise."""
  sparse = load_config_file(str(CONFIG_DIR / f'{name}.py'))
  defaults = resolve_config({'task': sparse.get('task', 'lm'),
                             'model': {'attention': sparse.get('model', {}).get(
                                 'attention', 'vanilla')}})

  def same_as_default(values, default, path):
    for key, value in values.items():
      if isinstance(value, dict) and isinstance(default.get(key), dict):
        yield from same_as_default(value, default[key], f'{path}.{key}')
      elif key in default and default[key] == value and key != 'attention':
        yield f'{path}.{key}'

  assert not list(same_as_default(sparse, defaults, 'config'))
