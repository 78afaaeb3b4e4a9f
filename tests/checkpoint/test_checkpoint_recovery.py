"""Broken checkpoints: corruption is detected and named, the newest intact step is used.

A corrupt step (a flipped bit, a truncated or missing file, garbled data
state, missing checksums) is reported naming the step and left on disk;
`restore_latest_intact` moves it aside to `<step>.corrupt` and resumes from
the step before; other shapes or structure are a mismatch, not corruption;
Orbax's thread noise stays hidden (checkpoint/orbax_noise.py).
"""

import logging
import os
import pathlib
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import pytest

from longformer_jax.checkpoint.checkpointer import (
    Checkpointer,
    CheckpointMismatchError,
    CheckpointNotFoundError,
    CorruptCheckpointError,
    NoIntactCheckpointError,
)
from tests.support.checkpoint_states import (abstract_like, assert_bit_identical, file_digests,
                                             make_state)
from tests.support.repo_paths import REPO_ROOT


@pytest.fixture
def workdir(tmp_path):
  return str(tmp_path / 'run')

def _flip_one_bit_in_largest_file(step_dir: pathlib.Path) -> None:
  path = max((p for p in step_dir.rglob('*') if p.is_file()),
             key=lambda p: p.stat().st_size)
  data = bytearray(path.read_bytes())
  data[len(data) // 2] ^= 0x01
  path.write_bytes(bytes(data))


def _truncate_largest_file(step_dir: pathlib.Path) -> None:
  path = max((p for p in step_dir.rglob('*') if p.is_file()),
             key=lambda p: p.stat().st_size)
  path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def _delete_state_manifest(step_dir: pathlib.Path) -> None:
  (step_dir / 'state' / 'manifest.ocdbt').unlink()


def _garble_data_json(step_dir: pathlib.Path) -> None:
  (step_dir / 'data' / 'metadata').write_text('{"position": 1')


def _delete_array_files(step_dir: pathlib.Path) -> None:
  for path in (step_dir / 'state').rglob('d/*'):
    path.unlink()


def _delete_checksums_item(step_dir: pathlib.Path) -> None:
  for path in sorted((step_dir / 'checksums').rglob('*'), reverse=True):
    path.unlink() if path.is_file() else path.rmdir()
  (step_dir / 'checksums').rmdir()


CORRUPTIONS = [_flip_one_bit_in_largest_file, _truncate_largest_file,
               _delete_state_manifest, _garble_data_json, _delete_array_files,
               _delete_checksums_item]


# Orbax's asyncio loop may report an ignored 'Event loop is closed' error
# after a failed read; it is noise from the library, not a test failure.
@pytest.mark.filterwarnings('ignore::pytest.PytestUnraisableExceptionWarning')
@pytest.mark.parametrize('corrupt', CORRUPTIONS)
def test_corrupt_checkpoint_is_reported_and_left_alone(workdir, corrupt):
  abstract = abstract_like(make_state())
  with Checkpointer(workdir, keep=3, async_save=False) as ckpt:
    ckpt.save(1, make_state(1), {'position': 1})
    ckpt.save(2, make_state(2), {'position': 2})
  step_dir = pathlib.Path(workdir) / 'checkpoints' / '2'
  corrupt(step_dir)
  digests = file_digests(pathlib.Path(workdir) / 'checkpoints')

  with Checkpointer(workdir, keep=3, async_save=False) as ckpt:
    with pytest.raises(CorruptCheckpointError) as raised:
      ckpt.restore(None, abstract)
    assert str(step_dir) in str(raised.value)
    assert 'step 2' in str(raised.value)
    restored, data = ckpt.restore(1, abstract)
    assert ckpt.all_steps() == [1, 2]

  assert_bit_identical(make_state(1), restored)
  assert data == {'position': 1}
  assert file_digests(pathlib.Path(workdir) / 'checkpoints') == digests


def _save_steps(workdir, steps, keep=3):
  with Checkpointer(workdir, keep=keep, async_save=False) as ckpt:
    for step in steps:
      ckpt.save(step, make_state(step), {'position': step})


@pytest.mark.filterwarnings('ignore::pytest.PytestUnraisableExceptionWarning')
@pytest.mark.parametrize('corrupt', CORRUPTIONS)
def test_restore_latest_intact_moves_the_broken_step_aside(workdir, corrupt,
                                                           caplog):
  _save_steps(workdir, (1, 2))
  checkpoints = pathlib.Path(workdir) / 'checkpoints'
  corrupt(checkpoints / '2')
  digests = file_digests(checkpoints / '2')

  with caplog.at_level(logging.INFO), Checkpointer(workdir, keep=3) as ckpt:
    restored, data, step = ckpt.restore_latest_intact(abstract_like(make_state()))
    assert ckpt.all_steps() == [1]
  assert step == 1 and data == {'position': 1}
  assert_bit_identical(make_state(1), restored)
  assert sorted(os.listdir(checkpoints)) == ['1', '2.corrupt']
  assert file_digests(checkpoints / '2.corrupt') == digests  # Kept as it was.
  warnings = [r.getMessage() for r in caplog.records
              if r.levelno >= logging.WARNING]
  assert len(warnings) == 1, warnings
  assert 'step 2' in warnings[0] and '2.corrupt' in warnings[0]
  assert '\n' not in warnings[0]


def test_restore_latest_intact_of_an_intact_run_moves_nothing(workdir):
  _save_steps(workdir, (1, 2))
  with Checkpointer(workdir, keep=3) as ckpt:
    _, data, step = ckpt.restore_latest_intact(abstract_like(make_state()))
  assert (step, data) == (2, {'position': 2})
  assert sorted(os.listdir(pathlib.Path(workdir) / 'checkpoints')) == ['1', '2']
  with Checkpointer(workdir + '_empty', keep=1) as ckpt:
    with pytest.raises(CheckpointNotFoundError):
      ckpt.restore_latest_intact(abstract_like(make_state()))


@pytest.mark.filterwarnings('ignore::pytest.PytestUnraisableExceptionWarning')
def test_no_intact_checkpoint_says_how_to_go_on(workdir):
  _save_steps(workdir, (1, 2))
  checkpoints = pathlib.Path(workdir) / 'checkpoints'
  (checkpoints / '2.corrupt').mkdir()  # Moved aside by an earlier run.
  _flip_one_bit_in_largest_file(checkpoints / '2')
  _truncate_largest_file(checkpoints / '1')
  with Checkpointer(workdir, keep=3) as ckpt:
    with pytest.raises(NoIntactCheckpointError) as raised:
      ckpt.restore_latest_intact(abstract_like(make_state()))
  message = str(raised.value)
  assert str(checkpoints) in message and 'moved aside' in message
  assert '2.corrupt-1' in message and '1.corrupt' in message
  assert '\n' not in message
  assert sorted(os.listdir(checkpoints)) == ['1.corrupt', '2.corrupt',
                                             '2.corrupt-1']
  with Checkpointer(workdir, keep=3) as ckpt:  # The next run starts afresh.
    assert ckpt.latest_step() is None
    assert ckpt.save(1, make_state(), {})


def test_other_shapes_are_a_mismatch_not_corruption(workdir):
  _save_steps(workdir, (1, 2))
  abstract = abstract_like(make_state())
  abstract.params['dense']['kernel'] = jax.ShapeDtypeStruct((32, 64),
                                                            jnp.float32)
  with Checkpointer(workdir, keep=3) as ckpt:
    with pytest.raises(CheckpointMismatchError) as raised:
      ckpt.restore_latest_intact(abstract)
    assert ckpt.all_steps() == [1, 2]  # Nothing moved aside.
  message = str(raised.value)
  assert 'params/dense/kernel: saved (64, 64), now (32, 64)' in message
  assert 'step 2' in message and 'new --workdir' in message
  assert not isinstance(raised.value, CorruptCheckpointError)


def test_another_structure_is_a_mismatch(workdir):
  _save_steps(workdir, (1,))
  abstract = abstract_like(make_state())
  abstract.params['extra_layer'] = jax.ShapeDtypeStruct((3,), jnp.float32)
  with Checkpointer(workdir, keep=3) as ckpt:
    with pytest.raises(CheckpointMismatchError, match='extra_layer'):
      ckpt.restore(1, abstract)
    assert ckpt.all_steps() == [1]


_RESUME_SCRIPT = textwrap.dedent('''
    import logging, pathlib, sys
    import jax, jax.numpy as jnp
    from longformer_jax.checkpoint.checkpointer import Checkpointer
    logging.basicConfig(level=logging.WARNING)
    logging.getLogger('longformer_jax').setLevel(logging.INFO)
    workdir = sys.argv[1]
    state = {f'layer_{i}': {'w': jnp.full((64, 64), float(i)), 'b': jnp.ones(7)}
             for i in range(40)}
    abstract = jax.tree.map(
        lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding),
        state)
    with Checkpointer(workdir, keep=3) as ckpt:
      ckpt.save(1, state, {'position': 1})
      ckpt.save(2, state, {'position': 2})
    for path in (pathlib.Path(workdir) / 'checkpoints/2/state').rglob('d/*'):
      path.unlink()
    with Checkpointer(workdir, keep=3) as ckpt:
      _, _, step = ckpt.restore_latest_intact(abstract)
    print('resumed from step', step)
    import gc, time
    time.sleep(0.5)  # Late TensorStore callbacks and garbage coroutines.
    gc.collect()
''')


def test_resuming_past_a_broken_step_prints_a_few_lines(tmp_path):
  """Without the noise filter Orbax adds hundreds of traceback lines.

  TensorStore reports on the failed reads from its own threads, later on a
  loaded machine; the filter must already be in place before the first read
  (the metadata of the broken step) and stay in place afterwards.
  """
  script = tmp_path / 'resume.py'
  script.write_text(_RESUME_SCRIPT)
  env = dict(os.environ, JAX_PLATFORMS='cpu', PYTHONPATH=str(REPO_ROOT),
             XLA_FLAGS='--xla_force_host_platform_device_count=1')
  result = subprocess.run(
      [sys.executable, str(script), str(tmp_path / 'run')], cwd=REPO_ROOT,
      env=env, capture_output=True, text=True, timeout=300, check=True)
  output = result.stdout + result.stderr
  lines = output.strip().splitlines()
  # Two 'Saving checkpoint' lines, one warning, 'resumed from step 1'.
  assert len(lines) < 10, '\n'.join(lines[:40])
  for noise in ('Traceback', 'Event loop is closed', 'Exception ignored',
                'never retrieved', 'never awaited'):
    assert noise not in output, '\n'.join(lines[:40])
  assert result.stdout.strip() == 'resumed from step 1'
  assert any('step 2' in line and '2.corrupt' in line for line in lines)


