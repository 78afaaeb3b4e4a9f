"""Tests for `longformer_jax.train.metrics_logging`."""

import io
import json
import math
import pathlib
import struct
import subprocess
import sys
import textwrap

import jax.numpy as jnp
import numpy as np
import pytest
from tensorboardX.proto import event_pb2

from longformer_jax.train import metrics_logging
from longformer_jax.train.metrics_logging import MetricsLogger, ProgressBar
from tests.support.repo_paths import REPO_ROOT


def _read_jsonl(workdir) -> list[dict]:
  lines = (pathlib.Path(workdir) / 'metrics.jsonl').read_text().splitlines()
  return [json.loads(line) for line in lines]


def _read_tensorboard_scalars(workdir) -> dict[str, list[tuple[int, float]]]:
  """Parses the TFRecord event files (length, crc, event, crc) by hand."""
  scalars = {}
  for path in sorted((pathlib.Path(workdir) / 'tensorboard').glob(
      'events.out.tfevents.*')):
    data = path.read_bytes()
    offset = 0
    while offset < len(data):
      (length,) = struct.unpack('<Q', data[offset:offset + 8])
      event = event_pb2.Event.FromString(
          data[offset + 12:offset + 12 + length])
      offset += 12 + length + 4
      for value in event.summary.value:
        scalars.setdefault(value.tag, []).append(
            (event.step, value.simple_value))
  return scalars


def test_jsonl_lines_are_valid_json_even_for_non_finite_values(tmp_path):
  with MetricsLogger(str(tmp_path)) as logger:
    logger.write(1, {'loss': 2.5, 'bits_per_token': np.float32(3.25)})
    logger.write(2, {'loss': float('nan'), 'grad_norm': jnp.float32(jnp.inf),
                     'tokens': np.int64(4096)})
    logger.write(2, {'loss': -math.inf}, prefix='eval')
  records = _read_jsonl(tmp_path)
  assert records == [
      {'step': 1, 'split': 'train', 'loss': 2.5, 'bits_per_token': 3.25},
      {'step': 2, 'split': 'train', 'loss': 'nan', 'grad_norm': 'inf',
       'tokens': 4096},
      {'step': 2, 'split': 'eval', 'loss': '-inf'},
  ]
  assert math.isnan(float(records[1]['loss']))


def test_jsonl_is_flushed_after_each_write_and_appended_on_resume(tmp_path):
  logger = MetricsLogger(str(tmp_path))
  logger.write(1, {'loss': 1.0})
  assert len(_read_jsonl(tmp_path)) == 1  # Visible before close.
  logger.close()
  with MetricsLogger(str(tmp_path)) as resumed:
    resumed.write(2, {'loss': 0.5})
  assert [r['step'] for r in _read_jsonl(tmp_path)] == [1, 2]


def test_resume_step_drops_the_lines_of_later_steps(tmp_path):
  with MetricsLogger(str(tmp_path)) as logger:
    for step in (1, 2, 3):
      logger.write(step, {'loss': 1.0})
    logger.write(3, {'loss': 1.0}, prefix='valid')
  with MetricsLogger(str(tmp_path), resume_step=2) as resumed:
    resumed.write(3, {'loss': 0.5})
  records = _read_jsonl(tmp_path)
  assert [(r['step'], r['split']) for r in records] == [(1, 'train'), (2, 'train'), (3, 'train')]
  assert records[-1]['loss'] == 0.5


def test_tensorboard_event_file_holds_prefixed_scalars(tmp_path):
  with MetricsLogger(str(tmp_path)) as logger:
    logger.write(10, {'loss': 1.5})
    logger.write(20, {'loss': float('nan')})
    logger.write(20, {'loss': 1.25}, prefix='eval')
  scalars = _read_tensorboard_scalars(tmp_path)
  assert scalars['eval/loss'] == [(20, 1.25)]
  (first, second) = scalars['train/loss']
  assert first == (10, 1.5)
  assert second[0] == 20 and math.isnan(second[1])


def test_disabled_logger_writes_nothing(tmp_path):
  workdir = tmp_path / 'run'
  with MetricsLogger(str(workdir), enabled=False) as logger:
    logger.write(1, {'loss': 1.0})
  assert not workdir.exists()


def test_reserved_metric_names_are_rejected(tmp_path):
  with MetricsLogger(str(tmp_path)) as logger:
    with pytest.raises(ValueError, match='reserved'):
      logger.write(1, {'step': 3.0})


def test_progress_bar_prints_one_plain_line_per_update_without_tty():
  stream = io.StringIO()
  with ProgressBar(total_steps=10, initial_step=2, stream=stream) as bar:
    bar.update(3, loss=2.0, bits_per_token=2.885, rate=12345.0)
    bar.update(4, loss=1.5, bits_per_token=2.164, rate=1.5e6)
    bar.update(5, loss=float('nan'), bits_per_token=float('nan'),
               rate=900.0)
  lines = stream.getvalue().splitlines()
  assert len(lines) == 3
  assert '\r' not in stream.getvalue()
  assert lines[0].startswith('step 3/10 | loss 2.0000 | bits/tok 2.8850')
  assert '12.3k tok/s' in lines[0] and 'ETA ?' in lines[0]
  assert '1.50M tok/s' in lines[1] and 'ETA 0:00:0' in lines[1]
  assert 'loss nan' in lines[2]


def test_progress_bar_uses_stdout_by_default(capsys):
  bar = ProgressBar(total_steps=4)
  bar.update(1, loss=1.0, bits_per_token=1.0, rate=10.0)
  bar.close()
  assert capsys.readouterr().out.startswith('step 1/4 | ')


class _FakeTerminal(io.StringIO):

  def isatty(self):
    return True


def test_progress_bar_draws_tqdm_bar_on_a_terminal():
  stream = _FakeTerminal()
  with ProgressBar(total_steps=10, stream=stream) as bar:
    bar.update(1, loss=2.0, bits_per_token=2.9, rate=100.0)
    bar.update(3, loss=1.0, bits_per_token=1.4, rate=100.0)
  output = stream.getvalue()
  assert '3/10' in output
  assert 'loss 1.0000' in output


def test_disabled_progress_bar_prints_nothing():
  stream = _FakeTerminal()
  with ProgressBar(total_steps=10, enabled=False, stream=stream) as bar:
    bar.update(1, loss=2.0, bits_per_token=2.9, rate=100.0)
  assert stream.getvalue() == ''


def test_eta_ignores_the_slow_first_step():
  eta = metrics_logging._EtaEstimator(total_steps=10)
  assert eta.remaining_seconds(1, now=100.0) is None  # After a 100 s compile.
  assert eta.remaining_seconds(3, now=102.0) == pytest.approx(7.0)
  assert eta.remaining_seconds(10, now=109.0) == 0.0


def test_writing_metrics_leaves_pytorch_unimported_and_importable(tmp_path):
  """tensorboardX would import PyTorch (where installed) to accept torch tensors; the logger
  writes floats and loads it without. PyTorch stays importable afterwards."""
  script = textwrap.dedent(f'''
      import importlib.util, sys
      from longformer_jax.train.metrics_logging import MetricsLogger
      with MetricsLogger({str(tmp_path)!r}) as logger:
        logger.write(3, {{'loss': 2.5}})
      print('tensorboardX' in sys.modules, 'torch' in sys.modules)
      if importlib.util.find_spec('torch') is not None:
        import torch
        print('torch', torch.zeros(2).sum().item())
      ''')
  done = subprocess.run([sys.executable, '-c', script], cwd=REPO_ROOT, capture_output=True,
                        text=True, timeout=120)
  assert done.returncode == 0, done.stderr[-2000:]
  lines = done.stdout.split('\n')
  assert lines[0] == 'True False'
  assert lines[1] in ('', 'torch 0.0')      # '' where PyTorch is not installed
  assert _read_tensorboard_scalars(tmp_path) == {'train/loss': [(3, 2.5)]}
