"""The eval-time memory sweep: flag parsing, and eval.py end to end on a tiny trained run.

End to end: a 2-layer vanilla model without memory trains for 4 steps; eval.py
sweeps Attendre memories over it. Independent checks: Attendre with a FIFO
K/V memory of M entries scores exactly what vanilla attention with a FIFO
cache of M hidden states scores (the same keys, computed differently), and an
empty memory is the same model whatever the policy.
"""

import json
import os

import jax
import numpy as np
import pytest

import eval as eval_script
import train as train_script
from longformer_jax.config_errors import ConfigError
from longformer_jax.data.corpus import load_corpus, tokenize_documents
from longformer_jax.data.tokenizers import make_tokenizer
from longformer_jax.models.decoder_lm import DecoderLM, lm_model_config
from longformer_jax.parallel.mesh import make_mesh
from longformer_jax.evaluation import memory_sweep
from longformer_jax.train.batches import step_arrays
from longformer_jax.evaluation.lm_evaluator import LN2, Evaluator
from longformer_jax.train.lm_objective import lm_sums
from tests.test_far_recurrences import far_by_brute_force
from tests.tiny_models import tiny_config


def test_sweep_is_the_product_of_the_settings():
  points = memory_sweep.parse_sweep(
      'variant=attendre; policy=fifo,lra_max ;memory_size=128,256;chunk=64;'
      'rope_max_distance=63;lfa_gamma=0.9,1', default_chunk=32)
  assert len(points) == 2 * 2 * 2
  assert {p.policy for p in points} == {'fifo', 'lra_max'}
  assert {p.memory_size for p in points} == {128, 256}
  assert all(p.chunk == 64 and p.q_memory_size == 0 for p in points)
  assert {p.extra for p in points} == {(('lfa_gamma', 0.9), ('rope_max_distance', 63)),
                                       (('lfa_gamma', 1), ('rope_max_distance', 63))}
  default = memory_sweep.parse_sweep('policy=lfa', default_chunk=32)
  assert default == [memory_sweep.SweepPoint('attendre', 'lfa', 128, 0, 32)]


@pytest.mark.parametrize('spec,message', [
    ('variant=attendre;q_memory_size=64', 'q_memory_size must be 0'),
    ('variant=linformer', 'unknown variant'),
    ('variant=memorizing;policy=lra_max', 'memorizing memory is FIFO'),
    ('memory_size=big', 'memory_size must be integers'),
    ('policy', "expected 'key=value"),
    ('policy=fifo;policy=lfa', 'given twice'),
])
def test_bad_sweeps_name_the_flag(spec, message):
  with pytest.raises(ConfigError, match=message) as error:
    memory_sweep.parse_sweep(spec, default_chunk=32)
  assert error.value.key == 'eval.memory_sweep'


def test_overrides_map_memory_size_to_each_variant():
  trained = tiny_config(attention='vanilla', mem_len=0,
                        layer_schedule={'attention': 'vanilla,vanilla'}).model
  point = lambda variant, policy: memory_sweep.SweepPoint(variant, policy, 96, 0, 32,
                                                          (('num_sinks', 2),))
  attendre = memory_sweep.model_overrides(point('attendre', 'sink'), trained)
  assert attendre['memory_size'] == 96 and attendre['memory_policy'] == 'sink'
  assert attendre['num_sinks'] == 2 and attendre['layer_schedule'] == {}
  assert memory_sweep.model_overrides(point('vanilla', 'fifo'), trained)['mem_len'] == 96
  sinks = memory_sweep.model_overrides(point('streaming_sinks', 'sink'), trained)
  assert sinks['sink_window'] + sinks['num_sinks'] == 96 + 32
  knn = memory_sweep.model_overrides(point('memorizing', 'fifo'), trained)
  assert knn['knn_memory_size'] == 96 and knn['knn_gate'] == 'joint'


@pytest.fixture(scope='module')
def trained_vanilla(tmp_path_factory):
  workdir = str(tmp_path_factory.mktemp('short_context'))
  config = tiny_config(attention='vanilla', mem_len=0)
  config.train.update(num_steps=4, checkpoint_every=4)
  train_script.train(config, workdir)
  return workdir


def sweep_config(spec: str):
  config = tiny_config(attention='vanilla', mem_len=0)
  config.eval.update(max_tokens=2048, memory_sweep=spec)
  return config


def test_eval_sweep_writes_table_and_plot(trained_vanilla):
  spec = 'variant=attendre,vanilla;policy=fifo;memory_size=16;chunk=8'
  result = eval_script.evaluate_run(sweep_config(spec), trained_vanilla)
  out_dir = os.path.join(trained_vanilla, 'eval')
  rows = json.load(open(os.path.join(out_dir, 'memory_sweep.json')))
  assert rows == result['memory_sweep'] and len(rows) == 2
  for row in rows:
    assert {'variant', 'policy', 'memory_size', 'q_memory_size', 'chunk',
            'bits_per_byte'} <= set(row)
    assert 0 < row['bits_per_byte'] < 9
  by_variant = {r['variant']: r['bits_per_byte'] for r in rows}
  # Attendre's FIFO K/V memory sees exactly vanilla's cache of hidden states.
  np.testing.assert_allclose(by_variant['attendre'], by_variant['vanilla'], rtol=1e-5)
  table = open(os.path.join(out_dir, 'memory_sweep.md')).read()
  assert table.count('| attendre | fifo | 16 |') == 1
  assert os.path.getsize(os.path.join(out_dir, 'memory_sweep.png')) > 0


def test_eval_sweep_over_policies_shares_the_empty_memory(trained_vanilla):
  spec = 'policy=lra_max,sink;memory_size=0,8;chunk=8;rope_max_distance=6'
  rows = eval_script.evaluate_run(sweep_config(spec), trained_vanilla)['memory_sweep']
  assert len(rows) == 4 and all(r['rope_max_distance'] == 6 for r in rows)
  empty = {r['bits_per_byte'] for r in rows if r['memory_size'] == 0}
  with_memory = {r['bits_per_byte'] for r in rows if r['memory_size'] == 8}
  assert len(empty) == 1 and not empty & with_memory
  assert all(np.isfinite(r['bits_per_byte']) for r in rows)
  assert memory_sweep.line_label(rows[0]) == 'attendre lra_max chunk=8 rope_max_distance=6'


def test_far_recurrences_are_scored_alone(trained_vanilla):
  config = sweep_config('policy=fifo;memory_size=0;chunk=8')
  config.eval.far_distance = 12
  row = eval_script.evaluate_run(config, trained_vanilla)['memory_sweep'][0]
  # Reference: the plain loss path with target_mask set to the far targets
  # (found by brute force over whole rows).
  saved = eval_script.training_config(config, trained_vanilla)
  tokenizer = make_tokenizer(saved.data)
  documents = tokenize_documents(tokenizer, load_corpus(saved.data, saved.eval.split),
                                 saved.data.skip_undecodable)
  mesh, rules = make_mesh(saved.parallel.mesh_shape), saved.parallel.logical_axis_rules
  params, shardings, _ = eval_script.restore_params(saved, tokenizer, trained_vanilla, mesh, rules)
  model_config = lm_model_config(saved.model, tokenizer.vocab_size)
  evaluator = Evaluator(model_config, tokenizer, batch_size=8, chunk_len=8, mesh=mesh,
                        rules=rules, param_shardings=shardings)
  batches = [step_arrays(b, tokenizer.pad_id) for b in evaluator.streams(documents, 2048)]
  whole = {k: np.concatenate([b[k] for b in batches], axis=1) for k in batches[0]}
  far = far_by_brute_force(whole['inputs'], whole['targets'], whole['segment_ids'],
                           whole['target_mask'], 12)
  token_bytes = np.asarray(tokenizer.token_byte_lengths(), np.float32)
  loss_sum, memory = 0.0, DecoderLM.init_state(model_config, 8)
  sums_of = jax.jit(lambda m, b: lm_sums(DecoderLM(model_config), params, m, b, 8))
  for index, batch in enumerate(batches):
    width = batch['inputs'].shape[1]
    batch['target_mask'] = far[:, index * width:(index + 1) * width]
    memory, sums = sums_of(memory, batch)
    loss_sum += float(sums['loss_sum'])
  assert row['far_tokens'] == far.sum() > 0
  assert row['far_bytes'] == token_bytes[whole['targets'][far]].sum()
  np.testing.assert_allclose(row['far_bits_per_byte'], loss_sum / LN2 / row['far_bytes'],
                             rtol=1e-5)
  assert row['far_bits_per_byte'] != row['bits_per_byte']
  out_dir = os.path.join(trained_vanilla, 'eval')
  assert os.path.getsize(os.path.join(out_dir, 'memory_sweep_far.png')) > 0
  assert '| far bits/byte | far tokens |' in open(os.path.join(out_dir, 'memory_sweep.md')).read()


@pytest.mark.slow
def test_attendre_trains_in_a_decoder(tmp_path):
  config = tiny_config(attention='attendre', mem_len=0, memory_size=16, memory_policy='lra_max')
  config.train.update(num_steps=2, checkpoint_every=2)
  state, metrics = train_script.train(config, str(tmp_path))
  assert int(state.step) == 2 and np.isfinite(metrics['loss'])
  assert 0 < metrics['aux/memory_occupancy'] <= 1
