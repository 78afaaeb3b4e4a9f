"""The image task (Image Transformer, Parmar et al., 2018): digits data, batches, bits/dim, configs.

References are independent of the code under test: the digits csv read with
the csv module, raster order written as loops over (row, column, channel),
block-raster order from `attention/image_local.to_block_raster`, bits per
dimension from the model's logits with a float64 numpy log-softmax.
"""

import copy
import csv
import gzip
import io
import json
import math
import os

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

import eval as eval_script
import train as train_script
from configs import image_digits
from longformer_jax.attention.image_local.attention import from_block_raster, to_block_raster
from longformer_jax.config.errors import ConfigError
from longformer_jax.data import image_data
from longformer_jax.experiment_config import resolve_config
from longformer_jax.tasks.image import TASK as IMAGE
from tests.support.image_digits import digits_config


def csv_digits() -> list[list[int]]:
  with gzip.open(image_data.DIGITS_FILE, 'rb') as f:
    return [[int(v) for v in row] for row in csv.reader(io.TextIOWrapper(f))]


# ---- data ----------------------------------------------------------------------------------

def test_digits_splits_shapes_and_values():
  rows = csv_digits()
  assert len(rows) == 1797 and all(len(row) == 65 for row in rows)
  sizes = {'train': 1397, 'valid': 200, 'test': 200}
  begin = 0
  for split, size in sizes.items():
    images = image_data.load_digits(split)
    assert images.shape == (size, 8, 8, 1) and images.dtype == np.uint8
    assert images.min() == 0 and images.max() == 16
    # The split is by index: image i of the split is csv row begin + i (label column dropped).
    for i in (0, size - 1):
      assert images[i, :, :, 0].reshape(-1).tolist() == rows[begin + i][:64]
    begin += size
  assert image_data.SOURCES['digits'].vocab_size == 18


def test_raster_order_is_rows_columns_channels_innermost():
  images = np.random.default_rng(0).integers(0, 256, (2, 3, 4, 3)).astype(np.uint8)
  stream = image_data.to_stream(images, '1d')
  for n in range(2):
    expected = [images[n, r, c, ch] for r in range(3) for c in range(4) for ch in range(3)]
    assert stream[n].tolist() == expected


@pytest.mark.parametrize('shape,block', [((8, 8, 1), (2, 4)), ((4, 4, 3), (2, 6)),
                                         ((4, 6, 2), (4, 3))])
def test_block_raster_matches_the_attention_order_and_round_trips(shape, block):
  if shape == (8, 8, 1):
    images = image_data.load_digits('valid')[:3]         # real digits
  else:
    images = np.random.default_rng(1).integers(0, 256, (3,) + shape).astype(np.uint8)
  height, width, channels = images.shape[1:]
  view = images.reshape(len(images), height, width * channels).astype(np.int32)
  stream = image_data.to_stream(images, '2d', *block)
  np.testing.assert_array_equal(stream, to_block_raster(view, *block))
  back = from_block_raster(stream, height, width * channels, *block)
  np.testing.assert_array_equal(back.reshape(images.shape), images)


def test_unknown_image_source_and_split():
  with pytest.raises(ConfigError) as error:
    image_data.image_source('mnist')
  assert error.value.key == 'data.corpus'
  with pytest.raises(ConfigError) as error:
    image_data.load_digits('dev')
  assert error.value.key == 'eval.split'


@pytest.fixture(scope='module')
def cifar_dir(tmp_path_factory):
  """cifar10 prepared offline by the real tfds builder from tiny binary batches (2 train images
  per batch file, 3 test images), returned with the images written."""
  import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top
  from tests.support.offline_tfds import allow_tfds_building
  root = tmp_path_factory.mktemp('cifar')
  source = root / 'source' / 'cifar-10-batches-bin'
  source.mkdir(parents=True)
  (source / 'batches.meta.txt').write_text('\n'.join(f'class{i}' for i in range(10)))
  rng = np.random.default_rng(2)
  written = {'train': [], 'test': []}
  files = [(f'data_batch_{i}.bin', 'train', 2) for i in range(1, 6)] + [
      ('test_batch.bin', 'test', 3)]
  for name, split, count in files:
    images = rng.integers(0, 256, (count, 32, 32, 3)).astype(np.uint8)
    records = [bytes([k]) + image.transpose(2, 0, 1).tobytes() for k, image in enumerate(images)]
    (source / name).write_bytes(b''.join(records))        # label byte, then R, G, B planes
    written[split].extend(images)
  with pytest.MonkeyPatch.context() as monkeypatch:
    allow_tfds_building(monkeypatch)
    monkeypatch.setattr(tfds.download.DownloadManager, 'download_and_extract',
                        lambda self, url: str(root / 'source'))
    tfds.builder('cifar10', data_dir=str(root / 'data')).download_and_prepare(
        download_config=tfds.download.DownloadConfig(try_download_gcs=False))
  return str(root / 'data'), {k: np.stack(v) for k, v in written.items()}


def test_cifar10_reads_the_prepared_images_in_both_orders(cifar_dir):
  data_dir, written = cifar_dir
  train = image_data.load_images('cifar10', 'train', data_dir)
  assert train.shape == (10, 32, 32, 3) and train.dtype == np.uint8
  # tfds may shuffle the order of examples: compare as sets of images.
  assert sorted(map(bytes, train)) == sorted(map(bytes, written['train']))
  for split in ('valid', 'test'):                       # both read tfds' test split
    assert sorted(map(bytes, image_data.load_images('cifar10', split, data_dir))) == sorted(
        map(bytes, written['test']))
  values = copy.deepcopy(image_digits.get_config())
  values['data'].update(corpus='cifar10', tfds_data_dir=data_dir, max_examples=2)
  values['model']['image_local'].update(image_height=32, image_width=96, block_width=8)
  config = ml_collections.ConfigDict(resolve_config(values))
  arrays = image_data.load_arrays(config, 'train')
  assert arrays['inputs'].shape == (2, 3072) and (arrays['inputs'][:, 0] == 256).all()
  images = image_data.load_images('cifar10', 'train', data_dir, 2)
  back = from_block_raster(arrays['targets'], 32, 96, 2, 8).reshape(2, 32, 32, 3)
  np.testing.assert_array_equal(back, images)           # channels innermost, block-raster order


# ---- batches -------------------------------------------------------------------------------

@pytest.mark.parametrize('layout', ['1d', '2d'])
def test_arrays_shift_the_targets_behind_bos(layout):
  config = digits_config(layout)
  config.data.max_examples = 50
  arrays = image_data.load_arrays(config, 'valid')
  images = image_data.load_digits('valid')[:50]
  targets = (image_data.to_stream(images, '2d', 2, 4) if layout == '2d'
             else images.reshape(50, 64).astype(np.int32))
  np.testing.assert_array_equal(arrays['targets'], targets)
  assert arrays['inputs'].shape == (50, 64) and arrays['inputs'].dtype == np.int32
  assert (arrays['inputs'][:, 0] == 17).all()                  # BOS = levels
  np.testing.assert_array_equal(arrays['inputs'][:, 1:], targets[:, :-1])
  np.testing.assert_array_equal(arrays['weight'], np.ones(50, np.float32))


# ---- model, loss, bits per dimension -------------------------------------------------------

def test_bits_per_dim_equals_numpy_from_the_logits(tiny_model):
  model, params, batch, sums_fn = tiny_model
  batch = dict(batch, weight=jnp.asarray([1, 1, 1, 1, 1, 0, 1, 0], jnp.float32))
  logits, _ = model.apply({'params': params}, batch['inputs'],
                          IMAGE.init_arguments(batch)[1])
  logits = np.asarray(logits, np.float64)[..., :17]            # the 17 intensities
  log_probs = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
  targets, weight = np.asarray(batch['targets']), np.asarray(batch['weight'])
  nll = [-log_probs[b, i, targets[b, i]] for b in range(8) if weight[b] for i in range(64)]
  metrics = IMAGE.metrics(jax.tree_util.tree_map(float, sums_fn(params, batch)))
  assert metrics['dims'] == 6 * 64 and metrics['examples'] == 6
  np.testing.assert_allclose(metrics['bits_per_dim'], np.mean(nll) / math.log(2), rtol=1e-5)
  np.testing.assert_allclose(metrics['loss'], np.mean(nll), rtol=1e-5)


def test_the_decoder_is_causal_over_the_stream(tiny_model):
  """The output at slot i predicts position i: it must not change with inputs after slot i."""
  model, params, batch, _ = tiny_model
  apply = jax.jit(lambda inputs: model.apply(
      {'params': params}, inputs, IMAGE.init_arguments(batch)[1])[0])
  base = np.asarray(apply(batch['inputs']))
  for slot in (1, 8, 33, 63):
    changed = np.asarray(apply(batch['inputs'].at[:, slot].set(
        (batch['inputs'][:, slot] + 5) % 17)))
    np.testing.assert_allclose(changed[:, :slot], base[:, :slot], atol=1e-6)
    assert np.abs(changed[:, slot:] - base[:, slot:]).max() > 1e-6


# ---- config errors -------------------------------------------------------------------------

@pytest.mark.parametrize('key,change', [
    ('data.corpus', lambda v: v['data'].update(corpus='mnist')),
    ('data.corpus', lambda v: v['data'].update(corpus='stdlib')),
    ('model.image_local.image_height',
     lambda v: v['model']['image_local'].update(image_height=4)),     # 64 % 32 == 0, wrong size
    ('model.image_local.image_height', lambda v: v['data'].update(corpus='cifar10')),
    ('model.image_local.image_width', lambda v: (                   # width forgets channels
        v['data'].update(corpus='cifar10'),
        v['model']['image_local'].update(image_height=32, image_width=32))),
    ('model.causal', lambda v: v['model'].update(causal=False)),
    ('data.seq_len', lambda v: v['data'].update(seq_len=128)),
    ('task', lambda v: v.update(task='images')),
])
def test_bad_image_settings_name_the_key(key, change):
  values = copy.deepcopy(image_digits.get_config())
  change(values)
  with pytest.raises(ConfigError) as error:
    resolve_config(values)
  assert error.value.key == key
  assert '\n' not in str(error.value)


def test_config_file_layouts():
  for layout in ('', '2d', '1d'):
    resolved = resolve_config(image_digits.get_config(layout))
    assert resolved['task'] == 'image'
    assert resolved['model']['image_local']['layout'] == (layout or '2d')
  resolve_config(dict(image_digits.get_config('1d'), data={'corpus': 'cifar10'}))  # 1d: any size
  with pytest.raises(ConfigError) as error:
    image_digits.get_config('3d')
  assert error.value.key == '--config'


# ---- training and evaluation ---------------------------------------------------------------

def test_three_steps_train_and_validation_reports_bits_per_dim(tmp_path, capsys):
  config = digits_config('2d', num_steps=3, log_every=1, eval_every=3, checkpoint_every=3,
                         eval_max_examples=40, async_checkpointing=False)
  state, metrics = train_script.train(config, str(tmp_path))
  assert int(state.step) == 3
  valid = metrics['final_valid']
  assert valid['examples'] == 40 and valid['dims'] == 40 * 64
  assert 0 < valid['bits_per_dim'] < 8
  assert valid['bits_per_dim'] == pytest.approx(valid['loss'] / math.log(2))
  lines = [json.loads(line) for line in open(os.path.join(tmp_path, 'metrics.jsonl'))]
  assert [line['step'] for line in lines if line['split'] == 'train'] == [1, 2, 3]
  assert all('bits_per_dim' in line for line in lines)
  config.eval.split = 'test'
  config.eval.image_samples = 3
  result = eval_script.evaluate_run(config, str(tmp_path))
  assert result['examples'] == 200 and 0 < result['bits_per_dim'] < 8
  assert '| bits/dim | intensity accuracy | loss | examples |' in capsys.readouterr().out
  from tests.support.png_reader import read_png   # 3 digits of 8 x 8, 4 x 4 pixels each
  header, _ = read_png(open(os.path.join(tmp_path, 'eval', 'samples.png'), 'rb').read())
  assert (header['height'], header['width']) == (2 * 33 - 1, 2 * 33 - 1)


@pytest.mark.slow
def test_digits_config_learns(tmp_path):
  """configs/image_digits.py (its model) for 150 steps: well below the 17-level uniform bound."""
  values = copy.deepcopy(image_digits.get_config())
  values['train'].update(num_steps=150, eval_every=150, checkpoint_every=150,
                         async_checkpointing=False)
  config = ml_collections.ConfigDict(resolve_config(values))
  _, metrics = train_script.train(config, str(tmp_path))
  assert metrics["final_valid"]["bits_per_dim"] < 0.7 * math.log2(17)
