"""Encoder-output memory: FIFO bookkeeping against a python list, cross-attention
against a float64 loop."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from longformer_jax.models import encoder_output_memory as encoder_output

B, CAP, D, H, HD = 2, 7, 16, 2, 8


def test_fifo_keeps_the_latest_outputs_and_evicts_each_once():
  """Random chunk sizes and padding; a python deque is the reference."""
  rng = np.random.default_rng(0)
  memory = encoder_output.create(B, CAP, D)
  insert = jax.jit(encoder_output.insert)
  kept = [[] for _ in range(B)]            # reference: valid positions in memory, oldest first
  evicted_seen = [[] for _ in range(B)]
  position = 0
  for n in (3, 5, 1, 8, 4):
    positions = np.tile(np.arange(position, position + n, dtype=np.int32), (B, 1))
    valid = rng.random((B, n)) < 0.8
    outputs = positions[..., None].astype(np.float32) + np.zeros((B, n, D), np.float32)
    memory, evicted = insert(memory, jnp.asarray(outputs), jnp.asarray(positions),
                             jnp.zeros((B, n), jnp.int32), jnp.asarray(valid))
    position += n
    assert evicted.positions.shape == (B, n)
    for b in range(B):
      kept[b] += list(positions[b][valid[b]])
      dropped, kept[b] = kept[b][:max(0, len(kept[b]) - CAP)], kept[b][-CAP:]
      got_evicted = sorted(np.asarray(evicted.positions[b])[np.asarray(evicted.valid[b])])
      assert got_evicted == dropped
      evicted_seen[b] += got_evicted
      valid_now = np.asarray(memory.valid[b])
      assert sorted(np.asarray(memory.positions[b])[valid_now]) == kept[b]
      # the data travelled with its position
      np.testing.assert_array_equal(np.asarray(memory.data[b])[valid_now][:, 0],
                                    np.asarray(memory.positions[b])[valid_now])
  for b in range(B):
    assert len(set(evicted_seen[b])) == len(evicted_seen[b])
  cleared = encoder_output.clear_rows(memory, jnp.array([True, False]))
  assert not np.asarray(cleared.valid[0]).any()
  np.testing.assert_array_equal(np.asarray(cleared.valid[1]), np.asarray(memory.valid[1]))


def reference_cross_attention(params, x, data, mem_segments, mem_valid, q_segments):
  p = jax.tree_util.tree_map(lambda a: np.asarray(a, np.float64), nn.meta.unbox(params))
  out = np.zeros((x.shape[0], x.shape[1], H, HD))
  for b in range(x.shape[0]):
    for i in range(x.shape[1]):
      for h in range(H):
        q = x[b, i] @ p['query']['kernel'][:, h]
        keys = [j for j in range(data.shape[1])
                if mem_valid[b, j] and (q_segments is None or mem_segments[b, j] == q_segments[b, i])]
        if not keys:
          continue
        scores = np.array([q @ (data[b, j] @ p['key']['kernel'][:, h]) for j in keys]) / np.sqrt(HD)
        w = np.exp(scores - scores.max())
        w /= w.sum()
        out[b, i, h] = sum(wj * (data[b, j] @ p['value']['kernel'][:, h]) for wj, j in zip(w, keys))
  return np.einsum('bqhe,hed->bqd', out, p['out']['kernel'])


def test_cross_attention_reads_every_valid_entry_of_the_document():
  rng = np.random.default_rng(1)
  memory = encoder_output.create(B, CAP, D)
  outputs = rng.normal(size=(B, 5, D)).astype(np.float32)
  positions = np.tile(np.arange(5, dtype=np.int32), (B, 1))
  segments = np.array([[0, 0, 1, 1, 1], [0, 0, 0, 0, 0]], np.int32)
  valid = np.array([[True, True, True, False, True], [True] * 5])
  memory, _ = encoder_output.insert(memory, jnp.asarray(outputs), jnp.asarray(positions),
                                    jnp.asarray(segments), jnp.asarray(valid))
  x = rng.normal(size=(B, 3, D)).astype(np.float32)
  q_segments = np.array([[0, 1, 2], [0, 0, 0]], np.int32)     # document 2 has no encoder output
  module = encoder_output.EncoderMemoryCrossAttention(num_heads=H, head_dim=HD, d_model=D)
  params = jax.jit(module.init)(jax.random.PRNGKey(0), jnp.asarray(x), memory,
                                jnp.asarray(q_segments))['params']
  data = np.asarray(memory.data, np.float64)
  for segs in (q_segments, None):
    got = jax.jit(module.apply)({'params': params}, jnp.asarray(x), memory,
                       None if segs is None else jnp.asarray(segs))
    expected = reference_cross_attention(params, x.astype(np.float64), data,
                                         np.asarray(memory.segment_ids), np.asarray(memory.valid), segs)
    np.testing.assert_allclose(np.asarray(got), expected, rtol=2e-4, atol=2e-5)


def test_gradient_to_encoder_outputs_only_when_asked():
  module = encoder_output.EncoderMemoryCrossAttention(num_heads=H, head_dim=HD, d_model=D)
  x = jax.random.normal(jax.random.PRNGKey(2), (B, 3, D))
  enc = jax.random.normal(jax.random.PRNGKey(3), (B, 4, D))
  positions = jnp.tile(jnp.arange(4, dtype=jnp.int32), (B, 1))
  zeros, valid = jnp.zeros((B, 4), jnp.int32), jnp.ones((B, 4), bool)
  memory = encoder_output.create(B, CAP, D)
  params = jax.jit(module.init)(jax.random.PRNGKey(0), x, memory)['params']

  def loss(enc, stop):
    filled, _ = encoder_output.insert(memory, enc, positions, zeros, valid, stop_gradient=stop)
    return module.apply({'params': params}, x, filled).sum()
  gradient = jax.jit(jax.grad(loss), static_argnums=1)
  assert float(jnp.abs(gradient(enc, False)).sum()) > 0
  assert float(jnp.abs(gradient(enc, True)).sum()) == 0
