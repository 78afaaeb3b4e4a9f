"""Every eviction policy against a plain-Python memory written from the papers' definitions.

The reference (`PaperMemory`, tests/support/paper_memory.py) is one memory row: a dict
position -> score and T' (the largest position of a valid query of the last step that had one;
None after a reset), updated with plain loops from the definitions of
Attendre (Yang & Hua et al., 2024, sec. 3.1), H2O's recent window and
StreamingLLM's sinks, as docs/variants.md states them:

- usage is per token: a query used an entry if any head used it (per-head
  rows: the row's head); a query counts for an entry only if the query-key
  mask lets it see the entry;
- LRU: the largest position of a query that used the entry; LFU: += the
  number of queries that used it; LRA: this step's attention (summed over
  heads) pooled over the queries that may see the entry (last / max / sum),
  an entry no query may see keeps its score; LFA: gamma^(T - T') * score +
  sum_q gamma^(T - p_q) A_q, T the largest query position of the step;
- new entries score mean - k * std of the memory's scores; eviction: the
  unprotected (not a sink, not among the r newest) first, existing before
  new ones unless admission is by score, lowest score, oldest position.

A data-only memory (data = the entry's position) is driven alongside through
many chunks of random attention: random resets, padded queries (whole
padded steps too), delayed queries (positions behind the chunk's), invalid
new entries, a causal or random query-key mask, both step orders (score then
insert, as `order='attend_first'`; insert then score, as 'insert_first'),
both admission modes, recent windows, sinks and per-head rows, chunks
longer than the memory. Weights at masked slots and of padded queries are
garbage, so ignoring them is part of the test. After every chunk the kept
positions, their scores and the evicted positions must agree.
"""

import jax.numpy as jnp
import numpy as np
import pytest

from longformer_jax.memory import data_only, policies
from tests.support.paper_memory import CASES, P, run_stream


@pytest.mark.parametrize('name', sorted(CASES))
def test_policy_matches_the_paper_reference(name):
  policy, capacity, chunk, delay, causal = CASES[name]
  run_stream(policy, capacity, chunk, delay=delay, causal=causal, seed=sorted(CASES).index(name))


def _one_step(policy, memory, weights, positions, valid, mask=None):
  return policies.update_scores(policy, memory, jnp.asarray(weights, jnp.float32),
                                jnp.asarray(positions, jnp.int32), jnp.asarray(valid),
                                None if mask is None else jnp.asarray(mask))


def _memory(positions, scores):
  memory = data_only.create(1, len(positions), (1,))
  return memory.replace(positions=jnp.asarray([positions], jnp.int32),
                        valid=jnp.ones((1, len(positions)), bool),
                        scores=jnp.asarray([scores], jnp.float32))


def test_each_fix_by_hand():
  """The three definitions on numbers worked out by hand."""
  # LFU, per token: one query using entry 0 through both heads counts once.
  use = np.zeros((1, 2, 1, 2))
  use[0, :, 0, 0] = 1.0
  lfu = _one_step(P('lfu'), _memory([0, 1], [0.0, 0.0]), use, [[5]], [[True]])
  np.testing.assert_array_equal(np.asarray(lfu.scores), [[1.0, 0.0]])
  # LFA decays by position distance: queries at 10 and (padded) 11, then 13: gamma^3.
  lfa, gamma = P('lfa', gamma=0.5), 0.5
  memory = _memory([0], [0.0])
  memory = _one_step(lfa, memory, np.ones((1, 1, 2, 1)), [[10, 11]], [[True, False]])
  np.testing.assert_allclose(np.asarray(memory.scores), [[1.0]])
  memory = _one_step(lfa, memory, np.ones((1, 1, 2, 1)), [[12, 13]], [[False, True]])
  np.testing.assert_allclose(np.asarray(memory.scores), [[gamma ** 3 * 1.0 + 1.0]])
  # LRA pools over the queries that may see the entry; an entry none may see keeps its score.
  weights = np.array([[[[0.2, 0.0], [0.3, 0.0]]]])             # [1, 1, q=2, m=2]
  mask = np.array([[[[True, False], [False, False]]]])
  lra = _one_step(P('lra', pooling='last'), _memory([0, 9], [4.0, 7.0]), weights, [[3, 4]],
                  [[True, True]], mask)
  np.testing.assert_allclose(np.asarray(lra.scores), [[0.2, 7.0]])
