"""The cuDNN sliding-window path (attention/core/cudnn_window.py), checked on CPU.

cuDNN itself runs only on a GPU (tests/attention/test_cudnn_attention.py compares it
there). Here the same function runs with `implementation='xla'`, which feeds
the packed description (offsets, lengths) through the dense mask it stands
for, so these tests hold to the dense float32 rule on positions (documents,
padding, the window):

- the packed segments describe exactly the rule wherever `fits` says so, and
  `fits` refuses the inputs they cannot describe;
- outputs and gradients of every branch (one document per row, packed
  documents, the XLA fallback);
- the log-sum-exp and its gradient (the custom VJP), alone and merged with a
  second part of keys, against one softmax over the union.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from longformer_jax.attention.core import cudnn_window
from longformer_jax.attention.core.masking import causal_document_mask
from longformer_jax.attention.core.partial_softmax import merge_parts, softmax_part
from longformer_jax.attention.core.sliding_window import blocked_window_attention

B, N, H, HD, W = 2, 48, 2, 16, 7
SCALE = HD ** -0.5


def layout(kind: str):
  """positions, segment_ids, valid [B, N] of a named case."""
  positions = np.tile(np.arange(500, 500 + N, dtype=np.int32), (B, 1))
  segments = np.full((B, N), 3, np.int32)
  valid = np.ones((B, N), bool)
  if kind == 'documents':          # row 0: a cache-like invalid prefix, then two documents;
    valid[0, :5] = False           # row 1: three documents and trailing padding of its own id
    segments[0, :5] = 2
    segments[0, 20:] = 4
    segments[1, 11:] = 4
    segments[1, 30:] = 5
    segments[1, 40:] = 6
    valid[1, 40:] = False
  elif kind == 'padding':          # one document per row, then padding
    valid[0, 30:] = False
    valid[1, 45:] = False
  elif kind == 'hole':             # padding inside a document: not packable
    valid[1, 10:12] = False
  elif kind == 'jump':             # positions jump inside a document
    positions[0, 20:] += 3
  elif kind == 'many':             # more documents than max_segments=3
    segments[0] = np.arange(N) // 8
  elif kind == 'reopened':         # a document id comes back after another
    segments[0, 10:20] = 4
  return jnp.asarray(positions), jnp.asarray(segments), jnp.asarray(valid)


def reference_mask(positions, segments, valid):
  mask = causal_document_mask(positions, segments, positions, segments, valid, causal=True)
  return mask & (positions[:, None, :] >= positions[:, :, None] - W) & valid[:, :, None]


@pytest.mark.parametrize('kind', ['one', 'documents', 'padding'])
def test_packed_segments_describe_the_position_rule(kind):
  positions, segments, valid = layout(kind)
  assert bool(cudnn_window.fits(positions, segments, valid))
  offsets, lengths, _ = cudnn_window.packed_segments(segments, valid, cudnn_window.MAX_SEGMENTS)
  np.testing.assert_array_equal(cudnn_window.packed_mask(offsets, lengths, N, W),
                                reference_mask(positions, segments, valid))
  assert bool(cudnn_window.single_prefix_run(segments, valid)) == (kind != 'documents')


@pytest.mark.parametrize('kind', ['hole', 'jump', 'many', 'reopened'])
def test_fits_refuses_what_packing_cannot_describe(kind):
  positions, segments, valid = layout(kind)
  assert not bool(cudnn_window.fits(positions, segments, valid, max_segments=3))


def test_packed_segments_use_cudnn_conventions():
  _, segments, valid = layout('documents')
  offsets, lengths, runs = cudnn_window.packed_segments(segments, valid, 4)
  np.testing.assert_array_equal(offsets, [[5, 20, -1, -1, -1], [0, 11, 30, -1, -1]])
  np.testing.assert_array_equal(lengths, [[15, 28, -1, -1], [11, 19, 10, -1]])
  np.testing.assert_array_equal(runs, [2, 3])


def fallback(positions, segments, valid):
  return lambda q, k, v: blocked_window_attention(
      q, k, v, positions, segments, positions, segments, valid, window=W, block_size=16,
      causal=True, scale=SCALE)


def inputs(seed=0):
  keys = jax.random.split(jax.random.PRNGKey(seed), 6)
  q, k, v = (jax.random.normal(key, (B, N, H, HD)).astype(jnp.bfloat16) for key in keys[:3])
  return q, k, v, jax.random.normal(keys[3], (B, N, H, HD)), jax.random.normal(keys[4], (B, N, H))


def dense(q, k, v, mask):
  """float32 `(out, lse)` of the masked softmax on the same bfloat16-rounded inputs."""
  q, k, v = (a.astype(jnp.float32) for a in (q, k, v))
  weights, lse = softmax_part(jnp.einsum('bqhd,bkhd->bhqk', q, k) * SCALE, mask[:, None])
  return jnp.einsum('bhqk,bkhd->bqhd', weights, v), jnp.swapaxes(lse, 1, 2)


def outputs_and_gradients(fn, q, k, v, probe, lse_probe):
  def objective(q, k, v):
    out, lse = fn(q, k, v)
    return (jnp.sum(out * probe) + jnp.sum(jnp.where(jnp.isfinite(lse), lse, 0.0) * lse_probe),
            (out, lse))
  # Jitted: eager, each lax.cond inside would compile on every call.
  (_, (out, lse)), grads = jax.jit(
      jax.value_and_grad(objective, argnums=(0, 1, 2), has_aux=True))(q, k, v)
  return out, lse, grads


@pytest.mark.parametrize('kind,max_segments', [('one', 16), ('documents', 16), ('padding', 16),
                                               ('documents', 2), ('hole', 16)])
@pytest.mark.parametrize('with_lse', [False, True])
def test_window_attention_equals_dense_reference(kind, max_segments, with_lse):
  """Branches: one document (0), packed documents (1), and the fallback for too many
  runs or a hole (2); with the log-sum-exp, its gradient goes through the custom VJP."""
  positions, segments, valid = layout(kind)
  q, k, v, probe, lse_probe = inputs()

  def fast(q, k, v):
    result = cudnn_window.window_attention(
        q, k, v, positions, segments, valid, window=W, scale=SCALE,
        fallback=fallback(positions, segments, valid), with_lse=with_lse,
        implementation='xla', max_segments=max_segments)
    return result if with_lse else (result, jnp.zeros((B, N, H)))

  def reference(q, k, v):
    out, lse = dense(q, k, v, reference_mask(positions, segments, valid))
    return out, lse if with_lse else jnp.zeros((B, N, H))

  got, want = (outputs_and_gradients(fn, q, k, v, probe, lse_probe) for fn in (fast, reference))
  rows = np.asarray(valid)
  np.testing.assert_allclose(np.asarray(got[0])[rows], np.asarray(want[0])[rows],
                             atol=2e-2, rtol=2e-2)
  assert not np.any(np.asarray(got[0])[~rows])            # padding queries: 0
  if with_lse:
    np.testing.assert_allclose(np.asarray(got[1])[rows], np.asarray(want[1])[rows],
                               atol=2e-2, rtol=1e-2)
    assert np.all(np.isneginf(np.asarray(got[1])[~rows]))
  for g, r in zip(got[2], want[2]):
    np.testing.assert_allclose(np.asarray(g, np.float32), np.asarray(r), atol=3e-2, rtol=3e-2)


def test_log_sum_exp_gradient_merges_exactly_with_another_part():
  """The window merged with extra keys outside it (e.g. global tokens) by log-sum-exp has the
  gradients of one softmax over the union: wrong if the log-sum-exp's gradient is dropped."""
  positions, segments, valid = layout('documents')
  q, k, v, probe, _ = inputs(1)
  extra_k, extra_v = (jax.random.normal(key, (B, 4, H, HD)).astype(jnp.bfloat16)
                      for key in jax.random.split(jax.random.PRNGKey(7), 2))

  def merged(q, k, v, extra_k, extra_v, window_lse=True):
    out, lse = cudnn_window.window_attention(
        q, k, v, positions, segments, valid, window=W, scale=SCALE,
        fallback=fallback(positions, segments, valid), with_lse=True, implementation='xla')
    if not window_lse:
      lse = jax.lax.stop_gradient(lse)
    logits = jnp.einsum('bqhd,bkhd->bhqk', q.astype(jnp.float32), extra_k.astype(jnp.float32))
    weights, extra_lse = softmax_part(logits * SCALE, valid[:, None, :, None])
    extra = jnp.einsum('bhqk,bkhd->bqhd', weights, extra_v.astype(jnp.float32))
    return merge_parts([out, extra], [lse, jnp.swapaxes(extra_lse, 1, 2)])

  def union(q, k, v, extra_k, extra_v):
    window_mask = reference_mask(positions, segments, valid)
    mask = jnp.concatenate([window_mask, jnp.broadcast_to(valid[:, :, None], (B, N, 4))], axis=2)
    out, _ = dense(q, jnp.concatenate([k, extra_k], 1), jnp.concatenate([v, extra_v], 1), mask)
    return out

  args = (q, k, v, extra_k, extra_v)
  grad = lambda fn: jax.jit(
      jax.grad(lambda *a: jnp.sum(fn(*a) * probe), argnums=(0, 1, 2, 3, 4)))(*args)
  for g, r in zip(grad(merged), grad(union)):
    np.testing.assert_allclose(np.asarray(g, np.float32), np.asarray(r), atol=3e-2, rtol=3e-2)
  dropped = grad(lambda *a: merged(*a, window_lse=False))
  assert np.max(np.abs(np.asarray(dropped[0], np.float32) - np.asarray(grad(union)[0]))) > 0.1


def test_packed_statistics_map_back_to_their_slots():
  """cuDNN returns a packed call's log-sum-exp per segment (`[batch * M, heads, n]`, the
  segments of all rows compacted in order, by offset within the segment): each slot reads
  its own entry."""
  _, segments, valid = layout('documents')
  offsets, lengths, _ = cudnn_window.packed_segments(segments, valid, 4)
  # Entry (segment g, head h, offset t) = 1000 g + 10 t + h/10: decodable.
  g, h, t = np.meshgrid(np.arange(B * 4), np.arange(H), np.arange(N), indexing='ij')
  stats = jnp.asarray(1000.0 * g + 10.0 * t + h / 10.0)
  lse = np.asarray(cudnn_window.token_lse_from_packed_stats(stats, offsets, lengths))
  # Row 0: segments 0 (slots 5..19) and 1 (20..47); row 1: segments 2 (0..10), 3, 4.
  expected_segment = {(0, 5): 0, (0, 19): 0, (0, 20): 1, (0, 47): 1, (1, 0): 2, (1, 10): 2,
                      (1, 11): 3, (1, 30): 4, (1, 39): 4}
  starts = {0: 5, 1: 20, 2: 0, 3: 11, 4: 30}
  for (row, slot), segment in expected_segment.items():
    np.testing.assert_allclose(lse[row, slot], 1000.0 * segment + 10.0 * (slot - starts[segment])
                               + np.arange(H) / 10.0)


def test_slots_outside_every_run_get_no_gradient():
  """cuDNN leaves the gradients of slots outside every packed run unwritten; the wrapper
  zeroes them (their true gradient is 0): a stray cotangent there never reaches q, k, v."""
  _, segments, valid = layout('documents')
  offsets, lengths, _ = cudnn_window.packed_segments(segments, valid, 4)
  covered = cudnn_window.covered_slots(offsets, lengths, N)
  np.testing.assert_array_equal(covered, valid)
  x = jnp.ones((B, N, H, HD))
  g = jax.grad(lambda x: jnp.sum(cudnn_window._cotangent_only_where(x, covered) * 3.0))(x)
  np.testing.assert_array_equal(np.asarray(g), np.broadcast_to(
      3.0 * np.asarray(valid)[..., None, None], g.shape))


# ---- the two-sided window: two causal passes merged (longformer/cudnn_two_sided_window.py)

def two_sided_mask(positions, segments, valid):
  mask = causal_document_mask(positions, segments, positions, segments, valid, causal=False)
  return mask & (jnp.abs(positions[:, None, :] - positions[:, :, None]) <= W) & valid[:, :, None]


@pytest.mark.parametrize('kind', ['one', 'documents', 'padding', 'hole'])
def test_two_sided_window_equals_dense_reference(kind):
  """Left causal pass + right pass on the reversed, shifted queries, merged by log-sum-exp:
  outputs, log-sum-exp and gradients through both equal the dense two-sided rule ('hole':
  the XLA fallback)."""
  from longformer_jax.attention.longformer.cudnn_two_sided_window import two_sided_window_attention
  positions, segments, valid = layout(kind)
  q, k, v, probe, lse_probe = inputs(2)
  q, k, v = (a.astype(jnp.float32) for a in (q, k, v))    # the XLA description keeps float32
  fallback = lambda q, k, v: blocked_window_attention(
      q, k, v, positions, segments, positions, segments, valid, window=W, block_size=16,
      causal=False, scale=SCALE)
  fast = lambda q, k, v: two_sided_window_attention(
      q, k, v, positions, segments, valid, window=W, scale=SCALE, fallback=fallback,
      implementation='xla')
  reference = lambda q, k, v: dense(q, k, v, two_sided_mask(positions, segments, valid))
  got, want = (outputs_and_gradients(fn, q, k, v, probe, lse_probe) for fn in (fast, reference))
  rows = np.asarray(valid)
  np.testing.assert_allclose(np.asarray(got[0])[rows], np.asarray(want[0])[rows], atol=2e-5)
  np.testing.assert_allclose(np.asarray(got[1])[rows], np.asarray(want[1])[rows], atol=2e-5)
  assert not np.any(np.asarray(got[0])[~rows]) and np.all(np.isneginf(np.asarray(got[1])[~rows]))
  for g, r in zip(got[2], want[2]):
    np.testing.assert_allclose(np.asarray(g, np.float32), np.asarray(r), atol=1e-4)


@pytest.mark.parametrize('kind', ['documents', 'padding'])
def test_unwritten_rows_of_the_kernel_never_reach_the_gradients(kind, monkeypatch):
  """cuDNN leaves the output rows of slots outside every run unwritten: garbage, NaN at
  times (an H200 gave NaN parameter gradients through the two-sided window, whose reversed
  pass puts the padding first). With NaN written into those rows of every kernel call, the
  two-sided window's outputs, log-sum-exp and gradients are unchanged."""
  from longformer_jax.attention.longformer.cudnn_two_sided_window import two_sided_window_attention
  positions, segments, valid = layout(kind)
  q, k, v, probe, lse_probe = inputs(3)
  q, k, v = (a.astype(jnp.float32) for a in (q, k, v))
  fallback = lambda q, k, v: blocked_window_attention(   # traced by lax.cond, not taken
      q, k, v, positions, segments, positions, segments, valid, window=W, block_size=16,
      causal=False, scale=SCALE)
  fast = lambda q, k, v: two_sided_window_attention(
      q, k, v, positions, segments, valid, window=W, scale=SCALE, fallback=fallback,
      implementation='xla')
  clean = outputs_and_gradients(fast, q, k, v, probe, lse_probe)
  attend = cudnn_window._attend

  def unwritten_rows_nan(q, k, v, offsets, lengths, **settings):
    out, lse = attend(q, k, v, offsets, lengths, **settings)
    covered = cudnn_window.covered_slots(offsets, lengths, q.shape[1])
    out = jnp.where(covered[..., None, None], out, jnp.nan)
    return out, None if lse is None else jnp.where(covered[..., None], lse, jnp.nan)

  monkeypatch.setattr(cudnn_window, '_attend', unwritten_rows_nan)
  poisoned = outputs_and_gradients(fast, q, k, v, probe, lse_probe)
  for got, want, what in zip(jax.tree_util.tree_leaves(poisoned), jax.tree_util.tree_leaves(clean),
                             ['out', 'lse', 'dq', 'dk', 'dv']):
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), atol=1e-6, err_msg=what)
