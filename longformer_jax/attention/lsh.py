"""Reformer LSH attention (Kitaev et al., 2020, sec. 2-3).

Shared-QK attention whose keys are the length-normalised queries. Each token
is hashed by random rotations, h(x) = argmax([xR; -xR]) (Andoni et al., 2015;
Reformer eq. in sec. 2.2), in `num_hashes` independent rounds. In each round
the tokens are sorted by (bucket, position) and cut into chunks of
`chunk_len`; a query attends to keys of its own bucket in its own chunk and
the previous one,

  P_i = {j : h(q_i) = h(k_j),  floor(s_i / m) - 1 <= floor(s_j / m) <= floor(s_i / m)}

(s: the sorted index, m: the chunk length; the first chunk of a round has no
previous chunk), intersected with the usual causal / document / padding rule
of `masking.py` (a function of positions and segment ids). A token attends
to itself only when nothing else is available: its own key's logit is
replaced by `SELF_LOGIT` = -1e5 (as in trax and Hugging Face), which gives it
weight exactly 0 in float32 next to any other allowed key, in any round.
Rounds are combined by their log-sum-exp (sec. 2.3, multi-round LSH):

  o_i = sum_r exp(lse_r(i) - logsumexp_r lse_r(i)) o_r(i),

i.e. a softmax over the multiset union of the rounds' key sets (a key that
shares a bucket with the query in several rounds counts once per round).
Work and memory are O(n * num_hashes * chunk_len), never n x n.

Logits are q_i . k_j / sqrt(head_dim) with k_j = q_j / |q_j| by default
(`model.lsh.logit_scale='inverse_sqrt_head_dim'`). trax and Hugging Face
use q_i . k_j with no 1/sqrt(head_dim) (the keys have unit length); that is
`logit_scale='none'`. The two are different parametrisations: with the
default, attention is sqrt(head_dim) times flatter at initialisation, and
weights imported from trax or Hugging Face need `'none'` to give their outputs.

Settings: `config.model.lsh` (`LSHConfig`); causal or not is the shared
`model.causal`. Random rotations come from an explicit key (`rotation_key`):
  * fixed (default): `fold_in(PRNGKey(model.lsh.seed), crc32(module path))`,
    different per layer and identical in training and evaluation. Under
    `scan_layers` every layer has the same path, hence the same rotations.
  * `model.lsh.rotations_per_step=True`: fresh rotations at every training
    step from the `dropout` rng; deterministic calls (evaluation) use the
    fixed rotations.
"""

import dataclasses
import zlib

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections

from longformer_jax.attention.core import cached_context
from longformer_jax.attention.core.context import AttentionContext
from longformer_jax.attention.core.masking import causal_document_mask
from longformer_jax.config.section import Section
from longformer_jax.config.errors import ConfigError
from longformer_jax.layers.positional import apply_rotary

SELF_LOGIT = -1e5
# model.lsh.logit_scale: q . k_hat / sqrt(head_dim), or q . k_hat (trax / Hugging Face).
LOGIT_SCALES = ('inverse_sqrt_head_dim', 'none')


@dataclasses.dataclass(frozen=True)
class LSHConfig(Section):
  """`config.model.lsh`; causal or not is the shared `model.causal`."""
  num_hashes: int = 2             # hash rounds (n_rounds)
  num_buckets: int = 8            # buckets per round: argmax over [xR; -xR], so even
  chunk_len: int = 64             # m: a query sees its bucket in its own and the previous chunk
  seed: int = 0                   # fixed rotations per layer from this seed
  rotations_per_step: bool = False  # True: fresh rotations each training step (eval: fixed)
  rotary: bool = True             # RoPE on the shared QK vectors before hashing
  logit_scale: str = 'inverse_sqrt_head_dim'  # or 'none': no 1/sqrt(d) (trax, Hugging Face)

  legacy_names = {'lsh_num_hashes': 'num_hashes', 'lsh_num_buckets': 'num_buckets',
                  'lsh_chunk_len': 'chunk_len', 'lsh_seed': 'seed',
                  'lsh_rotations_per_step': 'rotations_per_step', 'lsh_rotary': 'rotary'}

  def validate(self, env) -> None:
    self.require(self.num_hashes >= 1, 'num_hashes', 'must be >= 1 (hash rounds)')
    self.require(self.num_buckets >= 2 and self.num_buckets % 2 == 0, 'num_buckets',
                 'must be even and >= 2 (argmax over [xR; -xR])')
    self.require(self.chunk_len >= 1, 'chunk_len', 'must be >= 1')
    self.require(self.logit_scale in LOGIT_SCALES, 'logit_scale',
                 "must be 'inverse_sqrt_head_dim' (q . k_hat / sqrt(head_dim)) or 'none' "
                 "(q . k_hat, as trax and Hugging Face)")
    if env is not None:
      # A model chunk shorter than chunk_len is one LSH chunk; a longer one is cut into them.
      bad = [n for n in env.chunk_lens if n > self.chunk_len and n % self.chunk_len]
      self.require(not bad, 'chunk_len',
                   f'must divide every model chunk length longer than it (training phases, '
                   f'evaluation); {", ".join(map(str, bad))} is not a multiple')


def random_rotations(key: jax.Array, num_heads: int, head_dim: int, num_hashes: int,
                     num_buckets: int) -> jax.Array:
  """Gaussian rotations R `[heads, head_dim, num_hashes, num_buckets // 2]`."""
  return jax.random.normal(key, (num_heads, head_dim, num_hashes, num_buckets // 2), jnp.float32)


def hash_buckets(vectors: jax.Array, rotations: jax.Array) -> jax.Array:
  """h(x) = argmax([xR; -xR]): `[batch, n, heads, head_dim]` -> `[b, heads, rounds, n]` int32."""
  rotated = jnp.einsum('bnhd,hdrk->bhrnk', vectors.astype(jnp.float32), rotations)
  return jnp.argmax(jnp.concatenate([rotated, -rotated], axis=-1), axis=-1).astype(jnp.int32)


def _gather_rows(array: jax.Array, index: jax.Array) -> jax.Array:
  """`array [b, h, n, ...]` rows picked by `index [b, h, m]` -> `[b, h, m, ...]`."""
  index = index.reshape(index.shape + (1,) * (array.ndim - 3))
  return jnp.take_along_axis(array, index, axis=2)


@jax.custom_vjp
def permute_rows(array: jax.Array, order: jax.Array, inverse: jax.Array) -> jax.Array:
  """`array [b, h, L, ...]` -> rows `order [b, h, L]` (a permutation; `inverse` its inverse).

  The VJP gathers by the inverse permutation instead of scatter-adding (the
  transpose of a general gather), which is faster on CPU and keeps no
  zero-initialised scatter buffers alive.
  """
  return _gather_rows(array, order)


def _permute_rows_fwd(array, order, inverse):
  return _gather_rows(array, order), (order, inverse)


def _permute_rows_bwd(residuals, cotangent):
  order, inverse = residuals
  return _gather_rows(cotangent, inverse), None, None


permute_rows.defvjp(_permute_rows_fwd, _permute_rows_bwd)


def _with_previous_chunk(chunks: jax.Array) -> jax.Array:
  """`[b, h, chunks, m, ...]` -> `[b, h, chunks, 2m, ...]`: own chunk, then the previous one."""
  return jnp.concatenate([chunks, jnp.roll(chunks, 1, axis=2)], axis=3)


def _softmax_and_logsumexp(logits: jax.Array, axis: int) -> tuple[jax.Array, jax.Array]:
  """Softmax weights and log-sum-exp along `axis`, float32.

  Entries are normalised by their (stop-gradient) maximum before the sum, so
  the weights stay exact when every logit is large, e.g. only the self key at
  `SELF_LOGIT` (float32 spacing at 1e5 is 0.008). A slice with every entry
  -inf gets weights 0 and log-sum-exp -inf, with zero gradient (no NaN).
  """
  top = jax.lax.stop_gradient(jnp.max(logits, axis=axis, keepdims=True))
  top = jnp.where(jnp.isfinite(top), top, 0.0)
  unnormalised = jnp.exp(logits - top)
  total = jnp.sum(unnormalised, axis=axis, keepdims=True)
  nonempty = total > 0
  safe_total = jnp.where(nonempty, total, 1.0)
  lse = jnp.where(nonempty, jnp.log(safe_total) + top, -jnp.inf)
  return unnormalised / safe_total, jnp.squeeze(lse, axis)


def lsh_attention(qk: jax.Array, v: jax.Array, positions: jax.Array, segment_ids: jax.Array,
                  valid: jax.Array, rotations: jax.Array, *, chunk_len: int,
                  causal: bool, logit_scale: str = 'inverse_sqrt_head_dim') -> jax.Array:
  """Multi-round LSH attention (module docstring), O(n * rounds * chunk_len).

  Args:
    qk: `[batch, n, heads, head_dim]` shared query/key vectors.
    v: `[batch, n, heads, head_dim]` values.
    positions, segment_ids: `[batch, n]` int32; valid: `[batch, n]` bool.
    rotations: `[heads, head_dim, rounds, num_buckets // 2]`.
    chunk_len: m; n must be a multiple of it.
    causal: keys after the query are masked.
    logit_scale: 'inverse_sqrt_head_dim' (q . k_hat / sqrt(head_dim)) or 'none'
      (q . k_hat, trax / Hugging Face).
  Returns:
    `[batch, n, heads, head_dim]` in `v`'s dtype; a query with no allowed key
    (e.g. padding) gets 0.
  """
  batch, n, heads, head_dim = qk.shape
  rounds, num_buckets = rotations.shape[2], 2 * rotations.shape[3]
  if n % chunk_len:
    raise ConfigError('model.lsh.chunk_len',
                      f'{chunk_len}: the attention length {n} is not a multiple of it')
  if logit_scale not in LOGIT_SCALES:
    raise ConfigError('model.lsh.logit_scale',
                      f"{logit_scale!r} must be one of {', '.join(map(repr, LOGIT_SCALES))}")
  # Buckets of different rounds never meet: offset them by round * num_buckets,
  # then sort all rounds at once by (bucket, position, slot).
  buckets = hash_buckets(jax.lax.stop_gradient(qk), rotations)
  buckets += (jnp.arange(rounds, dtype=jnp.int32) * num_buckets)[:, None]
  shape = (batch, heads, rounds * n)
  slots = jnp.broadcast_to(jnp.arange(n, dtype=jnp.int32), (batch, heads, rounds, n)).reshape(shape)
  row_positions = jnp.broadcast_to(positions[:, None, None, :], (batch, heads, rounds, n))
  sorted_buckets, _, sorted_slots = jax.lax.sort(
      (buckets.reshape(shape), row_positions.reshape(shape), slots), dimension=2, num_keys=3)

  def by_chunk(rows):  # [b, h, rounds * n, ...] -> [b, h, chunks, m, ...]
    return rows.reshape(batch, heads, rounds * n // chunk_len, chunk_len, *rows.shape[3:])

  def sorted_per_head(per_token):  # [b, n] -> [b, h, chunks, m]
    rows = jnp.broadcast_to(per_token[:, None, :], (batch, heads, n))
    return by_chunk(jnp.take_along_axis(rows, sorted_slots, axis=2))

  # Sorted entry i (of round i // n) holds token sorted_slots[i]: row `source[i]`
  # of the rounds laid end to end; `undo` is the inverse permutation.
  source = sorted_slots + (jnp.arange(rounds * n, dtype=jnp.int32) // n) * n
  _, undo = jax.lax.sort((source, jnp.broadcast_to(jnp.arange(rounds * n, dtype=jnp.int32), shape)),
                         dimension=2, num_keys=1)

  def sort_rows(per_head):  # [b, h, n, d] -> [b, h, chunks, m, d]
    return by_chunk(permute_rows(jnp.concatenate([per_head] * rounds, axis=2), source, undo))

  qk_rows = jnp.swapaxes(qk, 1, 2)                                    # [b, h, n, d]
  keys = qk_rows * jax.lax.rsqrt(
      jnp.maximum(jnp.sum(jnp.square(qk_rows.astype(jnp.float32)), -1, keepdims=True),
                  1e-12)).astype(qk.dtype)
  q = sort_rows(qk_rows)                                              # [b, h, c, m, d]
  k = _with_previous_chunk(sort_rows(keys))                           # [b, h, c, 2m, d]
  values = _with_previous_chunk(sort_rows(jnp.swapaxes(v, 1, 2)))
  q_pos, q_seg = sorted_per_head(positions), sorted_per_head(segment_ids)
  k_pos, k_seg = _with_previous_chunk(q_pos), _with_previous_chunk(q_seg)
  k_valid = _with_previous_chunk(sorted_per_head(valid))
  q_bucket = by_chunk(sorted_buckets)
  k_bucket = _with_previous_chunk(q_bucket)

  num_chunks = rounds * n // chunk_len
  has_previous = (jnp.arange(num_chunks) % (n // chunk_len)) > 0         # [c]
  own_or_previous = jnp.concatenate(
      [jnp.ones((num_chunks, chunk_len), bool),
       jnp.broadcast_to(has_previous[:, None], (num_chunks, chunk_len))], axis=1)  # [c, 2m]

  flat = lambda a: a.reshape(batch * heads * num_chunks, *a.shape[3:])  # noqa: E731
  allowed = causal_document_mask(flat(q_pos), flat(q_seg), flat(k_pos), flat(k_seg),
                                 flat(k_valid), causal=causal)
  allowed = allowed.reshape(batch, heads, num_chunks, chunk_len, 2 * chunk_len)
  allowed &= q_bucket[..., :, None] == k_bucket[..., None, :]
  allowed &= own_or_previous[:, None, :]
  is_self = ((q_pos[..., :, None] == k_pos[..., None, :])
             & (q_seg[..., :, None] == k_seg[..., None, :]))

  logits = jnp.einsum('bhcqd,bhckd->bhcqk', q, k).astype(jnp.float32)
  if logit_scale == 'inverse_sqrt_head_dim':
    logits = logits / jnp.sqrt(jnp.float32(head_dim))
  logits = jnp.where(is_self, SELF_LOGIT, logits)
  logits = jnp.where(allowed, logits, -jnp.inf)
  weights, lse = _softmax_and_logsumexp(logits, axis=-1)                # lse [b, h, c, m]
  out = jnp.einsum('bhcqk,bhckd->bhcqd', weights, values.astype(jnp.float32))

  # Back to token order.
  out = permute_rows(out.reshape(batch, heads, rounds * n, head_dim), undo, source)
  out = out.reshape(batch, heads, rounds, n, head_dim)
  lse = permute_rows(lse.reshape(shape), undo, source).reshape(batch, heads, rounds, n)

  # Combine rounds by their log-sum-exp (a softmax over the union of key sets).
  round_weights, _ = _softmax_and_logsumexp(lse, axis=2)               # [b, h, rounds, n]
  combined = jnp.sum(round_weights[..., None] * out, axis=2)          # [b, h, n, d]
  return jnp.swapaxes(combined, 1, 2).astype(v.dtype)


class LSHAttention(nn.Module):
  """`__call__(x [b, c, d_model], {}, ctx) -> (y [b, c, d_model], {}, {})`; stateless.

  Settings: `model.lsh` (`LSHConfig`) and the shared `model.causal`.
  """
  Config = LSHConfig
  reads_mem_len = False           # stateless: attends within the chunk

  num_heads: int
  head_dim: int
  d_model: int
  num_hashes: int = 2
  num_buckets: int = 8
  chunk_len: int = 64
  seed: int = 0
  rotations_per_step: bool = False
  rotary: bool = True
  causal: bool = True
  logit_scale: str = 'inverse_sqrt_head_dim'
  dtype: jnp.dtype = jnp.float32

  @classmethod
  def from_config(cls, config: ml_collections.ConfigDict, dtype, name=None):
    section = config.lsh
    return cls(num_heads=config.num_heads, head_dim=config.head_dim, d_model=config.d_model,
               num_hashes=section.num_hashes, num_buckets=section.num_buckets,
               chunk_len=section.chunk_len, seed=section.seed,
               rotations_per_step=section.rotations_per_step, rotary=section.rotary,
               causal=config.causal, logit_scale=section.logit_scale, dtype=dtype, name=name)

  @staticmethod
  def init_state(config: ml_collections.ConfigDict, batch_size: int, dtype=jnp.float32):
    """Stateless: LSH attends within the chunk."""
    return {}

  def rotation_key(self, ctx: AttentionContext) -> jax.Array:
    """Fixed per layer (config seed, module path), or fresh per training step."""
    if self.rotations_per_step and not ctx.deterministic:
      return self.make_rng('dropout')
    path = '/'.join(str(part) for part in self.scope.path)
    return jax.random.fold_in(jax.random.PRNGKey(self.seed), zlib.crc32(path.encode()))

  @nn.compact
  def __call__(self, x: jax.Array, state, ctx: AttentionContext):
    qk = cached_context.project_heads(x, self.num_heads, self.head_dim, 'query_key', self.dtype)
    v = cached_context.project_heads(x, self.num_heads, self.head_dim, 'value', self.dtype)
    if self.rotary:
      qk = apply_rotary(qk, ctx.positions - ctx.positions[:, :1])
    rotations = random_rotations(self.rotation_key(ctx), self.num_heads, self.head_dim,
                                 self.num_hashes, self.num_buckets)
    out = lsh_attention(qk, v, ctx.positions, ctx.segment_ids, ctx.valid, rotations,
                        chunk_len=min(self.chunk_len, x.shape[1]), causal=self.causal,
                        logit_scale=self.logit_scale)
    out = nn.with_logical_constraint(out, ('batch', 'length', 'heads', 'head_dim'))
    return cached_context.project_output(out, self.d_model, self.dtype), state, {}
