"""BP-Transformer attention against a Python-loop graph and a dense [tokens; nodes] reference.

The reference graph follows the rule of section 3 of Ye et al. (2019) as the
module docstring states it, one token at a time: the k tokens on each side,
then at each level the k nearest nodes (listing every node of the level and
its real span) with a real token outside the interval the finer levels
cover, the interval growing with each level. The fast path evaluates a
closed-form recurrence with array arithmetic instead; the two must give the
same (level, node, offset) edges.

The attention reference lists the nodes of every level (in its own order),
builds with Python loops a dense averaging matrix (node <- its real tokens),
a child mask (node -> its two children), a token mask over [tokens; nodes]
from the reference graph plus the document / padding / causal rules (a node is
usable only when its real tokens share one document) and a matrix of
relative-position indices, then runs plain dense masked softmax: numpy
float64 for outputs, jax float32 for gradients.
"""

import functools

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import train as train_script
from benchmarks import bp_transformer_cases
from longformer_jax.attention import bp_transformer_grouped
from longformer_jax.attention.bp_transformer import (PATHS, BPTransformerAttention,
                                                     BPTransformerConfig,
                                                     bp_transformer_attention, neighbour_graph)
from longformer_jax.attention.registry import attention_layer
from longformer_jax.config.errors import ConfigError
from tests.support.dense_mask_reference import chunk_facts as sparse_chunk_facts
from tests.support.dense_mask_reference import context_for
from tests.support.fast_compile import FAST_COMPILE
from tests.support.gradient_checks import assert_gradients_match
from tests.support.intermediate_sizes import largest_intermediate
from tests.support.tiny_models import shared_settings, tiny_config, tiny_model_config

B, D, H, HD = 2, 32, 2, 16
START = 40     # stream position of the chunk's first token


def reference_levels(n: int, num_levels: int) -> int:
  levels = 0
  while 2 ** levels < n and levels < num_levels:
    levels += 1
  return levels


def reference_graph(n: int, k: int, num_levels: int, causal: bool) -> list:
  """Per token, the set of (level, node, offset) edges, by loops over every node of each level."""
  graph = []
  for i in range(n):
    edges = {(0, j, j - i) for j in range(n) if -k <= j - i <= (0 if causal else k)}
    first, last = max(i - k, 0), (i if causal else min(i + k, n - 1))   # covered real tokens
    for level in range(1, reference_levels(n, num_levels) + 1):
      size = 2 ** level
      spans = [(p, p * size, min((p + 1) * size, n) - 1) for p in range(-(-n // size))]
      left = sorted([s for s in spans if s[1] < first], reverse=True)[:k]
      edges |= {(level, p, -rank) for rank, (p, _, _) in enumerate(left, 1)}
      first = left[-1][1] if left else first
      if not causal:
        right = sorted([s for s in spans if s[2] > last])[:k]
        edges |= {(level, p, rank) for rank, (p, _, _) in enumerate(right, 1)}
        last = right[-1][2] if right else last
    graph.append(edges)
  return graph


def fast_graph_sets(n, k, num_levels, causal) -> list:
  g = neighbour_graph(n, k, num_levels, causal)
  sets = []
  for i in range(n):
    edges = [(int(g.level[i, m]), int(g.node[i, m]), int(g.offset[i, m]))
             for m in range(g.level.shape[1]) if g.present[i, m]]
    assert len(edges) == len(set(edges)), f'token {i}: duplicate edges {edges}'
    sets.append(set(edges))
  return sets


@pytest.mark.parametrize('causal', [False, True])
def test_fast_graph_equals_python_loop_graph(causal):
  for n in (1, 2, 3, 5, 8, 13, 16, 31, 33, 64):
    for k in (1, 2, 3):
      for num_levels in (0, 2, 8):
        assert fast_graph_sets(n, k, num_levels, causal) == reference_graph(
            n, k, num_levels, causal), (n, k, num_levels)


@pytest.mark.parametrize('causal', [False, True])
def test_grouped_blocks_are_the_graph_in_closed_form(causal):
  """`column_blocks` asserts each present edge's node against floor((i + base) / 2^l) +
  delta; the plan lists every column once, in groups that a reshape of its padding makes."""
  for n in (1, 2, 3, 5, 8, 13, 16, 31, 33, 64, 100, 257):
    for k in (1, 2, 3, 4):
      for num_levels in (0, 2, 8):
        g = neighbour_graph(n, k, num_levels, causal)
        blocks = bp_transformer_grouped.column_blocks(g.level, g.node, g.present, k, causal)
        plan = bp_transformer_grouped.plan(blocks, n)
        assert sorted(plan.columns.tolist()) == list(range(g.level.shape[1]))
        for alignment in plan.alignments:
          assert alignment.length >= n + alignment.pad
          for block in alignment.blocks:
            assert alignment.length % 2 ** block.level == 0
            assert (block.base - alignment.pad) % 2 ** block.level == 0


def test_grouped_blocks_reject_a_wrong_closed_form():
  g = neighbour_graph(40, 2, 8, causal=False)
  node = g.node.copy()
  node[20, 10] += 1                                   # one level-2 left edge moved by a node
  assert g.present[20, 10] and g.level[20, 10] == 2
  with pytest.raises(AssertionError, match='closed form'):
    bp_transformer_grouped.column_blocks(g.level, node, g.present, 2, False)


def test_graph_reaches_the_whole_chunk_with_o_k_log_n_edges():
  """Bidirectional, all levels: the union of a token's spans is the whole chunk."""
  n, k = 64, 2
  for i, edges in enumerate(reference_graph(n, k, 8, causal=False)):
    covered = set()
    for level, p, _ in edges:
      covered |= set(range(p * 2 ** level, min((p + 1) * 2 ** level, n)))
    assert covered == set(range(n)), i
    assert len(edges) <= 2 * k + 1 + 2 * k * 6


def reference_matrices(n, k, num_levels, causal, segments, valid):
  """Dense matrices over [tokens; nodes] of every row, from the reference graph."""
  levels = reference_levels(n, num_levels)
  nodes = [(level, p) for level in range(1, levels + 1) for p in range(-(-n // 2 ** level))]
  column = {(0, j): j for j in range(n)}
  column.update({node: n + u for u, node in enumerate(nodes)})
  span = lambda level, p: range(p * 2 ** level, min((p + 1) * 2 ** level, n))
  width = n + len(nodes)
  average = np.zeros((B, len(nodes), n))
  child_mask = np.zeros((B, len(nodes), width), bool)
  token_mask = np.zeros((B, n, width), bool)
  usable = np.zeros((B, width), bool)
  document = np.full((B, width), -99)
  graph = reference_graph(n, k, num_levels, causal)
  for row in range(B):
    usable[row, :n], document[row, :n] = valid[row], segments[row]
    for u, (level, p) in enumerate(nodes):
      real = [t for t in span(level, p) if valid[row, t]]
      for t in real:
        average[row, u, t] = 1.0 / len(real)
      docs = {segments[row, t] for t in real}
      usable[row, n + u] = len(docs) == 1
      document[row, n + u] = docs.pop() if len(docs) == 1 else -99
      for child in ((level - 1, 2 * p), (level - 1, 2 * p + 1)):
        if child in column:
          child_mask[row, u, column[child]] = any(valid[row, t] for t in span(*child))
    for i in range(n):
      for level, p, _ in graph[i]:
        c = column[(level, p)]
        token_mask[row, i, c] = (usable[row, c] and document[row, c] == segments[row, i]
                                 and (not causal or span(level, p)[-1] <= i))
  relative = np.zeros((n, width), int)
  for i in range(n):
    for level, p, offset in graph[i]:
      relative[i, column[(level, p)]] = level * (2 * k + 1) + offset + k
  return average, child_mask, token_mask, relative


def masked_attend(xp, logits, mask, values):
  """Softmax over allowed keys (rows with none give 0): logits `[b, h, q, w]`, mask `[b, q, w]`."""
  mask = mask[:, None]
  logits = xp.where(mask, logits, -1e30)
  weights = xp.exp(logits - logits.max(-1, keepdims=True)) * mask
  weights = weights / xp.maximum(weights.sum(-1, keepdims=True), 1e-30)
  return xp.einsum('bhqw,bwhd->bqhd', weights, values)


def reference_core(xp, q, k, v, rel_keys, matrices):
  """Dense attention over [tokens; nodes]; q scaled. Works in numpy (float64) and jax."""
  average, child_mask, token_mask, relative = matrices
  node_q, node_k, node_v = (xp.einsum('bun,bnhd->buhd', average, a) for a in (q, k, v))
  keys = xp.concatenate([k, node_k], axis=1)
  node_values = masked_attend(xp, xp.einsum('buhd,bwhd->bhuw', node_q, keys), child_mask,
                              xp.concatenate([v, node_v], axis=1))
  values = xp.concatenate([v, node_values], axis=1)
  offsets = rel_keys.reshape(-1, *rel_keys.shape[2:])[relative]          # [n, w, h, d]
  logits = (xp.einsum('bihd,bwhd->bhiw', q, keys) + xp.einsum('bihd,iwhd->bhiw', q, offsets))
  return masked_attend(xp, logits, token_mask, values)


# Row 1 starts a new document at slot 5 (the sparse tests' rows, B = 2, START = 40).
chunk_facts = functools.partial(sparse_chunk_facts, boundary=5)


# (n, k, num_levels, causal): a power of 2 and not, longer than 16, levels capped.
CASES = [(16, 2, 8, False), (13, 1, 8, False), (19, 2, 2, False),
         (16, 2, 8, True), (13, 1, 8, True), (19, 3, 2, True)]


# dense_max_len 0: every chunk takes the grouped path; 64: every chunk here takes the dense path.
@pytest.mark.parametrize('dense_max_len', [0, 64], ids=['grouped', 'dense'])
@pytest.mark.parametrize('n,k,num_levels,causal', CASES)
def test_layer_matches_dense_reference(n, k, num_levels, causal, dense_max_len):
  module = BPTransformerAttention(config=BPTransformerConfig(k=k, num_levels=num_levels,
                                                            dense_max_len=dense_max_len),
                                  shared=shared_settings(num_heads=H, head_dim=HD, d_model=D,
                                                         causal=causal))
  positions, segments, valid = chunk_facts(n)
  ctx = context_for(positions, segments, valid)
  x = jax.random.normal(jax.random.PRNGKey(n), (B, n, D))
  params = nn.meta.unbox(jax.jit(module.init, compiler_options=FAST_COMPILE)(
      jax.random.PRNGKey(0), x, {}, ctx)['params'])
  # Relative keys of the size of the content keys, so that the test sees them.
  params['relative_keys'] = jax.random.normal(jax.random.PRNGKey(7),
                                              params['relative_keys'].shape)
  y, state, aux = jax.jit(module.apply, compiler_options=FAST_COMPILE)({'params': params}, x, {},
                                                                       ctx)
  assert state == {} and aux == {}
  p = jax.tree_util.tree_map(lambda a: np.asarray(a, np.float64), params)
  x64 = np.asarray(x, np.float64)
  project = lambda name: np.einsum('bnd,dhe->bnhe', x64, p[name]['kernel'])
  matrices = reference_matrices(n, k, num_levels, causal, segments, valid)
  out = reference_core(np, project('query') / np.sqrt(HD), project('key'), project('value'),
                       p['relative_keys'], matrices)
  expected = np.einsum('bnhe,hed->bnd', out, p['out']['kernel'])
  np.testing.assert_allclose(np.asarray(y), expected, rtol=2e-4, atol=2e-5)


@pytest.mark.parametrize('path', PATHS)
@pytest.mark.parametrize('n,k,num_levels,causal', [(13, 2, 8, False), (19, 1, 8, True),
                                                   (37, 3, 8, False)])
def test_outputs_and_gradients_match_dense_reference(n, k, num_levels, causal, path):
  positions, segments, valid = chunk_facts(n)
  matrices = reference_matrices(n, k, num_levels, causal, segments, valid)
  q, k_, v, cotangent = (jax.random.normal(jax.random.PRNGKey(i), (B, n, H, HD))
                         for i in range(4))
  rel_keys = jax.random.normal(jax.random.PRNGKey(5), (num_levels + 1, 2 * k + 1, H, HD))

  def fast(q, k_, v, rel_keys):
    return bp_transformer_attention(q, k_, v, rel_keys, jnp.asarray(positions),
                                    jnp.asarray(segments), jnp.asarray(valid), radius=k,
                                    num_levels=num_levels, causal=causal, path=path)
  fast_loss = lambda *args: jnp.sum(fast(*args) * cotangent)
  expected = reference_core(np, *(np.asarray(a, np.float64) for a in (q, k_, v, rel_keys)),
                            matrices)
  np.testing.assert_allclose(np.asarray(jax.jit(fast)(q, k_, v, rel_keys)), expected,
                             rtol=2e-4, atol=2e-5)

  # jit only to compile the reference's many small ops once (the same float32 program).
  @jax.jit
  def reference_loss(q, k_, v, rel_keys):
    return jnp.sum(reference_core(jnp, q, k_, v, rel_keys, matrices) * cotangent)
  assert_gradients_match(fast_loss, reference_loss, (q, k_, v, rel_keys))


@pytest.mark.parametrize('path', ['grouped', 'gathered'])
def test_forward_and_backward_never_build_an_n_by_n_array(path):
  n, k = 2048, 4
  positions = jnp.arange(n, dtype=jnp.int32)[None]
  q = jnp.ones((1, n, 1, 8))
  rel_keys = jnp.ones((12, 2 * k + 1, 1, 8))

  def loss(q, k_, v, rel_keys):
    return jnp.sum(bp_transformer_attention(q, k_, v, rel_keys, positions,
                                            jnp.zeros_like(positions), jnp.ones((1, n), bool),
                                            radius=k, num_levels=11, causal=False, path=path))
  largest = largest_intermediate(jax.grad(loss, argnums=(0, 1, 2, 3)), q, q, q, rel_keys)
  neighbours = neighbour_graph(n, k, 11, causal=False).level.shape[1]     # 2k + 1 + 2k * 11
  assert largest <= n * neighbours * 8 < n * n // 2, (largest, neighbours)


def test_benchmark_cases_agree():
  cases = {case.variant: case for case in bp_transformer_cases.CASES}
  inputs = cases['bp_transformer_grouped'].make_inputs(300, jax.random.PRNGKey(3))
  run = lambda name: jax.jit(cases[name].forward, compiler_options=FAST_COMPILE)(*inputs)
  dense = run('bp_transformer_dense_mask')
  for name in ('bp_transformer_grouped', 'bp_transformer_gathered'):
    np.testing.assert_allclose(np.asarray(run(name)), np.asarray(dense), atol=2e-5)


def test_an_unknown_path_is_named():
  q = jnp.zeros((1, 4, 1, 8))
  positions = jnp.arange(4)[None]
  with pytest.raises(ValueError, match="'blocked'"):
    bp_transformer_attention(q, q, q, jnp.zeros((3, 3, 1, 8)), positions,
                             jnp.zeros_like(positions), positions >= 0, radius=1,
                             num_levels=2, causal=False, path='blocked')


@pytest.mark.parametrize('key,section', [
    ('model.bp_transformer.k', dict(k=0)),
    ('model.bp_transformer.num_levels', dict(num_levels=-1)),
    ('model.bp_transformer.num_levels', dict(num_levels=31)),
    ('model.bp_transformer.dense_max_len', dict(dense_max_len=-1)),
    ('model.bp_transformer.radius', dict(radius=2)),
])
def test_bad_settings_name_their_key(key, section):
  with pytest.raises(ConfigError) as error:
    tiny_config(attention='bp_transformer', bp_transformer=section)
  assert error.value.key == key


def test_config_reading():
  cfg = tiny_model_config(attention='bp_transformer', causal=False,
                          bp_transformer=dict(k=3, num_levels=5, dense_max_len=0))
  module = attention_layer(cfg, jnp.float32)
  assert (module.config.k, module.config.num_levels, module.config.dense_max_len,
          module.shared.causal) == (3, 5, 0, False)


@pytest.mark.slow
def test_trains_as_a_language_model(tmp_path):
  config = tiny_config(attention='bp_transformer', bp_transformer=dict(k=2, num_levels=4))
  config.data.chunk_len = 16
  config.train.update(num_steps=3, log_every=1, checkpoint_every=3)
  state, metrics = train_script.train(config, str(tmp_path))
  assert int(state.step) == 3 and np.isfinite(metrics['loss'])
  assert state.memory == ({}, {})
