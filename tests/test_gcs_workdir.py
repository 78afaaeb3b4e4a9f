"""A run's files in a gs:// workdir behave as on disk (a real GCS server on loopback).

tests/gcs_server.py starts fake-gcs-server; the code under test talks to it
through gcsfs and tensorstore exactly as it talks to Cloud Storage.
"""

import json

import ml_collections
import pytest

from longformer_jax.config.errors import ConfigError
from longformer_jax.storage import paths
from longformer_jax.train import metrics_logging, run_directory
from tests.gcs_server import gcs_bucket, gcs_server_url  # pylint: disable=unused-import


def read_steps(path) -> list:
  return [json.loads(line)['step'] for line in path.read_text().splitlines()]


def test_metrics_resume_drops_the_lines_past_the_checkpoint(gcs_bucket):
  workdir = f'{gcs_bucket}/metrics_run'
  with metrics_logging.MetricsLogger(workdir, resume_step=0) as logger:
    for step in (1, 2, 3, 4):
      logger.write(step, {'loss': 1.0 / step})
  path = paths.as_path(workdir) / 'metrics.jsonl'
  assert read_steps(path) == [1, 2, 3, 4]
  # The run died after step 4 with its checkpoint at step 2: steps 3 and 4 come again.
  with metrics_logging.MetricsLogger(workdir, resume_step=2) as logger:
    logger.write(3, {'loss': 0.3})
  assert read_steps(path) == [1, 2, 3]
  assert json.loads(path.read_text().splitlines()[-1])['loss'] == 0.3
  assert list((paths.as_path(workdir) / 'tensorboard').iterdir())   # event file uploaded


def test_config_json_and_workdir_checks(gcs_bucket):
  workdir = f'{gcs_bucket}/config_run'
  run_directory.check_workdir(workdir)
  run_directory.write_config(ml_collections.ConfigDict({'seed': 3}), workdir)
  assert json.loads((paths.as_path(workdir) / 'config.json').read_text()) == {'seed': 3}
  run_directory.check_workdir(workdir)                 # an existing run folder is fine
  with pytest.raises(ConfigError, match='is an existing file'):
    run_directory.check_workdir(f'{workdir}/config.json')
  with pytest.raises(ConfigError, match='bucket gs://missing-bucket-y does not exist'):
    run_directory.check_workdir('gs://missing-bucket-y/run')
