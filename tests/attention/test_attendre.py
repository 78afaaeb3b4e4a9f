"""Attendre attention against an independent float64 reference (the stack: test_attendre_delay_stack.py).

The reference (`reference_outputs`) knows nothing of memories: for a FIFO
K/V memory of M entries and a Q memory of N, query i is answered at the step
whose chunk holds stream index i + N (the flush step past the end), and may
attend to the keys of the last M valid tokens before that chunk and of the
chunk itself (same document, valid, not in the future when causal, and not a
later predicted token when `predicted` flags are given). Scores are
`q_i . R(-clip(p_i - p_j, -L, L)) k_j / sqrt(d)` computed pair by pair.
"""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from longformer_jax.attention.attendre import AttendreAttention
from longformer_jax.attention.registry import attention_layer, attention_state
from longformer_jax.attention.shared_settings import SharedSettings
from longformer_jax.config.errors import ConfigError
from longformer_jax.memory import policies
from longformer_jax.config.migration import migrate_flat_model
from longformer_jax.models.model_config import resolve_model
from tests.support.attendre_reference import (B, C, H, HD, context, init_params, layer_step,
                                              model_config, numpy_rotate, padding, stream)


def reference_outputs(params, x, positions, segments, valid, *, chunk, n, m, causal,
                      cap=-1, top_k=0, predicted=None):
  """Attendre with FIFO memories, one query at a time; float64 `[b, T, d_model]`."""
  p = jax.tree_util.tree_map(lambda a: np.asarray(a, np.float64), nn.meta.unbox(params))
  q = np.einsum('btd,dhe->bthe', x, p['query']['kernel'])
  k = np.einsum('btd,dhe->bthe', x, p['key']['kernel'])
  v = np.einsum('btd,dhe->bthe', x, p['value']['kernel'])
  total = x.shape[1]
  out = np.zeros(q.shape)
  for b in range(x.shape[0]):
    for i in range(total):
      if not valid[b, i]:
        continue
      # The step that evicts query i starts at `start` (past the end: the
      # flush or drain steps, whose padding is never stored).
      start = min((i + n) // chunk * chunk, total)
      memory = [j for j in range(start) if valid[b, j]][-m:] if m else []
      keys = [j for j in memory + list(range(start, min(start + chunk, total)))
              if valid[b, j] and segments[b, j] == segments[b, i]
              and (not causal or positions[b, j] <= positions[b, i])
              and not (predicted is not None and predicted[b, j]
                       and positions[b, j] > positions[b, i])]
      for h in range(H):
        scores = {}
        for j in keys:
          distance = positions[b, i] - positions[b, j]
          if cap >= 0:
            distance = np.clip(distance, -cap, cap)
          scores[j] = q[b, i, h] @ numpy_rotate(k[b, j, h], -distance) / np.sqrt(HD)
        if top_k:
          memory_keys = sorted((j for j in keys if j < start), key=lambda j: -scores[j])
          dropped = set(memory_keys[top_k:])
          scores = {j: s for j, s in scores.items() if j not in dropped}
        w = np.exp(np.array(list(scores.values())) - max(scores.values()))
        w /= w.sum()
        out[b, i, h] = sum(wj * v[b, j, h] for wj, j in zip(w, scores))
  return np.einsum('bthe,hed->btd', out, p['out']['kernel'])


def run_stream(step, params, state, x, positions, segments, valid, *, chunk, finish, delay,
               predicted=None):
  """Runs whole chunks, then `finish` ('flush': one step of `delay` padding tokens,
  'drain': padding chunks, 'none'); returns (outputs aligned to stream indices, state)."""
  total = x.shape[1]
  outputs = []
  for start in range(0, total, chunk):
    part = slice(start, start + chunk)
    reset = (segments[:, start] != segments[:, start - 1]) if start else np.ones(B, bool)
    flags = None if predicted is None else predicted[:, part]
    y, state = step(params, jnp.asarray(x[:, part]), state,
                    context(positions[:, part], segments[:, part], valid[:, part], reset, flags))
    outputs.append(np.asarray(y))
  if finish != 'none' and delay:
    length = delay if finish == 'flush' else -(-delay // chunk) * chunk
    last_positions = positions   # each padding step continues the positions before it
    for _ in range(0, length, chunk if finish == 'drain' else length):
      pad_x, pad_p, pad_s, pad_v = padding(last_positions, segments,
                                           chunk if finish == 'drain' else length)
      last_positions = pad_p
      y, state = step(params, jnp.asarray(pad_x), state,
                      context(pad_p, pad_s, pad_v, np.zeros(B, bool)))
      outputs.append(np.asarray(y))
  stacked = np.concatenate(outputs, axis=1)
  return stacked[:, delay:delay + total], state


@pytest.mark.parametrize('cap', [-1, 5])
def test_big_memories_after_flush_equal_full_bidirectional_attention(cap):
  total = 32
  config = model_config(q_memory_size=total, memory_size=total, causal=False,
                        policy='lra_max', rope_max_distance=cap)
  params = init_params(config)
  x, positions, segments, valid = stream(total)
  y, _ = run_stream(layer_step(config), params, attention_state(config, B), x,
                    positions, segments, valid, chunk=C, finish='flush', delay=total)
  expected = reference_outputs(params, x.astype(np.float64), positions, segments, valid,
                               chunk=C, n=total, m=total, causal=False, cap=cap)
  np.testing.assert_allclose(y, expected, rtol=2e-4, atol=2e-5)


@pytest.mark.parametrize('top_k,cap', [(0, -1), (3, -1), (0, 6)])
def test_no_q_memory_equals_causal_memory_attention(top_k, cap):
  total, m = 40, 12
  config = model_config(q_memory_size=0, memory_size=m, causal=True, top_k=top_k,
                        rope_max_distance=cap)
  params = init_params(config)
  x, positions, segments, valid = stream(total)
  y, _ = run_stream(layer_step(config), params, attention_state(config, B), x,
                    positions, segments, valid, chunk=C, finish='none', delay=0)
  expected = reference_outputs(params, x.astype(np.float64), positions, segments, valid,
                               chunk=C, n=0, m=m, causal=True, cap=cap, top_k=top_k)
  np.testing.assert_allclose(y, expected, rtol=2e-4, atol=2e-5)


def test_delayed_queries_see_later_keys_in_the_fifo_window():
  total, n, m = 40, 12, 12
  config = model_config(q_memory_size=n, memory_size=m, causal=False)
  params = init_params(config)
  x, positions, segments, valid = stream(total, num_valid=36)   # a padded tail
  y, _ = run_stream(layer_step(config), params, attention_state(config, B), x,
                    positions, segments, valid, chunk=C, finish='flush', delay=n)
  expected = reference_outputs(params, x.astype(np.float64), positions, segments, valid,
                               chunk=C, n=n, m=m, causal=False)
  np.testing.assert_allclose(y[valid], expected[valid], rtol=2e-4, atol=2e-5)
  np.testing.assert_array_equal(y[~valid], 0.0)


@pytest.mark.parametrize('per_head', [False, True])
def test_hidden_predicted_keys_are_seen_by_later_queries_only(per_head):
  # Random tokens are predicted; a delayed query sees the later keys in its window except
  # those (a prefix-LM mask), in the chunk and in the K/V memory alike.
  total, n, m = 40, 12, 12
  config = model_config(q_memory_size=n, memory_size=m, causal=False, hide_predicted=True,
                        per_head_scores=per_head)
  params = init_params(config)
  x, positions, segments, valid = stream(total, doc_len=24, num_valid=36)
  predicted = np.random.default_rng(3).random((B, total)) < 0.4
  y, _ = run_stream(layer_step(config), params, attention_state(config, B), x, positions,
                    segments, valid, chunk=C, finish='flush', delay=n, predicted=predicted)
  expected = reference_outputs(params, x.astype(np.float64), positions, segments, valid,
                               chunk=C, n=n, m=m, causal=False, predicted=predicted)
  np.testing.assert_allclose(y[valid], expected[valid], rtol=2e-4, atol=2e-5)
  unhidden = reference_outputs(params, x.astype(np.float64), positions, segments, valid,
                               chunk=C, n=n, m=m, causal=False)
  assert np.abs(unhidden - expected)[valid].max() > 1e-2      # the flags change what is seen


@pytest.mark.parametrize('policy', ['lra_max', pytest.param('lfa', marks=pytest.mark.slow)])
def test_drain_and_flush_give_the_same_outputs(policy):
  total, n = 32, 12
  config = model_config(q_memory_size=n, memory_size=12, causal=False, policy=policy)
  params = init_params(config)
  x, positions, segments, valid = stream(total, doc_len=20)
  runs = [run_stream(layer_step(config), params, attention_state(config, B), x,
                     positions, segments, valid, chunk=C, finish=finish, delay=n)
          for finish in ('flush', 'drain')]
  np.testing.assert_allclose(runs[0][0], runs[1][0], rtol=1e-5, atol=1e-6)
  assert (np.abs(runs[0][0]).max(axis=-1) > 0).all()   # every position got an output


@pytest.mark.parametrize('policy', ['lra_sum', 'lru', 'sink',
                                    pytest.param('lfa', marks=pytest.mark.slow)])
def test_layer_attends_exactly_to_the_entries_its_memory_holds(policy):
  """Scored policies: each step's output equals attention over the positions the
  state's K/V memory holds (keys recomputed from x) plus the causal chunk."""
  total, m = 40, 12
  config = model_config(memory_size=m, policy=policy, top_k=3 if policy == 'lru' else 0,
                        num_sinks=2 if policy == 'sink' else 0)
  params = init_params(config)
  p = jax.tree_util.tree_map(lambda a: np.asarray(a, np.float64), nn.meta.unbox(params))
  x, positions, segments, valid = stream(total, seed=3)
  step = layer_step(config)
  state = attention_state(config, B)
  held = []
  for start in range(0, total, C):
    memory = state.memory
    held.append([set(np.asarray(memory.positions[b])[np.asarray(memory.valid[b])].tolist())
                 for b in range(B)])
    part = slice(start, start + C)
    y, state = step(params, jnp.asarray(x[:, part]), state,
                    context(positions[:, part], segments[:, part], valid[:, part],
                            np.full(B, start == 0)))
    q = np.einsum('btd,dhe->bthe', x[:, part], p['query']['kernel'])
    k = np.einsum('btd,dhe->bthe', x, p['key']['kernel'])
    v = np.einsum('btd,dhe->bthe', x, p['value']['kernel'])
    for b in range(B):
      for i in range(C):
        keys = [j for j in range(total)
                if positions[b, j] in held[-1][b] or start <= j <= start + i]
        qi = q[b, i]
        logits = np.stack([np.einsum('he,he->h', qi, numpy_rotate(k[b, j], (j - start - i)))
                           for j in keys], -1) / np.sqrt(HD)          # [h, keys]
        if config.attendre.top_k:
          in_memory = np.array([j < start for j in keys])
          order = np.argsort(-np.where(in_memory, logits, -np.inf), axis=-1)
          dropped = np.zeros_like(logits, bool)
          np.put_along_axis(dropped, order[:, config.attendre.top_k:], True, axis=-1)
          logits = np.where(dropped & in_memory, -np.inf, logits)
        w = np.exp(logits - logits.max(-1, keepdims=True))
        w /= w.sum(-1, keepdims=True)
        out = np.einsum('hk,khe->he', w, v[b, keys])
        np.testing.assert_allclose(np.asarray(y[b, i]), np.einsum('he,hed->d', out,
                                                                  p['out']['kernel']),
                                   rtol=2e-4, atol=2e-5)
  later = held[-1]
  assert all(len(s) == m for s in later)
  if policy == 'sink':
    assert all({100, 101} <= s for s in later)          # the two sinks stay
  else:
    assert any(s != set(range(100 + total - C - m, 100 + total - C)) for s in later)


def test_per_head_memories_keep_each_heads_own_most_attended_entries():
  """Per-head LRA-sum against a float64 simulation: every head keeps its own M
  entries, evicting those its own queries attended least, and attends to them."""
  total, m = 40, 12
  config = model_config(memory_size=m, policy='lra_sum', per_head_scores=True)
  params = init_params(config)
  p = jax.tree_util.tree_map(lambda a: np.asarray(a, np.float64), nn.meta.unbox(params))
  x, positions, segments, valid = stream(total, seed=4)
  q = np.einsum('btd,dhe->bthe', x, p['query']['kernel'])
  k = np.einsum('btd,dhe->bthe', x, p['key']['kernel'])
  v = np.einsum('btd,dhe->bthe', x, p['value']['kernel'])
  step = layer_step(config)
  state = attention_state(config, B)
  held = {(b, h): [] for b in range(B) for h in range(H)}   # stream indices, oldest first
  for start in range(0, total, C):
    part = slice(start, start + C)
    y, state = step(params, jnp.asarray(x[:, part]), state,
                    context(positions[:, part], segments[:, part], valid[:, part],
                            np.full(B, start == 0)))
    for b in range(B):
      out = np.zeros((C, H, HD))
      for h in range(H):
        memory = held[b, h]
        attended = np.zeros(len(memory))
        for i in range(C):
          keys = memory + list(range(start, start + i + 1))
          logits = np.array([q[b, start + i, h] @ numpy_rotate(k[b, j, h], j - start - i)
                             for j in keys]) / np.sqrt(HD)
          w = np.exp(logits - logits.max())
          w /= w.sum()
          out[i, h] = w @ v[b, keys, h]
          attended += w[:len(memory)]
        # LRA-sum: new entries always go in; the least attended old ones leave.
        keep = sorted(np.argsort(-attended, kind='stable')[:max(0, m - C)].tolist())
        held[b, h] = [memory[s] for s in keep] + list(range(start, start + C))
        row = b * H + h
        in_state = np.asarray(state.memory.positions[row])[np.asarray(state.memory.valid[row])]
        assert sorted(in_state.tolist()) == [100 + j for j in held[b, h]], (start, b, h)
      np.testing.assert_allclose(np.asarray(y[b]), np.einsum('che,hed->cd', out,
                                                             p['out']['kernel']),
                                 rtol=2e-4, atol=2e-5)
  # Not vacuous: the heads of a row hold different entries, and not the newest M.
  for b in range(B):
    assert held[b, 0] != held[b, 1]
    assert any(held[b, h] != list(range(total - m, total)) for h in range(H))


def test_per_head_fifo_equals_the_shared_fifo():
  """With FIFO every head keeps the same entries, so per-head rows change nothing."""
  shared, per_head = model_config(memory_size=12), model_config(memory_size=12,
                                                                per_head_scores=True)
  params = init_params(shared)
  x, positions, segments, valid = stream(40, seed=6)
  outputs = [run_stream(layer_step(config), params, attention_state(config, B),
                        x, positions, segments, valid, chunk=C, finish='none', delay=0)[0]
             for config in (shared, per_head)]
  np.testing.assert_allclose(outputs[1], outputs[0], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize('n', [0, 8])
def test_document_outputs_do_not_depend_on_the_previous_document(n):
  """Row stream: document A, (drain when N > 0), document B; B alone gives the same."""
  config = model_config(q_memory_size=n, memory_size=8, causal=n == 0, policy='lra_max')
  params = init_params(config)
  step = layer_step(config)
  x, positions, _, _ = stream(48, seed=5)
  doc_a, gap, doc_b = 16, n, 48 - 16 - n
  segments = np.where(np.arange(48) < doc_a + gap, 0, 1)[None].repeat(B, 0).astype(np.int32)
  valid = np.ones((B, 48), bool)
  valid[:, doc_a:doc_a + gap] = False                 # drain padding between the documents
  both, _ = run_stream(step, params, attention_state(config, B), x, positions,
                       segments, valid, chunk=C, finish='flush', delay=n)
  b_part = slice(doc_a + gap, doc_a + gap + doc_b)
  alone, _ = run_stream(step, params, attention_state(config, B), x[:, b_part],
                        positions[:, b_part], segments[:, b_part], valid[:, b_part], chunk=C,
                        finish='flush', delay=n)
  np.testing.assert_allclose(both[:, b_part], alone, rtol=1e-5, atol=1e-6)
  # A has an influence while it is in the memory: the test is not vacuous.
  x_other = x.copy()
  x_other[:, :doc_a] += 1.0
  other, _ = run_stream(step, params, attention_state(config, B), x_other,
                        positions, segments, valid, chunk=C, finish='flush', delay=n)
  np.testing.assert_allclose(other[:, b_part], alone, rtol=1e-5, atol=1e-6)
  assert not np.allclose(other[:, :doc_a], both[:, :doc_a])


# One bad value per rule of `AttendreConfig` / `AttendreDelayConfig`, and the key it names.
BAD_SETTINGS = [
    (dict(attendre=dict(memory_size=-1)), 'model.attendre.memory_size'),
    (dict(attendre=dict(q_memory_size=-1)), 'model.attendre.q_memory_size'),
    (dict(stack='standard', attendre=dict(q_memory_size=4)), 'model.attendre.q_memory_size'),
    (dict(attendre=dict(policy='lifo')), 'model.attendre.policy'),
    (dict(attendre=dict(policy='lra', lra_pooling='mean')), 'model.attendre.lra_pooling'),
    (dict(attendre=dict(policy='lra_max', lra_pooling='sum')), 'model.attendre.lra_pooling'),
    (dict(attendre=dict(policy='lfa', lfa_gamma=1.5)), 'model.attendre.lfa_gamma'),
    (dict(attendre=dict(policy='lfa', lfa_gamma=0.0)), 'model.attendre.lfa_gamma'),
    (dict(attendre=dict(policy='lra_max', lfa_gamma=0.9)), 'model.attendre.lfa_gamma'),
    (dict(attendre=dict(policy='sink', num_sinks=-1)), 'model.attendre.num_sinks'),
    (dict(attendre=dict(policy='sink')), 'model.attendre.num_sinks'),
    (dict(attendre=dict(policy='lra', init_std_multiplier=-1.0)),
     'model.attendre.init_std_multiplier'),
    (dict(attendre=dict(policy='fifo', init_std_multiplier=2.0)),
     'model.attendre.init_std_multiplier'),
    (dict(attendre=dict(policy='lfa', admission='never')), 'model.attendre.admission'),
    (dict(attendre=dict(policy='sink', num_sinks=2, admission='score')),
     'model.attendre.admission'),
    (dict(attendre=dict(recent_window=-2)), 'model.attendre.recent_window'),
    (dict(attendre=dict(recent_window=1.5)), 'model.attendre.recent_window'),
    (dict(attendre=dict(top_k=-1)), 'model.attendre.top_k'),
    (dict(attendre=dict(top_k=4, top_k_method='faiss')), 'model.attendre.top_k_method'),
    (dict(attendre=dict(top_k_method='approx')), 'model.attendre.top_k_method'),
    (dict(attendre=dict(top_k=4, top_k_method='approx', recall_target=1.5)),
     'model.attendre.recall_target'),
    (dict(attendre=dict(top_k=4, recall_target=0.9)), 'model.attendre.recall_target'),
    (dict(attendre=dict(rope_max_distance=-2)), 'model.attendre.rope_max_distance'),
    (dict(attendre=dict(order='paper')), 'model.attendre.order'),
    (dict(attendre=dict(order='insert_first', memory_size=0)), 'model.attendre.order'),
    (dict(causal=True, attendre=dict(hide_predicted=True)), 'model.attendre.hide_predicted'),
    (dict(scan_layers=True), 'model.scan_layers'),
    (dict(remat_policy='dots'), 'model.remat_policy'),
    (dict(block='gtrxl'), 'model.block'),
]


@pytest.mark.parametrize('values,key', BAD_SETTINGS, ids=[k for _, k in BAD_SETTINGS])
def test_bad_settings_name_their_key(values, key):
  model = dict(attention='attendre', stack='attendre_delay', num_layers=2)
  model.update(values)
  with pytest.raises(ConfigError) as error:
    resolve_model(model)
  assert error.value.key == key
  assert len(str(error.value).splitlines()) == 1


def test_good_settings_resolve_and_build_their_policy():
  config = model_config(policy='lra_sum', top_k=4, top_k_method='approx', recall_target=0.9)
  policy = policies.make_policy(config.attendre)
  assert (policy.name, policy.pooling) == ('lra', 'sum')
  module = attention_layer(config, jnp.float32)
  assert isinstance(module, AttendreAttention)
  assert (module.config.top_k, module.config.top_k_method, module.config.recall_target) == (
      4, 'approx', 0.9)
  assert module.config.eviction_policy() == policy
  scored = model_config(policy='lfa', lfa_gamma=0.5, init_std_multiplier=2.0, admission='score',
                        recent_window=3, per_head_scores=True)
  assert policies.make_policy(scored.attendre) == policies.EvictionPolicy(
      'lfa', gamma=0.5, init_std_multiplier=2.0, admission='score', recent_window=3,
      per_head=True)
  assert AttendreAttention.init_state(
      scored.attendre, SharedSettings.of(scored), B).memory.rows == B * H
  # The step order: today's by default (recorded results, old checkpoints), the paper's by name.
  assert attention_layer(config, jnp.float32).config.order == 'attend_first'
  paper = model_config(order='insert_first', policy='lra_max', admission='score')
  assert attention_layer(paper, jnp.float32).config.order == 'insert_first'
  # num_sinks beside another policy is left alone (runs made before the sections set it).
  assert policies.make_policy(model_config(policy='lra_max', num_sinks=4).attendre).name == 'lra'


def test_old_flat_names_move_to_the_attendre_section():
  model, moved = migrate_flat_model({
      'attention': 'attendre', 'memory_size': 64, 'memory_policy': 'lra_max', 'num_sinks': 4,
      'memory_top_k': 8, 'memory_top_k_method': 'approx', 'memory_recall_target': 0.9,
      'rope_max_distance': 63, 'causal': False, 'layer_schedule': {'q_memory_size': '0,2'}})
  assert model['attendre'] == dict(memory_size=64, policy='lra_max', num_sinks=4, top_k=8,
                                   top_k_method='approx', recall_target=0.9,
                                   rope_max_distance=63)
  assert model['causal'] is False
  assert model['layer_schedule'] == {'attendre': {'q_memory_size': '0,2'}}
  assert ('memory_policy', 'attendre.policy') in moved
  resolved = resolve_model(dict(model, stack='attendre_delay', num_layers=2))
  assert resolved['attendre']['top_k'] == 8
