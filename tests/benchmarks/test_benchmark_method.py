"""The benchmarks' method on fake timings: floors from interleaved matmul rates, spreads,
the peer ratio of `--compare`, the platform header, and MFU from the rates around the
timed half. Nothing here times anything that is asserted on."""

import json
import statistics

import pytest

from benchmarks import attention_scaling, hf_longformer_peer, matmul_rate
from benchmarks import train_throughput

GFLOP = 1e9


def _fake_result(times, before, after, flops=6e9):
  return dict(times=times, flops_per_s_before=before, flops_per_s_after=after, flops=flops,
              xla_temp_mib=10.0, peak_rss_mib=300.0, device='cpu:cpu')


def test_spread_is_median_min_max_of_the_repeats():
  got = attention_scaling.spread([0.3, 0.1, 0.2, 0.5])
  assert got == dict(seconds=0.25, seconds_min=0.1, seconds_max=0.5, repeats=4)
  assert attention_scaling.spread([])['seconds'] is None


def test_case_row_floor_uses_the_mean_of_the_rates_measured_next_to_it():
  times = [2.0, 1.0, 4.0]
  row = attention_scaling.case_row('v', 1024, 'fwd_bwd',
                                   _fake_result(times, 100 * GFLOP, 300 * GFLOP), idle_mib=100.0)
  floor = 6e9 / 200e9                     # FLOPs over (100 + 300) / 2 GFLOP/s
  assert row['floor_seconds'] == pytest.approx(floor)
  assert row['over_floor'] == pytest.approx(2.0 / floor)    # the median time
  assert (row['seconds'], row['seconds_min'], row['seconds_max']) == (2.0, 1.0, 4.0)
  assert row['matmul_gflops_before'] == pytest.approx(100.0)
  assert row['matmul_gflops_after'] == pytest.approx(300.0)
  assert row['matmul_gflops'] == pytest.approx(200.0)
  assert row['peak_mib'] == pytest.approx(200.0)
  assert row['device'] == 'cpu:cpu'


def test_case_row_of_a_failed_child_keeps_the_error():
  row = attention_scaling.case_row('v', 1024, 'fwd', dict(error='timeout after 5 s'), 100.0)
  assert row['error'] == 'timeout after 5 s'
  assert row['seconds'] is None and row['over_floor'] is None


def _rows_with_peer(peer_seconds):
  ours = dict(variant=attention_scaling.PEER_OF, seq_len=1024, mode='fwd', seconds=0.3)
  other = dict(variant='longformer_blocked', seq_len=1024, mode='fwd', seconds=0.1)
  peer = dict(variant=attention_scaling.PEER, seq_len=1024, mode='fwd', seconds=peer_seconds)
  longer = dict(variant=attention_scaling.PEER_OF, seq_len=2048, mode='fwd', seconds=0.7)
  return [ours, other, peer, longer]


def test_peer_ratio_is_ours_over_the_peer_of_the_same_length_and_mode():
  rows = _rows_with_peer(1.2)
  compared = attention_scaling.attach_peer_ratios(rows)
  assert compared == [rows[0]]
  assert rows[0]['ours_over_peer'] == pytest.approx(0.3 / 1.2)
  assert rows[0]['peer_seconds'] == 1.2
  assert 'ours_over_peer' not in rows[1] and 'ours_over_peer' not in rows[3]
  table = attention_scaling.comparison_table(compared)
  assert 'ours_over_peer' in table.splitlines()[0]
  assert table.splitlines()[1].split()[-1] == '0.25'


def test_peer_ratio_is_none_when_the_peer_failed():
  rows = _rows_with_peer(None)
  attention_scaling.attach_peer_ratios(rows)
  assert rows[0]['ours_over_peer'] is None
  assert attention_scaling.comparison_table([rows[0]]).splitlines()[1].split()[-1] == '-'


def test_header_names_the_platform_and_device():
  line = attention_scaling.header_line('cuda', 'gpu:NVIDIA H100', 1)
  assert 'JAX_PLATFORMS=cuda' in line and 'gpu:NVIDIA H100 x1' in line


@pytest.fixture
def fake_children(monkeypatch):
  """attention_scaling.main with every child replaced by fake timings."""
  def in_child(task, timeout, malloc_settings=True):
    del timeout, malloc_settings
    if task['kind'] == 'idle':
      return dict(peak_rss_mib=100.0, device='cpu:fake', device_count=1)
    if task['kind'] == 'peer':
      return dict(times=[2.0, 1.0, 3.0], peak_rss_mib=0.0)
    if not task['repeats']:
      return dict(peak_rss_mib=400.0)
    return _fake_result([0.5, 0.4, 0.6], 50 * GFLOP, 150 * GFLOP)
  monkeypatch.setattr(attention_scaling, 'in_child', in_child)


def _main(tmp_path, *extra):
  out = tmp_path / 'rows.json'
  attention_scaling.main(['--variants', 'longformer_blocked', '--seq_lens', '1024', '--modes',
                          'fwd', '--out', str(out), *extra])
  return json.loads(out.read_text())


def test_compare_mode_prints_and_records_the_ratio(fake_children, monkeypatch, tmp_path, capsys):
  monkeypatch.setattr(hf_longformer_peer, 'available', lambda: '')
  rows = _main(tmp_path, '--compare')
  out = capsys.readouterr().out
  assert out.splitlines()[0].startswith('platform: JAX_PLATFORMS=')
  assert 'device: cpu:fake x1' in out
  ours = {r['variant']: r for r in rows}
  assert set(ours) == {'longformer_blocked', attention_scaling.PEER_OF, attention_scaling.PEER}
  assert ours[attention_scaling.PEER]['seconds'] == 2.0
  assert ours[attention_scaling.PEER_OF]['ours_over_peer'] == pytest.approx(0.5 / 2.0)
  assert ours['longformer_blocked']['device'] == 'cpu:cpu'   # from the case child
  assert ours['longformer_blocked']['over_floor'] == pytest.approx(0.5 / (6e9 / 100e9))
  assert 'ours_over_peer' in out


def test_compare_without_torch_says_so_in_one_line(fake_children, monkeypatch, tmp_path, capsys):
  monkeypatch.setattr(hf_longformer_peer, 'available', lambda: "ModuleNotFoundError: 'torch'")
  rows = _main(tmp_path, '--compare')
  out = capsys.readouterr().out
  assert len([l for l in out.splitlines() if 'torch/transformers do not import' in l]) == 1
  assert attention_scaling.PEER not in {r['variant'] for r in rows}
  assert 'ours_over_peer' not in out


def test_fewer_than_three_repeats_is_refused(tmp_path):
  with pytest.raises(SystemExit):
    attention_scaling.main(['--repeats', '2', '--out', str(tmp_path / 'x.json')])


def test_matmul_rate_reports_best_and_median():
  rate = matmul_rate.measure(size=32, min_repeats=3, min_seconds=0.0)
  assert rate.timings >= 3 and rate.size == 32
  assert rate.best_flops_per_s >= rate.median_flops_per_s > 0
  assert matmul_rate.default_size('cuda') > matmul_rate.default_size('cpu') == 2048


def test_timed_half_rate_is_total_tokens_over_total_time():
  # Two windows of 3 steps of 10 tokens, at 100 and 200 tokens/s: 60 tokens in 0.45 s.
  got = train_throughput.timed_half_summary([100.0, 200.0], units_per_step=10, steps_per_window=3)
  assert got['tokens_per_s'] == pytest.approx(60 / (3 * 0.1 + 3 * 0.05))
  assert got['step_seconds'] == pytest.approx(statistics.median([0.1, 0.05]))
  assert (got['step_seconds_min'], got['step_seconds_max']) == (0.05, 0.1)


def test_mfu_uses_the_mean_of_the_rates_around_the_timed_half():
  assert train_throughput.model_flops_utilisation(1e6, 100.0, 1e9, 3e9) == pytest.approx(0.05)


class _FakeTask:
  unit = 'tok'

  def train_step(self, state):
    return state + 1, object(), 16

  def host_metrics(self, device_metrics):
    return dict(loss=1.0)


def test_probe_measures_the_rate_once_when_the_first_half_ends(monkeypatch):
  calls = []
  monkeypatch.setattr(train_throughput, 'measure', lambda: calls.append(1) or 'rate')
  probe = train_throughput.MatmulProbeTask(_FakeTask(), probe_step=2)
  state, pending = 0, None
  for _ in range(4):   # the loop's order: step, metrics of the previous step, of this step
    state, metrics, _ = probe.train_step(state)
    if pending is not None:
      probe.host_metrics(pending)
    pending = metrics
    probe.host_metrics(metrics)
    assert (probe.rate_before is not None) == (state >= 2)
  assert calls == [1] and probe.rate_before == 'rate'
  assert probe.unit == 'tok' and probe.units_per_step == 16


def test_window_rates_are_the_train_windows_after_the_first_half(tmp_path):
  records = [dict(step=3, split='train', tokens_per_s=1.0), dict(step=6, split='train',
             tokens_per_s=2.0), dict(step=6, split='valid', loss=1.0),
             dict(step=9, split='train', tokens_per_s=3.0)]
  (tmp_path / 'metrics.jsonl').write_text(''.join(json.dumps(r) + '\n' for r in records))
  assert train_throughput.window_rates(str(tmp_path), first_step=3) == [2.0, 3.0]


def test_compile_time_rows_compare_each_depth_to_the_shallowest_of_its_layout():
  from benchmarks import compile_time  # pylint: disable=g-import-not-at-top
  rows = compile_time.ratio_rows({(2, True): [4.0, 2.0, 3.0], (12, True): [4.5, 9.0, 3.6],
                                  (2, False): [3.0], (12, False): [15.0]})
  assert [(r['layers'], r['scan_layers']) for r in rows] == [
      (2, True), (12, True), (2, False), (12, False)]
  assert rows[1]['seconds'] == 4.5 and rows[1]['over_shallowest'] == pytest.approx(1.5)
  assert (rows[1]['seconds_min'], rows[1]['seconds_max'], rows[1]['repeats']) == (3.6, 9.0, 3)
  assert rows[3]['over_shallowest'] == pytest.approx(5.0)


def test_matmul_shapes_count_two_flops_per_multiply_add():
  from benchmarks import matmul_shapes
  assert matmul_shapes.flops_of('td,de->te', (2, 3), (3, 4)) == 2 * 2 * 3 * 4
  assert matmul_shapes.flops_of('nhqd,nhkd->nhqk', (5, 2, 3, 7), (5, 2, 11, 7)) == 2 * 5 * 2 * 3 * 7 * 11
  for equation, left, right in matmul_shapes.SHAPES.values():   # shapes agree on shared axes
    inputs = equation.split('->')[0].split(',')
    sizes = {}
    for letters, shape in zip(inputs, (left, right)):
      for letter, size in zip(letters, shape):
        assert sizes.setdefault(letter, size) == size, equation


def test_peak_memory_line_compares_the_prediction_with_the_measured_peak():
  line = train_throughput.peak_memory_line({'peak_bytes_in_use': 2 * 2**30}, int(2.2 * 2**30))
  assert 'prediction / measured = 1.100' in line and 'peak_bytes=2147483648' in line
  assert 'not reported' in train_throughput.peak_memory_line(None, 2**30)
  assert 'not reported' in train_throughput.peak_memory_line({}, 2**30)


def test_probe_measures_with_the_rate_it_is_given():
  probe = train_throughput.MatmulProbeTask(_FakeTask(), probe_step=1,
                                           measure_rate=lambda: 'bfloat16 rate')
  _, metrics, _ = probe.train_step(0)
  probe.host_metrics(metrics)
  assert probe.rate_before == 'bfloat16 rate'
