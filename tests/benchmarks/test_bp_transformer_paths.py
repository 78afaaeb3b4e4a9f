"""benchmarks/bp_transformer_paths.py: the three paths timed in one row, the rate beside them."""

import functools
import json

from benchmarks import bp_transformer_paths, matmul_rate


def test_a_row_times_every_path_with_the_matmul_rate(tmp_path, capsys, monkeypatch):
  # The real rate measurement, on a small matmul (the row's shape is what is tested).
  monkeypatch.setattr(bp_transformer_paths.matmul_rate, 'measure',
                      functools.partial(matmul_rate.measure, size=256, min_seconds=0.01))
  out = tmp_path / 'paths.json'
  assert bp_transformer_paths.main(['--seq_lens=16', '--repeats=2', f'--out={out}']) == 0
  row, = json.loads(out.read_text())['rows']
  assert row['seq_len'] == 16 and len(row['matmul_gflops']) == 2
  for path in ('grouped', 'gathered', 'dense'):
    low, high = row[f'{path}_ms_range']
    assert 0 < low <= row[f'{path}_ms'] <= high
  for path in ('gathered', 'dense'):
    assert row[f'{path}_over_grouped'] == round(row[f'{path}_ms'] / row['grouped_ms'], 2)
  assert 'dense / grouped' in capsys.readouterr().out
