"""benchmarks/pathfinder_controls.py: the connected-components rule on drawn images, the CNN
control's row, and bad input."""

import json

import numpy as np
import pytest

from benchmarks import pathfinder_controls
from longformer_jax.data.lra.pathfinder import PathfinderSplit


def scenes(images, markers, labels) -> PathfinderSplit:
  n = len(images)
  empty = np.zeros((n, 0))
  return PathfinderSplit(np.asarray(images, np.uint8), np.asarray(labels), empty, empty,
                         np.asarray(markers, np.float32), empty, empty, np.arange(n))


def test_components_rule_follows_the_ink_between_the_markers():
  joined = np.zeros((16, 16))
  joined[4, 2:12] = 200                      # one stroke along row 4 from x = 2 to x = 11
  broken = joined.copy()
  broken[4, 6:8] = 0                         # a gap of two pixels
  faint = joined.copy()
  faint[4, 5] = 20                           # below the middle threshold
  markers = [[[2.5, 4.5], [11.5, 4.5]]] * 3  # (x, y) centres on the stroke's two ends
  split = scenes([joined, broken, faint], markers, [1, 0, 0])
  assert list(pathfinder_controls.components_predictions(split, 1, 0)) == [1, 0, 1]
  assert list(pathfinder_controls.components_predictions(split, 32, 0)) == [1, 0, 0]
  # Dilating by one pixel closes a two-pixel gap.
  assert list(pathfinder_controls.components_predictions(split, 32, 1)) == [1, 1, 1]


def test_components_row_is_chosen_on_training_images(tmp_path):
  results = tmp_path / 'accuracy.json'
  assert pathfinder_controls.main(['--control=components', '--train_examples=24',
                                   '--test_examples=24', f'--results={results}',
                                   '--setting=data.pathfinder.dashes_per_path=2']) == 0
  row, = json.loads(results.read_text())
  assert row['variant'] == 'connected_components' and row['test_examples'] == 24
  assert row['settings'] == 'data.pathfinder.dashes_per_path=2'
  assert row['threshold'] in pathfinder_controls.THRESHOLDS
  assert row['dilation'] in pathfinder_controls.DILATIONS
  assert 0 <= row['accuracy'] <= 1 and '--setting=data.pathfinder.dashes_per_path=2' in row['command']


def test_cnn_row_records_its_curve(tmp_path):
  results = tmp_path / 'accuracy.json'
  assert pathfinder_controls.main(['--control=cnn', '--label=marker_side', '--steps=3',
                                   '--eval_every=2', '--batch_size=4', '--train_examples=16',
                                   '--test_examples=8', f'--results={results}']) == 0
  row, = json.loads(results.read_text())
  assert row['variant'] == 'cnn_control_marker_side' and row['steps'] == 3
  assert [point[0] for point in row['curve']] == [2, 3]
  assert row['accuracy'] == row['curve'][-1][2]


def test_cnn_reads_the_curriculum_images_for_its_first_steps():
  rng = np.random.default_rng(0)
  good = rng.uniform(size=(8, 16, 16, 1)).astype(np.float32)
  poisoned = np.full_like(good, np.nan)          # a step that reads these gives a NaN loss
  labels = np.array([0, 1] * 4, np.int32)
  whole = pathfinder_controls.train_cnn(poisoned, labels, good, labels, steps=2, batch_size=4,
                                        eval_every=1, first=(good, labels, 2))
  assert all(np.isfinite(loss) for _, loss, _ in whole)
  switched = pathfinder_controls.train_cnn(poisoned, labels, good, labels, steps=2,
                                           batch_size=4, eval_every=1, first=(good, labels, 1))
  assert np.isfinite(switched[0][1]) and np.isnan(switched[1][1])


def test_curriculum_data_is_the_short_paths_and_its_switch():
  setting = ('data.pathfinder.curriculum_steps=5',)
  first, switch = pathfinder_controls.curriculum_data('mini', 4, setting, steps=6)
  assert switch == 5 and first.target_dashes.shape == (4, 2, 2, 2, 2)     # 2 dashes a path
  assert pathfinder_controls.curriculum_data('mini', 4, (), steps=6) is None


def test_marker_side_label_reads_the_second_marker():
  split = scenes(np.zeros((2, 32, 32)), [[[30, 5], [3, 5]], [[3, 5], [30, 5]]], [0, 1])
  assert list(pathfinder_controls.labels_of(split, 'marker_side')) == [1, 0]
  assert list(pathfinder_controls.labels_of(split, 'path')) == [0, 1]


@pytest.mark.parametrize('argv,culprit', [
    (['--control=cnn', '--setting=model.d_model=8'], 'data.SECTION.KEY=VALUE'),
    (['--control=cnn', '--setting=data.pathfinder.dashes_per_path=99'], 'dashes_per_path'),
    (['--control=cnn', '--steps=0'], '--steps'),
    (['--control=components', '--label=marker_side'], '--label'),
    (['--control=cnn', '--steps=5', '--setting=data.pathfinder.curriculum_steps=5'],
     'curriculum_steps'),
])
def test_bad_input_is_a_short_error_and_writes_nothing(tmp_path, capsys, argv, culprit):
  results = tmp_path / 'accuracy.json'
  results.write_text('[]\n')
  assert pathfinder_controls.main(argv + [f'--results={results}', '--train_examples=4',
                                          '--test_examples=4']) == 2
  assert culprit in capsys.readouterr().err
  assert results.read_text() == '[]\n'
