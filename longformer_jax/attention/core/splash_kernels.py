"""Splash attention (Pallas block-sparse flash attention) with the project's masks.

`splash_attention(q, k, v, ...)` computes, for queries and keys of ONE chunk
(self-attention, no memory),

  out_i = sum_j softmax_j(q_i . k_j | allowed(i, j)) v_j,
  allowed(i, j) = valid_j & seg_i == seg_j & -left <= (p_j - p_i) <= right,

exactly what `dot_product.attend` computes with the dense mask
`masking.causal_document_mask` (plus a window): causal is `right = 0`,
bidirectional is `left = right = None` (unbounded), the Longformer's one-sided
window w is `(w, 0)` causal and `(w, w)` two-sided, a StreamingLLM window of
the w most recent tokens is `(w - 1, 0)`.

More generally `splash_attention(..., mask=rule)` takes, instead of the
window, a hashable rule on slot ids (`allowed(i, j) = valid_j & seg_i == seg_j
& rule(i, j)`): `Window(left, right)` (the above), the Longformer's
`DilatedWindow(left, right, dilation)`, the Sparse Transformer's
`Strided(l, 'local' | 'summary')` and `Fixed(l, 'local' | 'summary', c)`, the
Image Transformer's local 1D `BlockLocal(query_len, memory_len)`, a `Union` of
rules, BigBird's static block pattern (attention/bigbird/splash.py), or a tuple of one
rule per head (a `MultiHeadMask` with different heads). A window becomes the package's `LocalMask` (or `FullMask`); every other
rule a `RuleMask`, a `_ComputableMask` whose mask function is the rule, so no
n x n array is built: the kernel evaluates the rule in-kernel on each block
when every head has the same rule, and with different heads loads the few
distinct partial blocks, which the package finds block by block when the
kernel is built (attention/sparse_transformer/splash.py,
attention/image_local/splash.py). A rule that looks up a table
(`in_kernel = False`: BigBird's random blocks) becomes a `LoadedRuleMask`,
whose partial blocks are always loaded.

How each rule reaches the kernel (`jax.experimental.pallas.ops.tpu.splash_attention`):
- the window and causal rules are its static `LocalMask` on array slots. They
  equal the rules on positions (docs/design.md, contract 2) because positions
  are consecutive along a chunk (`p_j - p_i = j - i`; stream batches and encoder
  contexts build them so), which is the one precondition of this path;
- documents are its segment ids (a key of another document has another id);
- padding is a segment id too: an invalid key gets an id no query has
  (one below the row's smallest id), so no query ever sees it;
- a query with no allowed key (a padding query before any valid key of its
  document) gives 0, like the dense reference: a constant "sink" logit of
  -1e30 starts every row's running max (the kernel's `sinks`), so it adds
  exp(-1e30 - m) = 0 to every non-empty row and turns an empty row's
  denominator into 1 over a numerator of 0 (values of masked keys are
  weighted by exp(mask_value + 1e30) = 0). The backward pass sees the same
  log-sum-exp, so gradients of empty rows are 0 as well.

Block sizes: the kernel needs query and key blocks that are multiples of 128
(`NUM_LANES`) and sequence lengths that are multiples of the blocks. Any chunk
length works here: q, k, v are padded at the end to a multiple of 128 with
keys no query sees (padding segment id), and the padded queries are dropped,
so lengths below 128 are exact but waste compute (the block is the largest of
512, 256, 128 dividing the padded length).

The caller scales the queries (the kernel does not). On TPU the kernel is
compiled by Mosaic; elsewhere it runs in Pallas interpret mode (the tests on
CPU), with the same numerics up to float32 rounding.
"""

import dataclasses
import functools
from typing import Optional

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_kernel as splash
from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_mask as splash_mask

LANES = splash.NUM_LANES                 # 128: every block is a multiple of this
BLOCK_CHOICES = (512, 256, LANES)        # largest first
EMPTY_ROW_SINK = -1e30                   # see the module docstring: empty rows give 0


def padded_length(length: int) -> int:
  """`length` rounded up to a multiple of 128 (the kernel's lane width)."""
  return -(-length // LANES) * LANES


def block_size(padded: int) -> int:
  """The largest of 512, 256, 128 dividing `padded` (a multiple of 128)."""
  return next(b for b in BLOCK_CHOICES if padded % b == 0)


@dataclasses.dataclass(frozen=True)
class Window:
  """Keys at slot offsets `-left..right` from the query (None: unbounded on that side).

  Causal is `Window(None, 0)`, bidirectional `Window(None, None)`; the Longformer's
  one-sided window w is `Window(w, 0)` (causal) or `Window(w, w)` (two-sided).
  """
  left: Optional[int] = None
  right: Optional[int] = 0

  def allows(self, q_ids, kv_ids):
    allowed = (q_ids >= 0) & (kv_ids >= 0)       # all True, in the inputs' array type
    if self.left is not None:
      allowed = allowed & (kv_ids >= q_ids - self.left)
    if self.right is not None:
      allowed = allowed & (kv_ids <= q_ids + self.right)
    return allowed


@dataclasses.dataclass(frozen=True)
class DilatedWindow:
  """The Longformer's dilated window on slots: offsets `-left..right` from the query that are
  multiples of `dilation` (sliding_window.py's rule: `(i - j) % d == 0`, written
  `i % d == j % d` on non-negative slot ids). The layer's one-sided window w with dilation d
  is `DilatedWindow(w * d, 0, d)` (causal) or `DilatedWindow(w * d, w * d, d)` (two-sided).
  """
  left: int
  right: int
  dilation: int

  def allows(self, q_ids, kv_ids):
    return ((kv_ids >= q_ids - self.left) & (kv_ids <= q_ids + self.right)
            & (q_ids % self.dilation == kv_ids % self.dilation))


def dilated_window_rules(window: int, head_dilations: tuple, causal: bool) -> tuple:
  """One rule per head of a Longformer layer: `Window` for dilation 1, else `DilatedWindow`."""
  def rule(d):
    if d == 1:
      return Window(window, 0 if causal else window)
    return DilatedWindow(window * d, 0 if causal else window * d, d)
  return tuple(rule(d) for d in head_dilations)


@dataclasses.dataclass(frozen=True)
class Strided:
  """Sparse Transformer strided components (Child et al. 2019), stride l.

  Causal: `local` 0 <= i - j < l (the previous l slots, self included);
  `summary` j <= i and (i - j) % l == 0, written i % l == j % l (non-negative operands).
  Bidirectional (`causal=False`, the same rules mirrored): `local` |i - j| < l;
  `summary` (i - j) % l == 0.
  """
  stride: int
  component: str              # 'local' | 'summary'
  causal: bool = True

  def allows(self, q_ids, kv_ids):
    if self.component == 'local':
      allowed = (kv_ids > q_ids - self.stride) & (kv_ids < q_ids + self.stride)
    elif self.component == 'summary':
      allowed = q_ids % self.stride == kv_ids % self.stride
    else:
      raise ValueError(f'unknown strided component {self.component!r}')
    return allowed & (kv_ids <= q_ids) if self.causal else allowed


@dataclasses.dataclass(frozen=True)
class Fixed:
  """Sparse Transformer fixed components, block length l, summary length c.

  `local`: j // l == i // l (the query's own block); `summary`: j % l >= l - c (the last
  c slots of every block); causal adds j <= i, bidirectional (`causal=False`) does not.
  """
  stride: int
  component: str              # 'local' | 'summary'
  summary_len: int = 1
  causal: bool = True

  def allows(self, q_ids, kv_ids):
    if self.component == 'local':
      allowed = q_ids // self.stride == kv_ids // self.stride
    elif self.component == 'summary':
      allowed = (q_ids >= 0) & (kv_ids % self.stride >= self.stride - self.summary_len)
    else:
      raise ValueError(f'unknown fixed component {self.component!r}')
    return allowed & (kv_ids <= q_ids) if self.causal else allowed


@dataclasses.dataclass(frozen=True)
class BlockLocal:
  """Image Transformer local 1D: query block of `query_len` slots sees its own block and
  the `memory_len` slots before it, causally: j <= i and j >= (i // lq) * lq - lm.
  Bidirectional (`causal=False`): its own block and the `memory_len` slots before and
  after it, all of them: (i // lq) * lq - lm <= j < (i // lq) * lq + lq + lm."""
  query_len: int
  memory_len: int
  causal: bool = True

  def allows(self, q_ids, kv_ids):
    first = (q_ids // self.query_len) * self.query_len - self.memory_len
    if self.causal:
      return (kv_ids <= q_ids) & (kv_ids >= first)
    return (kv_ids >= first) & (kv_ids < first + 2 * self.memory_len + self.query_len)


@dataclasses.dataclass(frozen=True)
class Union:
  """A key is allowed when any part allows it (one softmax over the union)."""
  parts: tuple

  def allows(self, q_ids, kv_ids):
    allowed = self.parts[0].allows(q_ids, kv_ids)
    for part in self.parts[1:]:
      allowed = allowed | part.allows(q_ids, kv_ids)
    return allowed


class RuleMask(splash_mask._ComputableMask):
  """A splash mask computed from a rule (`Window`, `Strided`, ...) on slot ids.

  `mask_function(q_ids, kv_ids)` is the rule: the kernel evaluates it in-kernel
  on each block (no mask array) when every head has the same mask; the block
  sparsity (which blocks are empty, full or partial) is found by evaluating it
  block by block in numpy when the kernel is built, never an n x n array at once.
  """

  def __init__(self, shape: tuple, rule):
    self.rule = rule
    super().__init__(shape=shape, mask_function=rule.allows)

  def __eq__(self, other: object):
    return (isinstance(other, RuleMask) and self.shape == other.shape
            and self.rule == other.rule)

  def __hash__(self):
    return hash((RuleMask, self.shape, self.rule))


class LoadedRuleMask(splash_mask.Mask):
  """A splash mask from a rule that the kernel cannot evaluate in-kernel (it looks up a
  static table, e.g. BigBird's random blocks: rules with `in_kernel = False`).

  The package evaluates it block by block in numpy when the kernel is built and loads
  the distinct partial blocks; no n x n array is built at once.
  """

  def __init__(self, shape: tuple, rule):
    self._shape = shape
    self.rule = rule

  @property
  def shape(self) -> tuple:
    return self._shape

  def __getitem__(self, idx) -> np.ndarray:
    q_slice, kv_slice = idx
    rows = np.arange(self._shape[0])[q_slice]
    cols = np.arange(self._shape[1])[kv_slice]
    return np.asarray(self.rule.allows(rows[:, None], cols[None, :]))

  def __eq__(self, other: object):
    return (isinstance(other, LoadedRuleMask) and self.shape == other.shape
            and self.rule == other.rule)

  def __hash__(self):
    return hash((LoadedRuleMask, self.shape, self.rule))


def head_mask(length: int, rule) -> splash_mask.Mask:
  """The splash mask of one head for a padded chunk of `length` slots."""
  if isinstance(rule, Window):
    if rule.left is None and rule.right is None:   # LocalMask would capture a constant block
      return splash_mask.FullMask((length, length))
    return splash_mask.LocalMask((length, length), window_size=(rule.left, rule.right),
                                 offset=0)
  if not getattr(rule, 'in_kernel', True):
    return LoadedRuleMask((length, length), rule)
  return RuleMask((length, length), rule)


def head_rules(mask, num_heads: int) -> tuple:
  """One rule for every head: a single rule is shared, a tuple gives one per head."""
  rules = tuple(mask) if isinstance(mask, (tuple, list)) else (mask,) * num_heads
  if len(rules) != num_heads:
    raise ValueError(f'{len(rules)} head masks for {num_heads} heads')
  return rules


@functools.lru_cache(maxsize=64)
def _kernel(length: int, rules: tuple, interpret: bool):
  """The splash kernel for `[heads, length, head_dim]` inputs, one rule per head (cached)."""
  block = block_size(length)
  sizes = splash.BlockSizes(block_q=block, block_kv=block, block_kv_compute=block,
                            block_q_dkv=block, block_kv_dkv=block, block_kv_dkv_compute=block,
                            use_fused_bwd_kernel=True)
  masks = splash_mask.MultiHeadMask([head_mask(length, rule) for rule in rules])
  # Concrete (not traced) mask metadata, so the cached kernel can serve any trace.
  with jax.ensure_compile_time_eval():
    return splash.make_splash_mha(masks, block_sizes=sizes, head_shards=1, q_seq_shards=1,
                                  interpret=interpret)


def default_interpret() -> bool:
  """Compiled on TPU, Pallas interpret mode on every other platform."""
  return jax.default_backend() != 'tpu'


def splash_attention(q: jax.Array, k: jax.Array, v: jax.Array, segment_ids: jax.Array,
                     valid: jax.Array, *, left: Optional[int] = None,
                     right: Optional[int] = 0, mask=None,
                     interpret: Optional[bool] = None) -> jax.Array:
  """Masked softmax attention within one chunk through the splash kernel.

  Args:
    q: `[batch, chunk, heads, head_dim]`, already scaled (e.g. by 1/sqrt(head_dim)).
    k, v: `[batch, chunk, heads, head_dim]`, the same chunk's keys and values.
    segment_ids: `[batch, chunk]` int32 document ids of the chunk's tokens.
    valid: `[batch, chunk]` bool, the key is real (not padding).
    left, right: the window, keys at slot offsets `-left..right` from the
      query (None: unbounded on that side); causal is `right = 0`. Used when
      `mask` is None (`Window(left, right)`).
    mask: a rule on slot ids (`Window`, `DilatedWindow`, `Strided`, `Fixed`,
      `BlockLocal`, `Union`, bigbird_splash's `BigBirdBlocks`) shared by every head, or a tuple of one rule per head.
    interpret: Pallas interpret mode (None: off on TPU only).
  Returns:
    `[batch, chunk, heads, head_dim]` in q's dtype; rows with no allowed key are 0.
  """
  batch, chunk, heads, _ = q.shape
  interpret = default_interpret() if interpret is None else interpret
  length = padded_length(chunk)
  pad = length - chunk
  absent = jnp.min(segment_ids, axis=1, keepdims=True) - 1          # no query has it
  in_chunk = jnp.arange(length) < chunk
  q_segments = jnp.where(in_chunk, jnp.pad(segment_ids, ((0, 0), (0, pad))), absent)
  kv_segments = jnp.where(in_chunk & jnp.pad(valid, ((0, 0), (0, pad))),
                          jnp.pad(segment_ids, ((0, 0), (0, pad))), absent)
  to_heads_major = lambda a: jnp.pad(a, ((0, 0), (0, pad), (0, 0), (0, 0))).transpose(0, 2, 1, 3)
  rules = head_rules(Window(left, right) if mask is None else mask, heads)
  kernel = _kernel(length, rules, bool(interpret))
  sinks = jnp.full((heads,), EMPTY_ROW_SINK, jnp.float32)

  def one_row(q_row, k_row, v_row, q_seg, kv_seg):
    return kernel(q_row, k_row, v_row, splash.SegmentIds(q=q_seg, kv=kv_seg), sinks)

  out = jax.vmap(one_row)(to_heads_major(q), to_heads_major(k), to_heads_major(v),
                          q_segments, kv_segments)                   # [b, h, length, d]
  return out.transpose(0, 2, 1, 3)[:, :chunk]
