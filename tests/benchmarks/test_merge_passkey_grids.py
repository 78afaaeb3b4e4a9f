"""benchmarks/merge_passkey_grids.py: grids scored in pieces make the grid of all their cells."""

import json

import numpy as np
import pytest

from benchmarks import merge_passkey_grids as m


def grid(lengths, seconds, peak, step=3000, memory_bytes=100):
  """A grid as eval.py writes it: one memory, depths 0 and 50, 2 documents per cell."""
  cells = [dict(memory='trained', length=length, depth=depth, accuracy=float(depth == 50),
                n=2, seconds_per_1k_tokens=seconds) for length in lengths for depth in (0, 50)]
  return dict(checkpoint_step=step, corpus='passkey', documents_per_cell=2, seed=0, chunk=128,
              axes=dict(rows='depth', depths=[0, 50], lengths=list(lengths)),
              memories=[dict(memory='trained', memory_size=8, heatmap='passkey_grid_trained.png',
                             peak_host_bytes=peak, peak_host_exact=True,
                             seconds_per_1k_tokens=seconds, memory_bytes=memory_bytes)],
              cells=cells)


def test_cells_lengths_and_costs_are_merged():
  merged = m.merge([grid([4096], 1.0, 500), grid([1024, 2048], 4.0, 700)])
  assert merged['axes']['lengths'] == [1024, 2048, 4096]
  assert len(merged['cells']) == 6 and merged['checkpoint_step'] == 3000
  memory = merged['memories'][0]
  assert memory['peak_host_bytes'] == 700 and memory['memory_bytes'] == 100
  # weighted by the tokens read: 2 x 2 x 4096 at 1.0 s, 2 x 2 x (1024 + 2048) at 4.0 s
  assert memory['seconds_per_1k_tokens'] == pytest.approx((4096 * 1.0 + 3072 * 4.0) / 7168)
  np.testing.assert_array_equal(m.accuracy(merged, 'trained'), [[0, 0, 0], [1, 1, 1]])


@pytest.mark.parametrize('second, culprit', [
    (grid([1024], 1.0, 1, step=2000), 'checkpoint_step'),
    (grid([4096], 1.0, 1), 'length 4096, depth 0'),
    (grid([1024], 1.0, 1, memory_bytes=200), 'memory_bytes'),
])
def test_grids_that_are_not_one_grid_are_refused(second, culprit):
  with pytest.raises(m.MergeError, match=culprit):
    m.merge([grid([4096], 1.0, 1), second])


def test_the_command_writes_json_and_heatmap(tmp_path, capsys):
  paths = []
  for i, lengths in enumerate(([1024], [2048])):
    paths.append(tmp_path / f'{i}.json')
    paths[-1].write_text(json.dumps(grid(lengths, 1.0, 1)))
  out, png = tmp_path / 'merged.json', tmp_path / 'merged.png'
  assert m.main([str(p) for p in paths] + [f'--out={out}', f'--heatmap={png}']) == 0
  assert json.loads(out.read_text())['memories'][0]['heatmap'] == 'merged.png'
  assert png.read_bytes()[:8] == b'\x89PNG\r\n\x1a\n'
  assert m.main([str(tmp_path / 'missing.json'), f'--out={out}']) == 2
  assert 'missing.json' in capsys.readouterr().err
