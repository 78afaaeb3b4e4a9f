"""benchmarks/lra_shortcuts.py on a fair try's data (`--setting data.SECTION.KEY=VALUE`):
the setting reaches the generator, its rows sit beside the default's, and a setting the
shortcuts cannot read is refused before anything is written."""

import json

import pytest

from benchmarks import lra_shortcuts
from benchmarks.lra_results import read_rows

FEW = ['--tasks=retrieval', '--train_examples=60', '--test_examples=40']


def test_a_data_setting_reaches_the_generator():
  pairs, labels = lra_shortcuts.task_data(
      'retrieval', 'mini', 'test', 40, ('data.lra_retrieval.num_links=2',))
  default_pairs, _ = lra_shortcuts.task_data('retrieval', 'mini', 'test', 40)
  assert len({name for pair in pairs for name in pair.links}) == 2
  assert len({name for pair in default_pairs for name in pair.links}) > 2
  assert all((pair.links[0] == pair.links[1]) == bool(label)
             for pair, label in zip(pairs, labels))


def test_try_rows_are_kept_beside_the_default_rows(tmp_path):
  results = tmp_path / 'accuracy.json'
  assert lra_shortcuts.main(FEW + [f'--results={results}']) == 0
  assert lra_shortcuts.main(FEW + [f'--results={results}',
                                   '--setting=data.lra_retrieval.num_links=2']) == 0
  rows = read_rows(str(results))
  assert sorted((row['variant'], row.get('settings') or '') for row in rows) == [
      ('length_only', ''), ('length_only', 'data.lra_retrieval.num_links=2'),
      ('majority', ''), ('majority', 'data.lra_retrieval.num_links=2')]
  tried = [row for row in rows if row.get('settings')]
  assert all('--setting=data.lra_retrieval.num_links=2' in row['command'] for row in tried)


@pytest.mark.parametrize('setting, culprit', [
    ('model.num_layers=1', 'model.num_layers=1'),          # not the data
    ('data.lra_retrieval=2', 'data.lra_retrieval: is a section'),   # a section, not a key
    ('data.lra_retrieval.num_linkz=2', 'num_linkz'),        # no such key
    ('data.lra_retrieval.num_links', 'data.lra_retrieval.num_links'),   # no value
])
def test_a_bad_setting_names_itself_and_leaves_the_results_intact(setting, culprit, tmp_path,
                                                                  capsys):
  results = tmp_path / 'accuracy.json'
  kept = [{'task': 'listops', 'variant': 'majority', 'scale': 'mini', 'seed': 0,
           'accuracy': 0.2}]
  results.write_text(json.dumps(kept))
  assert lra_shortcuts.main(FEW + [f'--results={results}', f'--setting={setting}']) == 2
  assert culprit in capsys.readouterr().err
  assert json.loads(results.read_text()) == kept
