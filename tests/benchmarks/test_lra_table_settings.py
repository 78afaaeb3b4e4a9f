"""benchmarks/lra_table.py's fair tries (`--setting KEY=VALUE`) and self-pretraining
(`--pretrain_steps`): checked settings, rows kept beside the variant's own, the figure
plotting only the latter; a real 4-step try and a real pretrained run (slow)."""

import json

import pytest

from benchmarks import lra_figure, lra_table
from benchmarks.lra_results import ACCURACY_KEY, merge_rows, read_rows
from longformer_jax.checkpoint.checkpointer import Checkpointer
from tests.support.checkpoint_states import make_state


@pytest.mark.parametrize('setting', ['model.bigbird.block', '=4', 'model.bigbird.block=',
                                     '--config.model.bigbird.block=4', 'a/b=1'])
def test_a_malformed_setting_is_refused_before_anything_runs(setting, tmp_path, capsys):
  results = tmp_path / 'accuracy.json'
  assert lra_table.main([f'--setting={setting}', f'--results={results}',
                         f'--root={tmp_path / "runs"}']) == 2
  assert repr(setting) in capsys.readouterr().err
  assert not results.exists() and not (tmp_path / 'runs').exists()


def test_settings_are_sorted_so_one_try_has_one_name():
  assert lra_table.parse_settings(['b=2', 'a=1']) == ['a=1', 'b=2']


def test_a_try_row_is_kept_beside_the_variants_own_and_left_out_of_the_figure(tmp_path):
  path = str(tmp_path / 'accuracy.json')
  own = {'task': 'listops', 'variant': 'bigbird', 'scale': 'mini', 'seed': 0, 'accuracy': 0.5}
  tried = dict(own, accuracy=0.9, settings='model.bigbird.block=4')
  merge_rows(path, [own], ACCURACY_KEY)
  merge_rows(path, [tried], ACCURACY_KEY)
  merge_rows(path, [dict(own, accuracy=0.6)], ACCURACY_KEY)     # a rerun replaces its own row
  rows = read_rows(path)
  assert {(row.get('settings'), row['accuracy']) for row in rows} == {
      (None, 0.6), ('model.bigbird.block=4', 0.9)}
  means, tasks = lra_figure.mean_accuracy(rows, 'mini', {'bigbird'})
  assert means == {'bigbird': 0.6} and tasks == ['listops']
  merge_rows(path, [dict(own, accuracy=0.95, pretrain_steps=100)], ACCURACY_KEY)
  merge_rows(path, [dict(tried, accuracy=0.97, pretrain_steps=100)], ACCURACY_KEY)
  rows = read_rows(path)
  assert len(rows) == 4
  assert lra_figure.mean_accuracy(rows, 'mini', {'bigbird'})[0] == {'bigbird': 0.6}


def test_negative_pretraining_steps_are_refused_before_anything_runs(tmp_path, capsys):
  assert lra_table.main(['--pretrain_steps=-1', f'--root={tmp_path / "runs"}',
                         f'--results={tmp_path / "accuracy.json"}']) == 2
  assert '--pretrain_steps' in capsys.readouterr().err
  assert not (tmp_path / 'runs').exists()


def small_listops_run(tmp_path, variant: str, steps: int) -> list[str]:
  """lra_table's arguments for one ListOps run of `steps` steps on 64 tiny trees."""
  small = ['data.listops.train_examples=64', 'data.listops.valid_examples=16',
           'data.listops.test_examples=16', f'train.num_steps={steps}',
           f'train.eval_every={steps}', f'train.checkpoint_every={steps}', 'data.batch_size=8',
           'data.eval_batch_size=8']
  return ['--scale=mini', '--tasks=listops', f'--variants={variant}', '--seeds=0',
          f'--root={tmp_path / "runs"}', f'--results={tmp_path / "accuracy.json"}'
          ] + [f'--setting={s}' for s in small]


def test_a_pretraining_stopped_before_its_first_save_counts_as_trained_from_nothing(tmp_path):
  # Its empty `checkpoints` folder must not make the table take the next, whole run's time
  # for a resumed one's (null `pretrain_seconds`).
  run = tmp_path / 'pretraining'
  assert not lra_table.has_saved_step(str(run))
  (run / 'checkpoints').mkdir(parents=True)
  assert not lra_table.has_saved_step(str(run))
  assert lra_table.recorded_pretraining_seconds(str(run), 12.5) == 12.5
  with Checkpointer(str(run), keep=1, async_save=False) as checkpoints:
    checkpoints.save(3, make_state(), {})
  assert lra_table.has_saved_step(str(run))


@pytest.mark.slow
def test_a_fair_try_trains_with_its_setting_in_its_own_workdir(tmp_path):
  results = tmp_path / 'accuracy.json'
  arguments = small_listops_run(tmp_path, 'bigbird', 4) + ['--setting=model.bigbird.block=4']
  assert lra_table.main(arguments) == 0
  [row] = read_rows(str(results))
  assert row['variant'] == 'bigbird' and row['steps'] == 4
  assert 'model.bigbird.block=4' in row['settings'].split()
  [workdir] = (tmp_path / 'runs' / 'mini' / 'listops').iterdir()
  assert workdir.name.startswith('bigbird+') and 'model.bigbird.block=4' in workdir.name
  saved = json.loads((workdir / 'seed0' / 'config.json').read_text())
  assert saved['model']['bigbird']['block'] == 4


@pytest.mark.slow
def test_a_pretrained_run_trains_its_classifier_from_its_own_pretraining(tmp_path):
  results = tmp_path / 'accuracy.json'
  arguments = small_listops_run(tmp_path, 'vanilla', 2) + ['--pretrain_steps=3']
  assert lra_table.main(arguments) == 0
  [row] = read_rows(str(results))
  assert row['pretrain_steps'] == 3 and row['steps'] == 2 and row['pretrain_seconds'] > 0
  [workdir] = (tmp_path / 'runs' / 'mini' / 'listops').iterdir()
  assert workdir.name.endswith('+pretrain_steps=3')
  pretraining = json.loads((workdir / 'seed0' / 'pretraining' / 'config.json').read_text())
  assert pretraining['task'] == 'masked_pretraining'
  assert pretraining['train']['num_steps'] == 3
  saved = json.loads((workdir / 'seed0' / 'config.json').read_text())
  assert saved['train']['init_from'] == str(workdir / 'seed0' / 'pretraining')
  # Again: the finished pretraining is reused, and the row keeps the time it recorded.
  recorded = workdir / 'seed0' / 'pretraining' / lra_table.PRETRAINING_SECONDS
  assert json.loads(recorded.read_text())['seconds'] == pytest.approx(row['pretrain_seconds'],
                                                                      abs=0.05)
  recorded.write_text('{"seconds": 1234.5}')
  assert lra_table.main(arguments) == 0
  [again] = read_rows(str(results))
  assert again['pretrain_seconds'] == 1234.5
  # A pretraining the table did not train (copied in, without the record): time unknown.
  recorded.unlink()
  assert lra_table.main(arguments) == 0
  [copied] = read_rows(str(results))
  assert copied['pretrain_seconds'] is None and not recorded.exists()
  log = (workdir / 'seed0' / 'table.log').read_text()
  assert 'Started from the pretrained embedding, encoder of' in log


def test_figure_labels_of_nearby_points_are_lowered_apart_and_others_stay():
  points = {'a': (5.5, 0.507), 'b': (5.6, 0.5068), 'c': (5.7, 0.5066),   # one cluster
            'far_right': (50.0, 0.507), 'top': (5.5, 0.54), 'bottom': (5.5, 0.48)}
  offsets, _ = lra_figure.label_offsets(points)
  assert sorted(offsets[name] for name in 'abc') == [0, 1, 2]
  assert offsets['far_right'] == offsets['top'] == offsets['bottom'] == 0


def test_the_figure_axis_reaches_a_label_lowered_under_the_lowest_point():
  points = {'a': (5.5, 0.507), 'b': (5.6, 0.5068), 'c': (5.7, 0.5066), 'top': (1.0, 0.7)}
  lowered, height = lra_figure.label_offsets(points)
  assert lowered['c'] == 2
  bottom = lra_figure.labels_bottom(points, lowered, height)
  assert bottom == pytest.approx(0.5066 - 2.5 * height)
  assert bottom < min(y for _, y in points.values())
