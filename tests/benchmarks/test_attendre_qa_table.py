"""benchmarks/attendre_qa_table.py: a reading-comprehension grid's memories as table rows."""

import json

from benchmarks import attendre_qa_table


def grid(**extra):
  cells = [dict(memory=m, length=n, depth=d, accuracy=a, n=4)
           for m, values in (('attendre_lra_max:128', (1.0, 0.5, 0.75, 0.25)),
                             ('attendre_fifo:128', (0.5, 0.0, 0.25, 0.0)),
                             ('none', (0.25, 0.25, 0.0, 0.0)))
           for (n, d), a in zip(((1024, 0), (1024, 100), (2048, 0), (2048, 100)), values)]
  memories = [dict(memory='attendre_lra_max:128', variant='attendre', policy='lra_max',
                   memory_size=128, admission='score'),
              dict(memory='attendre_fifo:128', variant='attendre', policy='fifo',
                   memory_size=128, admission='-'),
              dict(memory='none', variant='vanilla', policy='fifo', memory_size=0)]
  return dict(dict(kind='attendre_qa', chunk=128, seed=0, memories=memories, cells=cells),
              **extra)


def test_each_memory_becomes_a_row_with_its_exact_match():
  rows = {r['policy']: r for r in attendre_qa_table.grid_rows(grid(), 'qa_model')}
  assert rows['lra_max'] == dict(model='qa_model', policy='lra_max', kv_memory=128, q_memory=0,
                                 admission='score', chunk=128, settings={}, em=0.625,
                                 em_by_length={'1024': 0.75, '2048': 0.5}, documents=16,
                                 seed=0)
  assert rows['fifo']['admission'] is None and rows['fifo']['em'] == 0.1875
  assert rows['none']['kv_memory'] == 0 and rows['none']['em'] == 0.125


def test_the_command_merges_rows_and_refuses_a_passkey_grid(tmp_path, capsys):
  path, out = tmp_path / 'grid.json', tmp_path / 'rows.json'
  path.write_text(json.dumps(grid()))
  assert attendre_qa_table.main([str(path), '--model=a', f'--out={out}']) == 0
  assert attendre_qa_table.main([str(path), '--model=a', f'--out={out}']) == 0
  assert len(json.loads(out.read_text())['rows']) == 3          # replaced, not repeated
  assert attendre_qa_table.main([str(path), str(path), '--model=a', f'--out={out}']) == 0
  assert len(json.loads(out.read_text())['rows']) == 3          # two grids, one row each
  assert '| a | lra_max | 128 | 0 | score |  | 128 | 0.75 | 0.50 | 0.62 |' in capsys.readouterr().out
  path.write_text(json.dumps(grid(kind='passkey')))
  assert attendre_qa_table.main([str(path), '--model=a', f'--out={out}']) == 2
  assert 'not a reading-comprehension grid' in capsys.readouterr().err


def test_memories_that_differ_in_a_setting_are_rows_of_their_own(tmp_path, capsys):
  """LFA-0 and LFA-gamma share policy and size: their `lfa_gamma` keeps them apart."""
  path, out = tmp_path / 'grid.json', tmp_path / 'rows.json'
  plain, decayed = grid(), grid()
  for memory in decayed['memories']:
    memory['lfa_gamma'] = 0.99 if memory['variant'] == 'attendre' else '-'
  for name, data in (('plain', plain), ('decayed', decayed)):
    path.write_text(json.dumps(data))
    assert attendre_qa_table.main([str(path), '--model=a', f'--out={out}']) == 0
  rows = json.loads(out.read_text())['rows']
  assert len(rows) == 5                 # the non-Attendre memories do not read it: replaced
  assert sorted(json.dumps(r['settings']) for r in rows if r['policy'] == 'lra_max') == [
      '{"lfa_gamma": 0.99}', '{}']
  assert 'lfa_gamma=0.99' in capsys.readouterr().out


def test_a_q_memory_is_a_row_of_its_own(tmp_path, capsys):
  """The grid's `q_memory_size` (passkey_grid, `q_memory=half`) keeps a Q-memory row apart from
  the same K/V memory without one, and is not taken for a setting."""
  path, out = tmp_path / 'grid.json', tmp_path / 'rows.json'
  plain, delayed = grid(), grid()
  for data, queries in ((plain, 0), (delayed, 64)):
    for memory in data['memories']:
      memory['q_memory_size'] = queries if memory['variant'] == 'attendre' else 0
  rows = {r['policy']: r for r in attendre_qa_table.grid_rows(delayed, 'a')}
  assert rows['lra_max']['q_memory'] == 64 and rows['lra_max']['settings'] == {}
  assert rows['none']['q_memory'] == 0
  for data in (plain, delayed):
    path.write_text(json.dumps(data))
    assert attendre_qa_table.main([str(path), '--model=a', f'--out={out}']) == 0
  rows = json.loads(out.read_text())['rows']
  assert len(rows) == 5                 # the non-Attendre memories have none: replaced
  assert sorted(r['q_memory'] for r in rows if r['policy'] == 'lra_max') == [0, 64]
  assert '| a | lra_max | 128 | 64 | score |  | 128 | 0.75 | 0.50 | 0.62 |' in \
      capsys.readouterr().out
