"""Every config file under configs/ loads and validates.

The memory state of every layer is built abstractly (`jax.eval_shape`: nothing
is allocated, also for the PG-19 models), so a variant's own shapes are checked too.
"""

import pathlib

import jax
import pytest

from longformer_jax.command_line import experiment_config
from longformer_jax.experiment_config import validate_mesh
from longformer_jax.models.decoder_lm import DecoderLM
from longformer_jax.models.resolved_model import lm_model_config

CONFIG_DIR = pathlib.Path(__file__).resolve().parents[2] / 'configs'
# A config file defines get_config; the others (configs/pod_sizes.py) hold what several share.
NAMES = sorted(p.stem for p in CONFIG_DIR.glob('*.py') if 'def get_config(' in p.read_text())


def test_every_variant_has_configs():
  assert {'default', 'attendre', 'memorizing', 'streaming_llm', 'short_context',
          'pg19_attendre', 'pg19_memorizing', 'pg19_streaming_llm', 'longformer_lm',
          'sparse_transformer', 'bigbird', 'reformer'} <= set(NAMES)


@pytest.mark.parametrize('name', NAMES)
def test_config_validates(name):
  """CPU configs on this machine's one device; PG-19 and pod configs (their default plan)
  on a 64-chip slice."""
  config = experiment_config(str(CONFIG_DIR / f'{name}.py'), [])
  validate_mesh(config, 64 if name.startswith(('pg19_', 'pod_')) else 1)
  if config.task == 'lm':
    model_config = lm_model_config(config.model, 259)
    jax.eval_shape(lambda: DecoderLM.init_state(model_config, 1))
