"""Memories driven over many chunks keep a planted needle where their papers say they do.

The memory and retrieval path of the kNN layer (attention/memorizing.py: clear
at a document start, drop other documents' entries, retrieve the top-k per
head, insert the chunk first-in first-out) and of Attendre's K/V memory
(attention/attendre.py, attend-first order: score the memory by the chunk's
attention over it, then insert the chunk with the policy's eviction) are run
here step by step over dozens of chunks of random filler keys, with a needle
of a few entries planted early whose keys match one direction `e`. Each
check is counted by hand against where the needle lies:

- kNN memory holding the whole document: a query along `e` at the end
  retrieves every needle entry in its top-k, 2,000 tokens later;
- kNN FIFO memory of M entries: the needle is retrieved exactly while its
  entries are among the last M tokens read (M just enough: all of them;
  one fewer: the needle's first entry is gone), and a new document forgets it;
- Attendre LRA (max pooling) and LFA with 32 entries, a query along `e` in
  every chunk (the needle is attended): every needle entry survives 60
  chunks of 16, where FIFO drops it after 2 chunks and LRA without the
  reminder query drops it too (what keeps it is the attention).
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from longformer_jax.memory import key_value, policies

HEADS, DIM = 2, 16


def _direction() -> np.ndarray:
  e = np.zeros([HEADS, DIM], np.float32)
  e[:, 3] = 1.0
  return e


def _filler(rng, n: int) -> np.ndarray:
  """`[1, n, heads, dim]` random keys nearly orthogonal to e (no component along it)."""
  keys = rng.normal(0, 1 / np.sqrt(DIM), [1, n, HEADS, DIM]).astype(np.float32)
  keys[..., 3] = 0.0
  return keys


def _chunks(num_chunks: int, chunk: int, needle_chunk: int, needle_at: int, needle_len: int,
            seed: int = 0):
  """Per chunk: keys `[1, chunk, h, d]`, positions `[1, chunk]`; the needle's positions."""
  rng = np.random.default_rng(seed)
  out = []
  for c in range(num_chunks):
    keys = _filler(rng, chunk)
    if c == needle_chunk:
      keys[0, needle_at:needle_at + needle_len] = 3.0 * _direction()
    out.append((keys, np.arange(c * chunk, (c + 1) * chunk, dtype=np.int32)[None]))
  return out, needle_chunk * chunk + needle_at + np.arange(needle_len)


@functools.partial(jax.jit, static_argnames=('policy',))
def _knn_step(memory, keys, positions, segment_ids, reset, *, policy):
  """What MemorizingAttention does with its memory for one chunk (after retrieval)."""
  memory = key_value.clear_rows(memory, reset)
  memory = memory.replace(valid=memory.valid & (memory.segment_ids == segment_ids[:, :1]))
  new = key_value.entries_from_chunk(keys, keys, positions, segment_ids,
                                     jnp.ones(positions.shape, bool))
  memory, _ = key_value.insert(memory, new, policy)
  return memory


def _drive_knn(capacity: int, chunks, new_document_at: int = -1):
  memory = key_value.create(1, capacity, HEADS, DIM)
  fifo = policies.policy_from_name('fifo')
  for index, (keys, positions) in enumerate(chunks):
    segment = np.full(positions.shape, int(index >= new_document_at >= 0), np.int32)
    memory = _knn_step(memory, keys, positions, segment, np.array([index == new_document_at]),
                       policy=fifo)
  return memory


def _retrieved_positions(memory, k: int = 8) -> set:
  query = jnp.asarray(_direction())[None, None]                    # [1, 1, h, d]
  found = key_value.retrieve(memory, query, k)
  return {int(p) for p, v in zip(np.asarray(found.positions).ravel(),
                                 np.asarray(found.valid).ravel()) if v}


def test_knn_memory_of_the_whole_document_retrieves_the_needle_2000_tokens_later():
  chunks, needle = _chunks(num_chunks=64, chunk=32, needle_chunk=1, needle_at=5, needle_len=4)
  memory = _drive_knn(4096, chunks)
  assert int(np.asarray(memory.valid).sum()) == 64 * 32
  assert set(needle.tolist()) <= _retrieved_positions(memory)
  assert 64 * 32 - needle[0] > 2000


@pytest.mark.parametrize('margin', [0, -1])
def test_knn_fifo_memory_reaches_exactly_its_size(margin):
  chunks, needle = _chunks(num_chunks=40, chunk=32, needle_chunk=20, needle_at=5, needle_len=4)
  read = 40 * 32
  reach = read - int(needle[0])                 # entries needed to still hold the first one
  memory = _drive_knn(reach + margin, chunks)
  retrieved = _retrieved_positions(memory)
  if margin == 0:
    assert set(needle.tolist()) <= retrieved
  else:
    assert int(needle[0]) not in retrieved and set(needle[1:].tolist()) <= retrieved


def test_knn_memory_forgets_the_needle_at_a_new_document():
  chunks, needle = _chunks(num_chunks=24, chunk=32, needle_chunk=1, needle_at=5, needle_len=4)
  memory = _drive_knn(4096, chunks, new_document_at=10)
  assert int(np.asarray(memory.valid).sum()) == 14 * 32
  assert not set(needle.tolist()) & _retrieved_positions(memory)


@functools.partial(jax.jit, static_argnames=('policy',))
def _attendre_step(memory, keys, queries, positions, *, policy):
  """Attend-first: the chunk's queries score the memory by their softmax over it, then the
  chunk's keys are inserted with the policy's eviction."""
  logits = jnp.einsum('bqhd,bmhd->bhqm', queries, memory.data['keys']) * 4.0
  logits = jnp.where(memory.valid[:, None, None, :], logits, -jnp.inf)
  weights = jnp.nan_to_num(jax.nn.softmax(logits, axis=-1))
  valid = jnp.ones(positions.shape, bool)
  memory = policies.update_scores(policy, memory, weights, positions, valid)
  new = key_value.entries_from_chunk(keys, keys, positions, jnp.zeros_like(positions), valid)
  memory, _ = key_value.insert(memory, new, policy)
  return memory


def _drive_attendre(policy_name: str, attended: bool):
  chunks, needle = _chunks(num_chunks=60, chunk=16, needle_chunk=1, needle_at=3, needle_len=4)
  policy = policies.policy_from_name(policy_name)
  memory = key_value.create(1, 32, HEADS, DIM)
  rng = np.random.default_rng(1)
  for keys, positions in chunks:
    queries = _filler(rng, 16)
    if attended:
      queries[0, 7] = _direction()            # one query of each chunk looks for the needle
    memory = _attendre_step(memory, keys, queries, positions, policy=policy)
  held = {int(p) for p, v in zip(np.asarray(memory.positions)[0], np.asarray(memory.valid)[0])
          if v}
  return held, needle


@pytest.mark.parametrize('policy', ['lra_max', 'lfa'])
def test_attendre_eviction_by_attention_keeps_an_attended_needle(policy):
  held, needle = _drive_attendre(policy, attended=True)
  assert set(needle.tolist()) <= held and len(held) == 32


@pytest.mark.parametrize('policy, attended', [('fifo', True), ('lra_max', False)])
def test_fifo_or_an_unattended_needle_is_evicted(policy, attended):
  held, needle = _drive_attendre(policy, attended)
  assert not set(needle.tolist()) & held and len(held) == 32
