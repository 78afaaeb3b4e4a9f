"""Attendre's admission by score keeps a question that later chunks read (Yang & Hua et al.,
2024, sec. 3.1): the mechanism its TriviaQA setting rests on.

A memory of one chunk (M = C = 8) first holds the question (positions 0-7). Each later
chunk's queries attend to the memory with planted weights: most of each query's weight on
the question's entries (unevenly: some question tokens matter more), the rest spread over
whatever else the memory holds; then the chunk is inserted. Under 'fifo', and under any
scored policy with `admission='always'`, a chunk as long as the memory evicts every old
entry. Under `admission='score'` a new entry starts at mean - k * std of the memory's scores
and enters only where it beats an entry's score: LRA keeps the question.
"""

import jax.numpy as jnp
import numpy as np
import pytest

from longformer_jax.memory import data_only, policies
from longformer_jax.memory.entries import entries_from_chunk
from longformer_jax.memory.insertion import insert_entries

C = 8
QUESTION = np.arange(C)
# How much each question token matters to every later query (sums to 0.8): the entity's
# token much, the rest a little. The question's scores then spread enough that a new entry's
# mean - std falls below every one of them.
QUESTION_WEIGHT = np.array([0.45, 0.05, 0.05, 0.05, 0.05, 0.05, 0.05, 0.05])


def planted_weights(memory, question_weight) -> np.ndarray:
  """`[1, 1, C, M]`: each query gives the question's entries `question_weight` and spreads the
  rest (0.2, or everything when no question entry is left) evenly over the other entries."""
  positions, valid = np.asarray(memory.positions[0]), np.asarray(memory.valid[0])
  is_question = valid & (positions < C)
  row = np.where(is_question, question_weight[np.minimum(positions, C - 1)], 0.0)
  others = valid & ~is_question
  if others.any():
    row = row + others * (1.0 - row.sum()) / others.sum()
  return np.broadcast_to(row / row.sum(), (1, 1, C, row.size)).astype(np.float32)


def stream(policy, chunks: int = 6, question_weight=QUESTION_WEIGHT):
  """The question, then `chunks` chunks of filler: the positions the memory holds after each."""
  memory = data_only.create(1, C, (1,))
  held = []
  for k in range(chunks + 1):
    positions = jnp.arange(k * C, (k + 1) * C, dtype=jnp.int32)[None]
    if k:      # the chunk's queries read the memory, then the chunk goes in
      weights = jnp.asarray(planted_weights(memory, question_weight))
      memory = policies.update_scores(policy, memory, weights, positions, jnp.ones((1, C), bool))
    new = entries_from_chunk(jnp.zeros((1, C, 1)), positions, jnp.zeros((1, C), jnp.int32),
                             jnp.ones((1, C), bool))
    memory, _ = insert_entries(memory, new, policy)
    held.append(sorted(np.asarray(memory.positions[0])[np.asarray(memory.valid[0])].tolist()))
  return held


@pytest.mark.parametrize('name', ['lra_max', 'lra_last', 'lra_sum', 'lfa'])
def test_admission_by_score_keeps_the_question_a_memory_of_one_chunk_would_drop(name):
  kept = stream(policies.policy_from_name(name, admission='score'))
  assert all(held == QUESTION.tolist() for held in kept), kept
  dropped = stream(policies.policy_from_name(name, admission='always'))
  assert dropped[-1] == list(range(6 * C, 7 * C))           # the last chunk only
  assert stream(policies.policy_from_name('fifo'))[-1] == list(range(6 * C, 7 * C))


def test_an_unattended_question_is_not_kept():
  """The control: when later queries spread their weight evenly, the question's scores have
  no spread, a new entry's initial score ties them and the newer entry wins (ties keep the
  newest): admission by score keeps what is attended, not what came first."""
  held = stream(policies.policy_from_name('lra_max', admission='score'),
                question_weight=np.full(C, 0.1))
  assert QUESTION[0] not in held[-1]
