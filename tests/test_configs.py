"""Every config file under configs/ loads and passes the same validation train.py runs.

Validation includes `jax.eval_shape` of every layer's memory state, so a
variant's own key checks run here too (abstractly: nothing is allocated,
also for the PG-19 models).
"""

import importlib
import pathlib

import pytest

from longformer_jax.config_validation import validate_config

CONFIG_DIR = pathlib.Path(__file__).resolve().parents[1] / 'configs'
NAMES = sorted(p.stem for p in CONFIG_DIR.glob('*.py') if p.stem != '__init__')


def test_every_variant_has_configs():
  assert {'default', 'attendre', 'memorizing', 'streaming_llm', 'short_context',
          'pg19_attendre', 'pg19_memorizing', 'pg19_streaming_llm', 'longformer_lm',
          'sparse_transformer', 'bigbird', 'reformer'} <= set(NAMES)


@pytest.mark.parametrize('name', NAMES)
def test_config_validates(name):
  """CPU configs on this machine's one device; PG-19 configs on a 64-chip slice."""
  config = importlib.import_module(f'configs.{name}').get_config()
  validate_config(config, device_count=64 if name.startswith('pg19_') else 1)
