"""Two chunks through a Longformer layer on a given backend (the state carried): the contexts,
with documents, padding and global tokens, and the outputs, state and gradients."""

import jax
import jax.numpy as jnp
import numpy as np

from longformer_jax.attention.context import AttentionContext

B, H, HD, D, CHUNK, WINDOW = 2, 2, 16, 32, 40, 6


def chunk_contexts(global_tokens: bool):
  """Two consecutive chunks. Row 0: one document, then a new one at slot 50 of the stream;
  row 1: documents starting at 13 and 27, padding at the row's end. Global tokens (if any)
  at the first two slots of each document start inside a chunk."""
  positions = np.tile(np.arange(2 * CHUNK, dtype=np.int32), (B, 1))
  segments = np.zeros((B, 2 * CHUNK), np.int32)
  segments[0, 50:] = 1
  segments[1, 13:] = 1
  segments[1, 27:] = 2
  valid = np.ones((B, 2 * CHUNK), bool)
  valid[1, 70:] = False
  flags = np.zeros((B, 2 * CHUNK), bool)
  if global_tokens:
    flags[0, 50:52] = flags[1, 13:15] = flags[1, 27:29] = True
  piece = lambda a, c: jnp.asarray(a[:, c * CHUNK:(c + 1) * CHUNK])
  return [AttentionContext(positions=piece(positions, c), segment_ids=piece(segments, c),
                           reset=jnp.zeros((B,), bool), valid=piece(valid, c),
                           global_flags=piece(flags, c) if global_tokens else None)
          for c in range(2)]


def two_chunk_run(make, init_state, contexts, backend, params=None):
  """The layer over both chunks (state carried): `(params, out, state, grads)`; the probe
  is 0 on padding rows (never read, 0 on the cuDNN path)."""
  x = jax.random.normal(jax.random.PRNGKey(3), (B, 2 * CHUNK, D))
  valid = jnp.concatenate([ctx.valid for ctx in contexts], axis=1)
  probe = jax.random.normal(jax.random.PRNGKey(4), (B, 2 * CHUNK, D)) * valid[..., None]
  module = make(backend)
  if params is None:
    params = module.init(jax.random.PRNGKey(0), x[:, :CHUNK], init_state, contexts[0])['params']

  def two_chunks(params, x):
    s, outs = init_state, []
    for c, ctx in enumerate(contexts):
      out, s, _ = module.apply({'params': params}, x[:, c * CHUNK:(c + 1) * CHUNK], s, ctx)
      outs.append(out)
    return jnp.concatenate(outs, axis=1), s
  # One program for both chunks (eager, every lax.cond in the layer compiles on each call).
  (out, carried), pullback = jax.vjp(jax.jit(two_chunks), params, x)
  grads = pullback((probe.astype(out.dtype), jax.tree_util.tree_map(jnp.zeros_like, carried)))
  return params, np.where(np.asarray(valid)[..., None], out, 0.0), carried, grads
