"""Pod plans: the presets, the row's bookkeeping, and one plan compiled on 8 fake devices."""

import json

import jax
import pytest

from benchmarks import pod_plans
from configs import pod_bigbird, pod_longformer, pod_sizes, pod_xl
from longformer_jax.config.errors import ConfigError

TINY = (('model.num_layers', 2), ('model.d_model', 64), ('model.num_heads', 4),
        ('model.head_dim', 16), ('model.d_ff', 128))


def test_every_plan_names_a_preset_of_its_config_and_a_slice():
  for name, spec in pod_plans.PLANS.items():
    path, preset = spec.split(':')
    module = {'configs/pod_xl.py': pod_xl, 'configs/pod_longformer.py': pod_longformer,
              'configs/pod_bigbird.py': pod_bigbird}[path]
    assert preset in module.PLANS, name
    assert pod_plans.slice_of(spec) in pod_sizes.SLICES, name
  assert len(pod_plans.PLANS) == len(pod_xl.PLANS) + len(pod_longformer.PLANS) + len(
      pod_bigbird.PLANS)


def test_a_plan_fills_its_slice():
  """Each preset's mesh has exactly its slice's chips, and its rows fill the batch axes."""
  for module in (pod_xl, pod_longformer, pod_bigbird):
    for preset, plan in module.PLANS.items():
      devices = pod_sizes.SLICES[preset.rsplit('_', 1)[-1]]['devices']
      mesh = tuple(plan['mesh']) + (1,) * (4 - len(plan['mesh']))
      assert mesh[0] * mesh[1] * mesh[2] * mesh[3] == devices, preset
      assert plan['rows'] % (mesh[0] * mesh[1]) == 0, preset


def test_an_unknown_preset_is_one_line_naming_the_choices():
  with pytest.raises(ConfigError, match='pod_xl.py:2b_v5p128: unknown plan; use one of'):
    pod_xl.get_config('2b_v5p128')


def test_collectives_are_counted_by_op_name():
  hlo = '\n'.join(['  %a = f32[4] all-gather(f32[1] %x), dimensions={0}',
                   '  %b = (f32[4], f32[4]) collective-permute-start(f32[4] %y)',
                   '  %c = f32[4] collective-permute-done((f32[4], f32[4]) %b)',
                   '  %d = f32[4] all-reduce(f32[4] %z), to_apply=%sum'])
  counts = pod_plans.collective_counts(hlo)
  assert counts['all-gather'] == 1 and counts['collective-permute'] == 1
  assert counts['all-reduce'] == 1 and counts['reduce-scatter'] == 0


def test_rows_merge_by_plan_and_overrides(tmp_path):
  out = tmp_path / 'plans.json'
  alternative = [['parallel.mesh_shape', [1, 256, 1]]]
  pod_plans.merge_rows(out, [{'plan': 'xl_1b_v5p128', 'v': 1}, {'plan': 'xl_1b_v5e256', 'v': 1},
                             {'plan': 'xl_1b_v5e256', 'overrides': alternative, 'v': 1}])
  merged = pod_plans.merge_rows(out, [{'plan': 'xl_1b_v5p128', 'overrides': [], 'v': 2}])
  assert [(row['plan'], row['v'], bool(row.get('overrides'))) for row in merged] == [
      ('xl_1b_v5p128', 2, False), ('xl_1b_v5e256', 1, False), ('xl_1b_v5e256', 1, True)]
  assert json.loads(out.read_text()) == merged


@pytest.mark.slow
def test_the_8b_131k_v5e_plan_compiles_on_8_devices_with_its_axes():
  """The plan with every axis (fsdp, tensor, sequence), shrunk to 8 fake devices
  (1, 2, 2, 2) and tiny widths: its step compiles, the embedding is sharded over tensor
  (vocabulary) and fsdp x sequence (width: the default rules), the halo exchange
  of the split window is in the program, and the recomputation of `remat_policy='full'`
  costs FLOPs (MFU bound below 1)."""
  assert jax.device_count() >= 8
  overrides = TINY + (('parallel.mesh_shape', (1, 2, 2, 2)), ('data.batch_size', 2),
                      ('data.eval_batch_size', 2), ('data.chunk_len', 512),
                      ('model.longformer.window', 32))
  row = pod_plans.measure_plan('longformer_8b_131k_v5e256',
                               pod_plans.PLANS['longformer_8b_131k_v5e256'], overrides)
  assert row['mesh'] == {'data': 1, 'fsdp': 2, 'tensor': 2, 'sequence': 2}
  assert row['total_bytes'] > 0 and row['temp_bytes'] > 0
  largest = row['largest_arrays'][0]          # the input embedding [vocab, embed]
  assert largest['path'] == 'params/embedding/embedding'
  assert largest['spec'] == "P('tensor', ('fsdp', 'sequence'))"     # the default rules
  assert largest['device_shape'] == [pod_sizes.VOCAB_SIZE // 2, 64 // 4]
  assert row['collectives']['collective-permute'] > 0
  assert 0.5 < row['mfu_bound'] < 1.0
  assert row['while_loops'] == 0
  assert row['largest_buffers'] and all(b['bytes'] > 0 for b in row['largest_buffers'])


def test_largest_buffers_skip_fusion_bodies():
  hlo = '\n'.join([
      '%fused_computation.1 (param_0: f32[8,1000]) -> f32[8,1000] {',
      '  %big = f32[8,1000,50]{2,1,0} broadcast(f32[8,1000]{1,0} %param_0), dimensions={0,1}',
      '  ROOT %r = f32[8,1000]{1,0} reduce(f32[8,1000,50]{2,1,0} %big, f32[] %c), dimensions={2}',
      '}',
      'ENTRY %main (p: bf16[8,1000]) -> f32[8,1000] {',
      '  %p = bf16[8,1000]{1,0} parameter(0)',
      '  %f = f32[8,1000]{1,0} fusion(bf16[8,1000]{1,0} %p), kind=kLoop',
      '  ROOT %g = f32[8,1000]{1,0} fusion(f32[8,1000]{1,0} %f), kind=kLoop',
      '}'])
  rows = pod_plans.largest_buffers(hlo)
  assert rows[0] == {'dtype': 'f32', 'shape': [8, 1000], 'op': 'fusion', 'instructions': 2,
                     'bytes': 32000}
  assert rows[1]['dtype'] == 'bf16' and rows[1]['op'] == 'parameter'
  assert all(row['op'] != 'broadcast' for row in rows)


def test_the_table_marks_a_plan_without_headroom():
  row = {'plan': 'p', 'devices': 64, 'chip': 'TPU v5p', 'params': 1.2e9, 'rows': 64,
         'mesh': {'data': 1, 'fsdp': 64, 'tensor': 1, 'sequence': 1}, 'tokens_per_row': 32768,
         'argument_bytes': 4e8, 'temp_bytes': 90e9, 'total_bytes': 90.4e9,
         'hbm_fraction': 90.4 / 95, 'fits_with_10pct': False, 'best_case_step_s': 1.3,
         'mfu_bound': 0.78}
  table = pod_plans.markdown_table([row, {'plan': 'q', 'error': 'boom'}]).splitlines()
  assert table[2] == ('| p | 64 v5p | (1, 64, 1, 1) | 1.20B | 64 x 32,768 | 0.40 | 90.00 '
                      '| 90.40 | 95% | **no** | 1.30 s | 0.78 |')
  assert table[3] == '| q | error: boom |'
