"""Pathfinder (data/lra/pathfinder.py): labels, geometry, balance, determinism and config.

Independent checks, from the generator's own record of each image:
- the label: which path end each marker sits on is found by distance to the four ends of
  the two target paths; label 1 iff the two ends are the two ends of one path;
- the markers are drawn where the record says (the image changes only around them when
  they are left out) and every target dash leaves ink on the image;
- the geometry: a float64 segment distance (textbook formula) between every two dashes that
  are not neighbours in a path is at least margin + path_gap + thickness; each path has its
  dashes, of their length, with the pivot gap and turns under 90 degrees, inside the marker
  border;
- the balance: every example has a marking of the other label, sharing one marker, whose
  marker distance is within the tolerance; and a logistic regression (numpy, written here)
  on a pixel histogram plus the marker distance, fit on one split and scored on another,
  stays at chance;
- determinism: example i depends only on (seed, split, i).
"""

import dataclasses

import numpy as np
import pytest

from longformer_jax.config.errors import ConfigError
from longformer_jax.data.lra import pathfinder_drawing
from longformer_jax.data.lra.pathfinder import PathfinderConfig, pathfinder_split

HARD = PathfinderConfig()                              # 14 dashes per path, 32x32
EASY = PathfinderConfig(dashes_per_path=6)             # the shortest paths: the largest
                                                       # marker-distance gap by class unbalanced
GAPPED = PathfinderConfig(dashes_per_path=6, margin=0.5, path_gap=2.5)   # the easy geometry
TOLERANCE = 1e-4                                       # float32 record rounding, pixels


@pytest.fixture(scope='module')
def hard():
  return pathfinder_split(HARD, 'valid', 300)


@pytest.fixture(scope='module')
def gapped():
  return pathfinder_split(GAPPED, 'valid', 300)


def point_segment(p, a, b):
  """float64 distance from points p to segments a-b (`[..., 2]` each, broadcast)."""
  v, w = b - a, p - a
  t = np.clip(np.sum(w * v, -1) / np.maximum(np.sum(v * v, -1), 1e-300), 0.0, 1.0)
  return np.linalg.norm(w - t[..., None] * v, axis=-1)


def segment_distance(p0, p1, q0, q1):
  """float64 distance between segments p0-p1 and q0-q1: 0 if they cross, else the least of
  the four endpoint-to-segment distances."""
  def cross(o, a, b):
    return (a[..., 0] - o[..., 0]) * (b[..., 1] - o[..., 1]) - (a[..., 1] - o[..., 1]) * (
        b[..., 0] - o[..., 0])
  crossing = ((cross(p0, p1, q0) * cross(p0, p1, q1) < 0)
              & (cross(q0, q1, p0) * cross(q0, q1, p1) < 0))
  distance = np.minimum(np.minimum(point_segment(p0, q0, q1), point_segment(p1, q0, q1)),
                        np.minimum(point_segment(q0, p0, p1), point_segment(q1, p0, p1)))
  return np.where(crossing, 0.0, distance)


def path_ends(data):
  """float64 `[n, 4, 2]`: path 0's seed end, its far end, path 1's seed end, its far end."""
  dashes = data.target_dashes.astype(np.float64)
  return np.stack([dashes[:, 0, 0, 0], dashes[:, 0, -1, 1],
                   dashes[:, 1, 0, 0], dashes[:, 1, -1, 1]], axis=1)


def marked_ends(data):
  """int `[n, 2]`: the end (0..3, as `path_ends`) each marker sits on, by distance."""
  gaps = np.linalg.norm(data.markers[:, :, None].astype(np.float64)
                        - path_ends(data)[:, None], axis=-1)                   # [n, 2, 4]
  assert np.all(np.sort(gaps, axis=-1)[..., 0] < TOLERANCE), 'a marker off every path end'
  assert np.all(np.sort(gaps, axis=-1)[..., 1] > 1.0), 'a marker near two path ends'
  return np.argmin(gaps, axis=-1)


def test_every_label_follows_the_path_record(hard):
  ends = marked_ends(hard)
  same_path = ends[:, 0] // 2 == ends[:, 1] // 2
  both_ends = ends[:, 0] != ends[:, 1]
  assert np.all(both_ends)
  np.testing.assert_array_equal(hard.labels, same_path.astype(np.int32))
  # The record's own fields agree.
  np.testing.assert_array_equal(hard.marker_path, ends // 2)
  np.testing.assert_array_equal(hard.marker_end, ends % 2)
  assert hard.labels.dtype == np.int32 and hard.images.dtype == np.uint8
  assert hard.images.shape == (300, 32, 32)


def test_markers_are_drawn_where_the_record_says_and_every_dash_leaves_ink(hard):
  scale = HARD.resolution / 32
  rows = np.floor(hard.markers[..., 1]).astype(int)
  cols = np.floor(hard.markers[..., 0]).astype(int)
  marker_pixels = hard.images[np.arange(300)[:, None], rows, cols]
  assert marker_pixels.min() >= 250
  # Drawn again with the markers far outside, the images differ only near the markers.
  dashes = np.concatenate([hard.target_dashes.reshape(300, -1, 2, 2),
                           hard.distractor_dashes.reshape(300, -1, 2, 2)], axis=1)
  bare = pathfinder_drawing.render(dashes, np.full((300, 2, 2), -100.0), HARD.resolution,
                                   HARD.dash_thickness * scale, HARD.marker_radius * scale)
  changed = np.argwhere(bare != hard.images)
  centres = np.stack([cols, rows], -1)[changed[:, 0]] + 0.5                   # [c, 2, 2]
  pixel = changed[:, None, [2, 1]] + 0.5
  nearest = np.min(np.linalg.norm(centres - pixel, axis=-1), axis=1)
  assert nearest.max() <= HARD.marker_radius * scale + 1.5
  assert changed.shape[0] >= 300 * 2 * 4                 # each marker adds a few pixels
  # Every target dash leaves ink: a bright pixel in the 3x3 block around its midpoint.
  middle = np.floor(hard.target_dashes.mean(axis=-2)).astype(int)             # [n, 2, D, 2]
  padded = np.pad(hard.images, ((0, 0), (1, 1), (1, 1)))
  block = np.max([padded[np.arange(300)[:, None, None], middle[..., 1] + 1 + down,
                         middle[..., 0] + 1 + right]
                  for down in (-1, 0, 1) for right in (-1, 0, 1)], axis=0)
  assert block.min() >= 128


@pytest.mark.parametrize('config', [HARD, GAPPED], ids=['hard', 'path_gap'])
def test_paths_have_their_dashes_and_never_touch(config, request):
  data = request.getfixturevalue('hard' if config is HARD else 'gapped')
  scale = config.resolution / 32
  dashes = data.target_dashes.astype(np.float64)                              # [n, 2, D, 2, 2]
  n, depth = dashes.shape[0], config.dashes_per_path
  assert dashes.shape == (n, 2, depth, 2, 2) and np.all(np.isfinite(dashes))
  lengths = np.linalg.norm(dashes[..., 1, :] - dashes[..., 0, :], axis=-1)
  np.testing.assert_allclose(lengths, config.dash_length * scale, atol=TOLERANCE)
  # Consecutive dashes: the next starts margin past a pivot margin beyond the last's end.
  heading = (dashes[..., 1, :] - dashes[..., 0, :]) / lengths[..., None]
  pivot_gap = dashes[:, :, 1:, 0] - dashes[:, :, :-1, 1]
  expected = config.margin * scale * (heading[:, :, :-1] + heading[:, :, 1:])
  np.testing.assert_allclose(pivot_gap, expected, atol=10 * TOLERANCE)
  turn_cosine = np.sum(heading[:, :, :-1] * heading[:, :, 1:], axis=-1)
  assert turn_cosine.min() > 0                           # every turn under 90 degrees
  low, high = config.marker_radius * scale, config.resolution - config.marker_radius * scale
  assert dashes.min() >= low - TOLERANCE and dashes.max() <= high + TOLERANCE
  seeds = np.linalg.norm(dashes[:, 0, 0, 0] - dashes[:, 1, 0, 0], axis=-1)
  np.testing.assert_allclose(seeds, config.seed_distance * scale, atol=10 * TOLERANCE)
  # Every pair of dashes (targets and drawn distractors) keeps the clearance, except the
  # neighbours in one path.
  distractors = data.distractor_dashes.astype(np.float64)
  every = np.concatenate([dashes.reshape(n, -1, 2, 2), distractors.reshape(n, -1, 2, 2)], 1)
  path_of = np.concatenate([np.repeat([0, 1], depth),
                            2 + np.repeat(np.arange(config.distractor_paths),
                                          config.distractor_length)])
  index = np.concatenate([np.tile(np.arange(depth), 2),
                          np.tile(np.arange(config.distractor_length), config.distractor_paths)])
  first, second = np.triu_indices(every.shape[1], k=1)
  neighbours = (path_of[first] == path_of[second]) & (np.abs(index[first] - index[second]) == 1)
  first, second = first[~neighbours], second[~neighbours]
  distance = segment_distance(every[:, first, 0], every[:, first, 1],
                              every[:, second, 0], every[:, second, 1])           # [n, pairs]
  drawn = np.isfinite(distance)
  assert drawn[:, (path_of[first] < 2) & (path_of[second] < 2)].all()
  clearance = (config.margin + config.path_gap + config.dash_thickness) * scale
  assert distance[drawn].min() >= clearance - TOLERANCE
  between_targets = (path_of[first] == 0) & (path_of[second] == 1)
  assert distance[:, between_targets].min() >= config.margin * scale
  # Distractors are there: of dashes_per_path // 3 dashes, most of them drawn.
  assert distractors.shape[1:] == (config.distractor_paths, config.distractor_length, 2, 2)
  assert np.isfinite(distractors[:, :, 0, 0, 0]).mean() > 0.5


def marker_distance(data):
  return np.linalg.norm(data.markers[:, 0].astype(np.float64) - data.markers[:, 1], axis=-1)


def test_each_marking_has_a_balanced_counterpart_of_the_other_label(hard):
  """The balance, per example: some marking of the other label that shares a marker (a
  seed end and a far end) has a marker distance within the tolerance."""
  ends, positions = marked_ends(hard), path_ends(hard)
  seed, far = ends[:, 0], ends[:, 1]
  other_seed, other_far = (seed + 2) % 4, (far + 2) % 4
  rows = np.arange(seed.size)
  def distance(a, b):
    return np.linalg.norm(positions[rows, a] - positions[rows, b], axis=-1)
  counterparts = np.stack([distance(seed, other_far), distance(other_seed, far)], axis=1)
  gap = np.min(np.abs(counterparts - marker_distance(hard)[:, None]), axis=1)
  assert gap.max() <= HARD.distance_tolerance * HARD.resolution / 32 + TOLERANCE


def logistic_accuracy(fit_features, fit_labels, score_features, score_labels, steps=400):
  """Accuracy on the score set of a logistic regression fit by gradient descent on
  standardised features (float64, numpy)."""
  mean, spread = fit_features.mean(0), fit_features.std(0) + 1e-9
  fit_x = np.concatenate([(fit_features - mean) / spread, np.ones((len(fit_labels), 1))], 1)
  score_x = np.concatenate([(score_features - mean) / spread,
                            np.ones((len(score_labels), 1))], 1)
  weights = np.zeros(fit_x.shape[1])
  for _ in range(steps):
    probability = 1 / (1 + np.exp(-fit_x @ weights))
    weights -= 0.5 * fit_x.T @ (probability - fit_labels) / len(fit_labels)
  return np.mean((score_x @ weights > 0) == score_labels)


def pixel_features(data, bins=32):
  """The `bins`-bin histogram of the pixels, the marker distance and its square."""
  histogram = np.stack([np.bincount(image.reshape(-1).astype(np.int64) * bins // 256,
                                    minlength=bins)
                        for image in data.images]).astype(np.float64)
  distance = marker_distance(data)
  return np.concatenate([histogram, distance[:, None], distance[:, None] ** 2], axis=1)


def assert_at_chance(config, count):
  fit = pathfinder_split(config, 'train', count)
  score = pathfinder_split(config, 'valid', count)
  accuracy = logistic_accuracy(pixel_features(fit), fit.labels, pixel_features(score),
                               score.labels)
  assert abs(accuracy - 0.5) <= 0.03, accuracy


def test_positive_and_negative_images_match_in_pixel_statistics():
  assert_at_chance(EASY, 2000)         # standard error 1.1 points


@pytest.mark.slow
@pytest.mark.parametrize('config', [HARD, PathfinderConfig(dashes_per_path=9),
                                    PathfinderConfig(resolution=128),
                                    PathfinderConfig(dashes_per_path=2, distractor_dashes=0)],
                         ids=['hard', 'medium', 'path_x', 'shortest'])
def test_pixel_statistics_match_at_every_difficulty(config):
  assert_at_chance(config, 2000)


def test_labels_are_exactly_balanced_in_pairs(hard):
  pairs = hard.labels.reshape(-1, 2)
  np.testing.assert_array_equal(pairs.sum(axis=1), 1)
  assert 0.3 < np.mean(pairs[:, 0]) < 0.7                # the order within a pair is random


def test_examples_depend_only_on_seed_split_and_index(hard):
  def same(a, b):
    for field in dataclasses.fields(a):
      np.testing.assert_array_equal(getattr(a, field.name), getattr(b, field.name))
  first = pathfinder_split(HARD, 'valid', 24)
  same(first, pathfinder_split(HARD, 'valid', 24))                     # same seed, same data
  prefix = dataclasses.replace(hard, **{f.name: getattr(hard, f.name)[:24]
                                        for f in dataclasses.fields(hard)})
  same(first, prefix)                                                  # whatever the count
  window = pathfinder_split(HARD, 'valid', 10, start=7)
  same(window, dataclasses.replace(prefix, **{f.name: getattr(prefix, f.name)[7:17]
                                              for f in dataclasses.fields(prefix)}))
  for other in (pathfinder_split(dataclasses.replace(HARD, seed=1), 'valid', 24),
                pathfinder_split(HARD, 'test', 24)):
    assert np.mean(np.any(other.images != first.images, axis=(1, 2))) == 1.0
  # Another model seed does not exist for the data: the section's seed is its own.
  assert 'seed' in PathfinderConfig.field_names()


def test_path_x_draws_the_same_scene_four_times_finer():
  coarse = pathfinder_split(HARD, 'test', 6)
  fine = pathfinder_split(dataclasses.replace(HARD, resolution=128), 'test', 6)
  assert fine.images.shape == (6, 128, 128)
  np.testing.assert_allclose(fine.target_dashes, 4 * coarse.target_dashes, rtol=1e-6)
  np.testing.assert_array_equal(fine.labels, coarse.labels)
  # The same ink, pooled: each 4x4 block of Path-X against the 32x32 pixel.
  assert abs(fine.images.mean() * 2 - coarse.images.mean()) < 0.25 * coarse.images.mean()


BAD_VALUES = [
    ('resolution', 8), ('resolution', 1024), ('dashes_per_path', 1), ('dashes_per_path', 21),
    ('distractor_dashes', -1), ('dash_length', 0.0), ('dash_thickness', -0.5),
    ('margin', 0.0), ('path_gap', -0.5), ('path_gap', 5.0), ('marker_radius', 0.0),
    ('seed_distance', 1.0), ('seed_distance', 15.0), ('curriculum_steps', -1),
    ('continuity', 0.5), ('distance_tolerance', 0.0), ('train_examples', 0),
    ('valid_examples', 0), ('test_examples', -2), ('seed', -1),
]


@pytest.mark.parametrize('name,value', BAD_VALUES)
def test_bad_config_values_name_their_key(name, value):
  with pytest.raises(ConfigError, match=rf'config\.data\.pathfinder\.{name}: '):
    PathfinderConfig.build({name: value}, 'data.pathfinder')


def test_config_defaults_hold_and_unknown_keys_fail():
  assert PathfinderConfig.build({}, 'data.pathfinder') == PathfinderConfig()
  unknown = r'config\.data\.pathfinder\.dashes: unknown key; did you mean'
  with pytest.raises(ConfigError, match=unknown):
    PathfinderConfig.build({'dashes': 9}, 'data.pathfinder')
  with pytest.raises(ValueError, match='split'):
    pathfinder_split(HARD, 'dev', 2)
