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
from longformer_jax.config.errors import ConfigError
from longformer_jax.data.corpus import load_corpus, tokenize_documents
from longformer_jax.data.tokenizers import make_tokenizer
from longformer_jax.models.decoder_lm import DecoderLM
from longformer_jax.models.resolved_model import lm_model_config
from longformer_jax.models.model_config import resolve_model
from longformer_jax.parallel.mesh import make_mesh
from longformer_jax.evaluation import memory_sweep
from longformer_jax.train.steps import step_arrays
from longformer_jax.evaluation.lm_evaluator import LN2, Evaluator
from longformer_jax.train.lm_objective import lm_sums
from tests.support.far_recurrence_reference import far_by_brute_force
from tests.support.tiny_models import tiny_config


def test_sweep_is_the_product_of_the_settings():
  points = memory_sweep.parse_sweep(
      'variant=attendre; policy=fifo,lfa ;memory_size=128,256;chunk=64;'
      'rope_max_distance=63;lfa_gamma=0.9,1', default_chunk=32)
  # fifo does not read lfa_gamma: its points do not multiply by it.
  assert len(points) == 2 * 1 + 2 * 2
  assert {p.policy for p in points} == {'fifo', 'lfa'}
  assert {p.memory_size for p in points} == {128, 256}
  assert all(p.chunk == 64 and p.q_memory_size == 0 for p in points)
  assert {p.extra for p in points if p.policy == 'lfa'} == {
      (('lfa_gamma', 0.9), ('rope_max_distance', 63)),
      (('lfa_gamma', 1), ('rope_max_distance', 63))}
  assert {p.extra for p in points if p.policy == 'fifo'} == {
      (('lfa_gamma', memory_sweep.NOT_READ), ('rope_max_distance', 63))}
  default = memory_sweep.parse_sweep('policy=lfa', default_chunk=32)
  assert default == [memory_sweep.SweepPoint('attendre', 'lfa', 128, 0, 32)]
  mixed = memory_sweep.parse_sweep('variant=attendre,vanilla;top_k=4', default_chunk=32)
  assert [p.extra for p in mixed] == [(('top_k', 4),), (('top_k', memory_sweep.NOT_READ),)]


@pytest.mark.parametrize('spec,message', [
    ('variant=attendre;q_memory_size=64', 'q_memory_size must be 0'),
    ('variant=linformer', 'unknown variant'),
    ('variant=memorizing;policy=lra_max', 'memorizing memory is FIFO'),
    ('memory_size=big', 'memory_size must be integers'),
    ('policy', "expected 'key=value"),
    ('policy=fifo;policy=lfa', 'given twice'),
    ('policy=lra_mx', "unknown policy 'lra_mx'.*did you mean lra_max"),
    ('policy=lfa;rope_max_distanc=63',
     "unknown key 'rope_max_distanc'.*did you mean rope_max_distance"),
    ('policy=lfa;memory_sizes=64', 'did you mean memory_size'),
    ('variant=vanilla;top_k=4', "unknown key 'top_k'"),
    ('policy=lfa;memory_top_k=4', "unknown key 'memory_top_k'; it is now 'top_k'"),
    ('variant=memorizing;knn_top_k=4', "it is now 'top_k'"),
    ('policy=fifo,lra_max;lfa_gamma=0.9', "'lfa_gamma' is read only by policy lfa"),
    ('policy=fifo;admission=score', "'admission' is read only by policy lru"),
    ('variant=streaming_sinks;policy=sink;window=8',
     "'window' of streaming_sinks is set by the sweep"),
])
def test_bad_sweeps_name_the_flag(spec, message):
  with pytest.raises(ConfigError, match=message) as error:
    memory_sweep.parse_sweep(spec, default_chunk=32)
  assert error.value.key == 'eval.memory_sweep'
  assert len(str(error.value).splitlines()) == 1


def resolved_sweep_model(trained, point) -> dict:
  """The eval-time model of `point`, checked as a config is (every section, every layer)."""
  overrides = memory_sweep.model_overrides(point, trained)
  return resolve_model(lm_model_config(trained, 259, **overrides).model_values())


def test_overrides_map_memory_size_to_each_variant():
  trained = tiny_config(attention='vanilla', mem_len=0,
                        layer_schedule={'attention': 'vanilla,vanilla'}).model
  point = lambda variant, policy: memory_sweep.SweepPoint(variant, policy, 96, 0, 32,
                                                          (('num_sinks', 2),))
  attendre = memory_sweep.model_overrides(point('attendre', 'sink'), trained)
  assert attendre['attention'] == 'attendre' and attendre['mem_len'] == 0
  assert attendre['attendre']['memory_size'] == 96 and attendre['attendre']['policy'] == 'sink'
  assert attendre['attendre']['num_sinks'] == 2 and attendre['layer_schedule'] == {}
  assert memory_sweep.model_overrides(point('vanilla', 'fifo'), trained)['mem_len'] == 96
  sinks = memory_sweep.model_overrides(point('streaming_sinks', 'sink'), trained)
  assert sinks['streaming_sinks']['window'] + sinks['streaming_sinks']['num_sinks'] == 96 + 32
  knn = memory_sweep.model_overrides(point('memorizing', 'fifo'), trained)
  assert knn['memorizing']['memory_size'] == 96 and knn['memorizing']['gate'] == 'joint'
  assert knn['mem_len'] == 0
  for variant, policy in (('attendre', 'sink'), ('vanilla', 'fifo'), ('streaming_sinks', 'sink'),
                          ('memorizing', 'fifo')):
    model = resolved_sweep_model(trained, point(variant, policy))
    assert model['attention'] == variant
  # The sink default, and a policy's settings only where the policy reads them.
  fifo = memory_sweep.parse_sweep('policy=fifo,sink,lfa;lfa_gamma=0.5;admission=score', 32)
  models = {p.policy: resolved_sweep_model(trained, p)['attendre'] for p in fifo}
  assert models['sink']['num_sinks'] == memory_sweep.DEFAULT_SINKS
  assert models['lfa']['lfa_gamma'] == 0.5 and models['lfa']['admission'] == 'score'
  assert models['fifo']['lfa_gamma'] == 1.0 and models['fifo']['admission'] == 'always'


def test_overrides_keep_the_trained_sections_and_schedule_the_sweep_does_not_set():
  trained = tiny_config(attention='attendre', stack='attendre_delay', causal=False,
                        attendre=dict(policy='lfa', lfa_gamma=0.5, top_k=2),
                        layer_schedule={'attendre': {'q_memory_size': '2,0',
                                                     'rope_max_distance': '7,9'}}).model
  point = memory_sweep.parse_sweep('policy=lra_max;memory_size=32', 8)[0]
  overrides = memory_sweep.model_overrides(point, trained)
  assert overrides['layer_schedule'] == {'attendre': {'rope_max_distance': '7,9'}}
  model = resolved_sweep_model(trained, point)
  # The trained top_k stays; lfa_gamma goes back to its default (lra_max does not read it).
  assert model['attendre']['top_k'] == 2 and model['attendre']['lfa_gamma'] == 1.0
  assert model['attendre']['q_memory_size'] == 0 and model['attendre']['policy'] == 'lra_max'


def test_overrides_reset_the_sections_of_the_attention_they_replace():
  trained = tiny_config(attention='xl', mem_len=16, xl=dict(clamp_len=8),
                        memorizing=dict(top_k=4),
                        layer_schedule={'attention': 'xl,memorizing',
                                        'memorizing': {'memory_size': '64,128'}}).model
  point = memory_sweep.parse_sweep('policy=fifo;memory_size=32', 8)[0]
  overrides = memory_sweep.model_overrides(point, trained)
  assert overrides['layer_schedule'] == {} and overrides['xl'] == {'clamp_len': -1,
                                                                    'relative_impl': 'shift'}
  model = resolved_sweep_model(trained, point)
  assert model['attention'] == 'attendre' and model['mem_len'] == 0
  assert model['memorizing']['top_k'] == 32


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
  params, shardings, _, _ = eval_script.restore_params(saved, tokenizer, trained_vanilla, mesh, rules)
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
