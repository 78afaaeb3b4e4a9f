"""benchmarks/pathfinder_reach.py: raster distances of images small enough to count by hand,
the share within a window's reach, the reach against the encoder's own gradients, and bad
arguments refused in one line."""

import math

import numpy as np

from benchmarks import pathfinder_reach, receptive_fields
from longformer_jax.models.resolved_model import encoder_model_config
from tests.support.tiny_models import tiny_config


def hand_images():
  """Two 4 x 4 images: ink and markers at (x, y) = (0, 0) and (1, 3), tokens 0 and 13; and
  at (2, 1) and (3, 1), tokens 6 and 7."""
  images = np.zeros((2, 4, 4), np.uint8)
  images[0, 0, 0] = images[0, 3, 1] = 255
  images[1, 1, 2] = images[1, 1, 3] = 128
  markers = np.array([[[0.0, 0.0], [1.0, 3.0]], [[2.2, 0.9], [3.0, 1.0]]])
  return images, markers


def test_raster_distances_of_hand_counted_images():
  spread = pathfinder_reach.raster_spread(*hand_images())
  np.testing.assert_array_equal(spread['marker_tokens'], [13, 1])
  np.testing.assert_array_equal(spread['ink_tokens'], [13, 1])
  np.testing.assert_allclose(spread['marker_pixels'], [math.sqrt(10), math.hypot(0.8, 0.1)])


def test_share_within_reach_counts_the_layers_and_the_pooling():
  spread = pathfinder_reach.raster_spread(*hand_images())
  # Two layers, 'cls': [CLS] pools states of layer 1, intervals of 2w + 1 positions; w = 1
  # holds only the second image's markers (1 <= 2), w = 7 both (13 <= 14), w = 6 not the
  # first (13 > 12).
  table = pathfinder_reach.reach_table(spread, [1, 6, 7], layers=2, pooling='cls')
  assert table['windows']['1'] == {'interval': 3, 'markers_within': 0.5, 'ink_within': 0.5}
  assert table['windows']['6']['markers_within'] == 0.5
  assert table['windows']['7']['markers_within'] == 1.0
  # 'mean' pools the last layer's states, intervals of 4w + 1: w = 4 reaches 16 >= 13.
  mean = pathfinder_reach.reach_table(spread, [3, 4], layers=2, pooling='mean')
  assert mean['windows']['4'] == {'interval': 17, 'markers_within': 1.0, 'ink_within': 1.0}
  assert mean['windows']['3']['markers_within'] == 0.5
  # Three layers under 'cls' reach as far as two under 'mean'.
  assert pathfinder_reach.reach_table(spread, [4], layers=3, pooling='cls')['windows']['4'][
      'ink_within'] == 1.0
  assert table['marker_tokens_median'] == 7.0 and table['ink_tokens_median'] == 7.0


def window_fields(layers: int, window: int, length: int = 24) -> np.ndarray:
  """The measured fields of a `layers`-layer encoder with a one-sided window, no global."""
  config = tiny_config(attention='longformer', longformer={'window': window}, causal=False,
                       num_layers=layers)
  model_config = encoder_model_config(dict(config.model.to_dict()), 64)
  return receptive_fields.state_fields(model_config, np.ones(length, bool),
                                       np.zeros(length, bool), batch=8)


def test_pooled_reach_is_what_the_encoder_reads():
  # The interval a state reads, measured: state j depends on input i iff |i - j| <= l w after
  # l layers. 'mean' pools the last layer's states (l = L), 'cls' the inputs of the last
  # layer's [CLS] (l = L - 1); pooled_reach is the interval's width less one.
  window = 2
  for layers in (1, 2):
    rows, cols = np.indices((24, 24))
    np.testing.assert_array_equal(window_fields(layers, window),
                                  np.abs(rows - cols) <= layers * window)
  assert pathfinder_reach.pooled_reach(window, 2, 'mean') == 2 * 2 * window
  assert pathfinder_reach.pooled_reach(window, 2, 'cls') == 2 * 1 * window


def test_lra_fields_take_the_model_settings():
  # ListOps' mini local control (128 tokens, 4 layers, window 3), cut to one layer of
  # window 5: state j reads |i - j| <= 5, [CLS] included as an ordinary token.
  fields, valid, first = receptive_fields.lra_fields(
      'listops', 'local', 'mini', settings=('model.num_layers=1', 'model.longformer.window=5'))
  rows, cols = np.indices((128, 128))
  assert first == 1 and valid.all()
  np.testing.assert_array_equal(fields, np.abs(rows - cols) <= 5)


def test_field_shares_of_hand_made_fields():
  images, markers = hand_images()
  # [CLS] at 0, the 4 x 4 raster at 1-16: the first image's markers and ink at 1 and 14,
  # the second's at 7 and 8. State 3 reads 1-8, state 10 reads 7-16, the rest themselves.
  fields = np.eye(17, dtype=bool)
  fields[3, 1:9] = True
  fields[10, 7:17] = True
  pooled = np.ones(17, bool)
  shares = pathfinder_reach.field_shares(fields, 1, pooled, images, markers)
  assert shares == {'markers_within': 0.5, 'ink_within': 0.5, 'field_median': 1.0}
  fields[10, 1] = True                                 # state 10 now reads 1 and 14
  assert pathfinder_reach.field_shares(fields, 1, pooled, images, markers)[
      'markers_within'] == 1.0
  pooled[10] = False                                   # ... but is not pooled
  assert pathfinder_reach.field_shares(fields, 1, pooled, images, markers)[
      'ink_within'] == 0.5


def test_bad_arguments_are_one_line(capsys):
  assert pathfinder_reach.main(['--windows=a']) == 2
  assert pathfinder_reach.main(['--windows=16', '--layers=0']) == 2
  assert pathfinder_reach.main(['--setting=data.pathfinder.path_gap=9']) == 2
  assert pathfinder_reach.main(['--test_examples=2', '--variants=lsh']) == 2
  assert pathfinder_reach.main(['--test_examples=2', '--variants=local',
                                '--setting=model.longformer.windw=3']) == 2
  err = capsys.readouterr().err
  assert 'windows' in err and 'data.pathfinder.path_gap' in err and "'lsh'" in err
  assert 'windw' in err and 'Traceback' not in err
