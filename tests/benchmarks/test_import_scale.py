"""benchmarks/import_scale.py builds the checkpoints it measures: the real models' shapes
(parameter counts as published) in a layout the importer reads."""

import numpy as np

from benchmarks import import_scale
from longformer_jax.convert.safetensors_reader import read_tensors, weight_files


def test_shapes_have_the_published_parameter_counts():
  counts = {size: sum(int(np.prod(s)) for s in import_scale.tensor_shapes(
      import_scale.SIZES[size]).values()) for size in ('1b', '7b')}
  # Llama-3.2-1B (tied embeddings) and Mistral-7B-v0.1 as their model cards count them.
  assert counts == {'1b': 1_235_814_400, '7b': 7_241_732_096}


def test_built_checkpoint_is_sharded_bfloat16_the_reader_takes(tmp_path, monkeypatch):
  monkeypatch.setattr(import_scale, 'SHARD_BYTES', 4 * 10 ** 6)      # several shards
  total = import_scale.build_checkpoint('small', str(tmp_path))
  shapes = import_scale.tensor_shapes(import_scale.SIZES['small'])
  assert len(weight_files(str(tmp_path))) > 1
  tensors = read_tensors(str(tmp_path), dtype='bfloat16')
  assert {k: v.shape for k, v in tensors.items()} == shapes
  assert total == 2 * sum(int(np.prod(s)) for s in shapes.values())
  assert all(v.dtype.name == 'bfloat16' for v in tensors.values())
  some = {'model.norm.weight', 'model.layers.1.mlp.down_proj.weight'}     # across the shards
  assert set(read_tensors(str(tmp_path), names=some)) == some
  np.testing.assert_array_equal(np.asarray(tensors['model.norm.weight'], np.float32), 1.0)
  weights = np.asarray(tensors['model.layers.0.mlp.up_proj.weight'], np.float32)
  assert 0.015 < weights.std() < 0.025
  table = np.asarray(tensors['model.embed_tokens.weight'], np.float32)   # tied: the output
  assert not table[list(import_scale.END_TOKENS)].any() and table[3:].std() > 0.015


def test_place_consuming_empties_the_numpy_tree_as_it_places():
  """The importer's host-memory saving: each numpy leaf leaves its tree once placed."""
  import jax
  from longformer_jax.train.initialization import place_consuming
  params = {'layer': {'kernel': np.arange(6.0).reshape(2, 3), 'bias': np.ones(3)},
            'scale': np.full(4, 2.0)}
  expected = {'layer': {'kernel': params['layer']['kernel'].copy(), 'bias': np.ones(3)},
              'scale': np.full(4, 2.0)}
  device = jax.sharding.SingleDeviceSharding(jax.devices()[0])
  shardings = {'layer': {'kernel': device, 'bias': device}, 'scale': device}
  placed = place_consuming(params, shardings)
  assert params == {}
  for got, want in zip(jax.tree_util.tree_leaves(placed), jax.tree_util.tree_leaves(expected)):
    assert isinstance(got, jax.Array)
    np.testing.assert_array_equal(np.asarray(got), want)


def test_the_import_line_gives_the_benchmark_its_phases():
  """The importer's last line (convert/workdir_cli.phases_line) is what import_scale.py
  parses for the read and write phases: a change to one must reach the other."""
  from longformer_jax.convert import workdir_cli
  line = ('wrote /tmp/run (config.json, checkpoints/0): '
          + workdir_cli.phases_line(workdir_cli.phases(2_470_000_000, 4.4, 13.2)))
  assert '2.47 GB' in line and '0.56 GB/s' in line
  assert import_scale.import_phases(['other output', line]) == {'read_phase_s': 4.4,
                                                                'write_phase_s': 13.2}
  assert import_scale.import_phases(['no phases here']) == {}
