"""Attendre in the paper's order (`order='insert_first'`) against a step-by-step float64 loop.

The reference (`PaperLayer`) follows Figure 1 of Yang & Hua et al. (2024)
one chunk at a time, with plain Python per row: the chunk's queries enter a
FIFO Q memory of N and the oldest C leave it; K/V entries of finished
documents are dropped; the chunk's keys and values are inserted into the K/V
memory (a `PaperMemory` of tests/support/paper_memory.py: position ->
score); each evicted query retrieves from that memory alone (the entries it
may see: same document, not in the future when causal; the top-k by logit
when `top_k`), attends in float64 with RoPE from the pair's distance, and the
policy scores the memory with the weights, each entry over the queries that
may see it. After every step the layer's outputs, the positions its K/V
memory keeps and their scores must equal the reference's. And with a FIFO
memory that holds the whole stream, both orders attend to the same keys:
equal outputs and gradients.
"""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from longformer_jax.attention.registry import attention_layer, attention_state
from longformer_jax.memory import policies
from tests.support.attendre_reference import (B, C, H, HD, context, init_params, layer_step,
                                              model_config, numpy_rotate, padding, stream)
from tests.support.paper_memory import PaperMemory


class PaperLayer:
  """One Attendre layer, step by step, in float64 (module docstring)."""

  def __init__(self, params, config):
    section = config.attendre
    self.p = jax.tree_util.tree_map(lambda a: np.asarray(a, np.float64), nn.meta.unbox(params))
    self.policy = policies.make_policy(section)
    self.n, self.top_k, self.causal = section.q_memory_size, section.top_k, config.causal
    self.cap = section.rope_max_distance
    memories = H if self.policy.per_head else 1
    self.memories = [[PaperMemory(section.memory_size, self.policy) for _ in range(memories)]
                     for _ in range(B)]
    # The Q memory starts with N padding queries: (query [H, HD], position, segment, valid).
    self.queries = [[(np.zeros((H, HD)), 0, 0, False)] * self.n for _ in range(B)]
    self.kv = [{} for _ in range(B)]               # position -> (key, value, segment)
    self.document_start = [None] * B

  def _logit(self, q, k, query_position, key_position):
    distance = query_position - key_position
    if self.cap >= 0:
      distance = int(np.clip(distance, -self.cap, self.cap))
    return q @ numpy_rotate(k, -distance) / np.sqrt(HD)

  def step(self, x, positions, segments, valid, reset):
    """One chunk; returns the float64 output `[B, C, d_model]`."""
    p = self.p
    project = lambda name: np.einsum('bcd,dhe->bche', np.asarray(x, np.float64),
                                     p[name]['kernel'])
    q, k, v = project('query'), project('key'), project('value')
    out = np.zeros(q.shape)
    for b in range(B):
      if reset[b]:
        self.document_start[b] = int(positions[b, 0])
      chunk = [(q[b, i], int(positions[b, i]), int(segments[b, i]), bool(valid[b, i]))
               for i in range(C)]
      pending = self.queries[b] + chunk
      evicted, self.queries[b] = pending[:C], pending[C:]
      self._forget(b, [e for e in pending if e[3]])
      for i in range(C):
        if valid[b, i]:
          self.kv[b][int(positions[b, i])] = (k[b, i], v[b, i], int(segments[b, i]))
      new = [int(positions[b, i]) for i in range(C) if valid[b, i]]
      for h_memory, memory in enumerate(self.memories[b]):
        memory.insert(new)
        heads = [h_memory] if self.policy.per_head else list(range(H))
        weights = {h: [{} for _ in evicted] for h in heads}
        sees = [set() for _ in evicted]
        for i, (query, position, segment, ok) in enumerate(evicted):
          if not ok:
            continue
          sees[i] = {e for e in memory.scores if self.kv[b][e][2] == segment
                     and (not self.causal or e <= position)}
          for h in heads:
            logits = {e: self._logit(query[h], self.kv[b][e][0][h], position, e) for e in sees[i]}
            if self.top_k:
              logits = dict(sorted(logits.items(), key=lambda item: -item[1])[:self.top_k])
            if not logits:
              continue
            top = max(logits.values())
            w = {e: np.exp(s - top) for e, s in logits.items()}
            total = sum(w.values())
            weights[h][i] = {e: w.get(e, 0.0) / total for e in sees[i]}
            out[b, i, h] = sum(weights[h][i][e] * self.kv[b][e][1][h] for e in logits)
        memory.score([(e[1], e[3]) for e in evicted], [weights[h] for h in heads], sees)
    return np.einsum('bche,hed->bcd', out, p['out']['kernel'])

  def _forget(self, b, live):
    """Drops the entries no pending query may attend to any more (attendre.py's rule)."""
    if not live:
      return
    oldest_segment, oldest_position = min(e[2] for e in live), min(e[1] for e in live)
    start = self.document_start[b]
    for memory in self.memories[b]:
      for e in list(memory.scores):
        if (self.kv[b][e][2] < oldest_segment
            or (start is not None and e < start <= oldest_position)):
          del memory.scores[e]


def run_both(config, x, positions, segments, valid, *, flush=True, seed=1):
  """Steps the layer and the reference through whole chunks (and a flush of N padding
  tokens), comparing outputs, kept positions and scores after every step."""
  params = init_params(config, seed)
  step = layer_step(config)
  state = attention_state(config, B)
  reference = PaperLayer(params, config)
  n, m = config.attendre.q_memory_size, config.attendre.memory_size
  inputs = []
  for start in range(0, x.shape[1], C):
    part = slice(start, start + C)
    reset = (segments[:, start] != segments[:, start - 1]) if start else np.ones(B, bool)
    inputs.append((x[:, part], positions[:, part], segments[:, part], valid[:, part], reset))
  if flush and n:
    pad_x, pad_p, pad_s, pad_v = padding(positions, segments, C)
    inputs.append((pad_x, pad_p, pad_s, pad_v, np.zeros(B, bool)))
  not_fifo = False
  for index, (cx, cp, cs, cv, reset) in enumerate(inputs):
    y, state = step(params, jnp.asarray(cx), state, context(cp, cs, cv, reset))
    expected = reference.step(cx, cp, cs, cv, reset)
    np.testing.assert_allclose(np.asarray(y), expected, rtol=2e-4, atol=2e-5,
                               err_msg=f'step {index}')
    memory = state.memory
    for r in range(memory.rows):
      ref = reference.memories[r // len(reference.memories[0])][r % len(reference.memories[0])]
      keep = np.asarray(memory.valid[r])
      kept = np.asarray(memory.positions[r])[keep].tolist()
      assert sorted(kept) == sorted(ref.scores), (index, r)
      for position, score in zip(kept, np.asarray(memory.scores[r])[keep]):
        np.testing.assert_allclose(score, ref.scores[position], rtol=2e-4, atol=2e-5,
                                   err_msg=f'step {index} row {r} position {position}')
      newest = sorted(e for e in reference.kv[r // len(reference.memories[0])])[-m:]
      not_fifo |= sorted(kept) != newest
  return not_fifo


def padded_stream(total, doc_len, seed, holes=()):
  """test_attendre.stream with padding tokens at the stream indices `holes`."""
  x, positions, segments, valid = stream(total, doc_len=doc_len, seed=seed)
  valid[:, list(holes)] = False
  valid[1, 5] = False                          # rows differ
  return x, positions, segments, valid


CASES = {
    # name: (attendre settings, causal, doc_len, padding holes)
    'lra_max_score_recent': (dict(policy='lra_max', admission='score', recent_window=3),
                             True, 20, (11, 12, 30)),
    'lfa_decay_top_k_resets': (dict(policy='lfa', lfa_gamma=0.9, top_k=3), True, 24, (9, 10, 33)),
    'lfu_per_head': (dict(policy='lfu', per_head_scores=True, admission='score'), True, 0,
                     (14, 15, 16)),
    'lra_last_delayed_causal': (dict(policy='lra_last', q_memory_size=5, admission='score'),
                                True, 0, (18,)),
    'lru_delayed_bidirectional': (dict(policy='lru', q_memory_size=6, top_k=3,
                                       rope_max_distance=9), False, 0, (21, 22)),
}


@pytest.mark.parametrize('name', sorted(CASES))
def test_paper_order_matches_the_step_by_step_reference(name):
  settings, causal, doc_len, holes = CASES[name]
  config = model_config(causal=causal, order='insert_first', memory_size=10, **settings)
  x, positions, segments, valid = padded_stream(40, doc_len, sorted(CASES).index(name), holes)
  assert run_both(config, x, positions, segments, valid), 'the policy never differed from FIFO'


def test_paper_order_retrieves_at_most_memory_size_keys():
  """With M < C and admission='always', the first queries of a chunk lose their own keys
  (the chunk's oldest entries are evicted at once) and see nothing: output 0."""
  config = model_config(order='insert_first', memory_size=3, policy='lra_max')
  params = init_params(config)
  x, positions, segments, valid = stream(C, seed=7)
  y, state = layer_step(config)(params, jnp.asarray(x), attention_state(config, B),
                                context(positions, segments, valid, np.ones(B, bool)))
  y = np.asarray(y)
  np.testing.assert_array_equal(y[:, :C - 3], 0.0)
  assert (np.abs(y[:, C - 3:]).max(-1) > 0).all()
  kept = np.sort(np.asarray(state.memory.positions), axis=1)
  np.testing.assert_array_equal(kept, np.tile(positions[0, C - 3:], (B, 1)))


def test_paper_order_equals_todays_when_the_memory_holds_everything():
  """FIFO memory larger than the stream: after inserting the chunk, the memory holds exactly
  [past; chunk], so both orders attend to the same keys: equal outputs and equal gradients
  (the chunk's own keys and values carry theirs in both orders)."""
  x, positions, segments, valid = stream(3 * C, seed=8)
  configs = [model_config(order=order, memory_size=4 * C) for order in ('insert_first',
                                                                       'attend_first')]
  params = init_params(configs[0])
  weights = jnp.asarray(np.random.default_rng(9).normal(size=(B, 3 * C, x.shape[-1])))

  def loss_fn(config):
    module = attention_layer(config, jnp.float32)

    def loss(params):
      state, total = attention_state(config, B), 0.0
      for start in range(0, 3 * C, C):
        part = slice(start, start + C)
        ctx = context(positions[:, part], segments[:, part], valid[:, part],
                      np.full(B, start == 0))
        y, state, _ = module.apply({'params': params}, jnp.asarray(x[:, part]), state, ctx)
        total += jnp.sum(y * weights[:, part])
      return total
    return jax.jit(jax.value_and_grad(loss))

  (paper, paper_grads), (today, today_grads) = [loss_fn(c)(params) for c in configs]
  np.testing.assert_allclose(paper, today, rtol=1e-5)
  for a, b in zip(jax.tree_util.tree_leaves(paper_grads), jax.tree_util.tree_leaves(today_grads)):
    np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)
  key_grad = nn.meta.unbox(paper_grads)['key']['kernel']
  assert np.abs(np.asarray(key_grad)).max() > 0        # keys learn in the paper's order too
