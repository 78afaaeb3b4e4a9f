"""benchmarks/masked_pixel_baselines.py: the rules' scores on images small enough to count
by hand, and a bad setting refused in one line."""

import math

import numpy as np

from benchmarks import masked_pixel_baselines


def test_scores_of_a_hand_counted_image():
  train = np.array([[[0, 0], [0, 255]]], np.uint8)            # 3 background pixels, 1 ink
  valid = np.array([[[0, 255], [255, 255]]], np.uint8)
  scores = masked_pixel_baselines.pixel_baselines(train, valid)
  assert scores['majority_value'] == 0 and scores['valid_pixels'] == 4
  assert scores['majority_accuracy'] == 0.25
  # Frequencies 3/4 and 1/4 (the floor for unseen values is negligible).
  expected = -(math.log(0.75) + 3 * math.log(0.25)) / 4
  assert abs(scores['unigram_nats'] - expected) < 1e-3
  # Left neighbours: [0 (background), 0] and [0 (background), 255]: right at (0,0), (1,1).
  assert scores['left_neighbour_accuracy'] == 0.5
  # Contexts (up 1, down 2, left 4, right 8 when ink). Train: (0,0) sees ink below-right? no:
  # its neighbours are (1,0)=0 below and (0,1)=0 right -> 0; (0,1): below (1,1)=255 -> 2;
  # (1,0): right (1,1)=255 -> 8; (1,1): none -> 0. So context 0 holds {0, 255}, 2 and 8 hold 0.
  # Valid: (0,0): right and below ink -> 10, unseen, so every value ties and the rule says 0,
  # which is right; (0,1) -> 2 and (1,0) -> 8 say 0, wrong (255); (1,1) -> 5, unseen, says
  # 0, wrong.
  assert scores['neighbours_accuracy'] == 0.25
  np.testing.assert_array_equal(
      masked_pixel_baselines.neighbour_contexts(train)[0], [[0, 2], [8, 0]])
  np.testing.assert_array_equal(
      masked_pixel_baselines.neighbour_contexts(valid)[0], [[10, 2], [8, 5]])


def test_a_bad_setting_is_one_line(capsys):
  assert masked_pixel_baselines.main(['--setting=data.pathfinder.path_gap=9']) == 2
  err = capsys.readouterr().err
  assert 'data.pathfinder.path_gap' in err and 'Traceback' not in err
