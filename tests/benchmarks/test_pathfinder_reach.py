"""benchmarks/pathfinder_reach.py: raster distances of images small enough to count by hand,
the share within a window's reach, and bad arguments refused in one line."""

import math

import numpy as np

from benchmarks import pathfinder_reach


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


def test_share_within_reach_counts_the_layers():
  spread = pathfinder_reach.raster_spread(*hand_images())
  # Two layers: [CLS] pools features of 2w + 1 positions; w = 1 holds only the second image's
  # markers (1 <= 2), w = 7 both (13 <= 14), w = 6 not the first (13 > 12).
  table = pathfinder_reach.reach_table(spread, [1, 6, 7], layers=2)
  assert table['windows']['1'] == {'interval': 3, 'markers_within': 0.5, 'ink_within': 0.5}
  assert table['windows']['6']['markers_within'] == 0.5
  assert table['windows']['7']['markers_within'] == 1.0
  # Three layers double the reach: w = 4 reaches 16.
  assert pathfinder_reach.reach_table(spread, [4], layers=3)['windows']['4'][
      'ink_within'] == 1.0
  assert table['marker_tokens_median'] == 7.0 and table['ink_tokens_median'] == 7.0


def test_bad_arguments_are_one_line(capsys):
  assert pathfinder_reach.main(['--windows=a']) == 2
  assert pathfinder_reach.main(['--windows=16', '--layers=1']) == 2
  assert pathfinder_reach.main(['--setting=data.pathfinder.path_gap=9']) == 2
  err = capsys.readouterr().err
  assert 'windows' in err and 'data.pathfinder.path_gap' in err and 'Traceback' not in err
