"""Image Transformer local attention (Parmar et al., 2018, section 3.2): 1D and 2D,
causal (the paper's, for generation) and bidirectional (encoders).

An image is a sequence of intensities: one position per (row, column,
channel), channels innermost, so a row of W pixels of C channels is
`image_width = W * C` positions (the paper treats a 32 x 32 x 3 image as 32 x 96).
Queries are cut into query blocks; every query of a block attends to the
same memory block.

Causal (`model.causal=True`, the paper's form): positions not yet generated
are masked.

- Local 1D (`layout='1d'`): the sequence in raster order, query blocks of
  `query_len` consecutive positions; the memory block of query block i is
  the block itself plus the `memory_len` positions before it (figure 2,
  left).
- Local 2D (`layout='2d'`): the image cut into query blocks of
  `block_height x block_width` positions, generated in *block-raster* order
  (blocks in raster order, raster order inside a block), so the stream the
  model sees is that order (`to_block_raster`; data pipelines reorder the
  pixels, `from_block_raster` undoes it). The memory block extends the query
  block by `flange_height` rows above and `flange_width` columns to the left
  and to the right (figure 2, right); of it, a query sees what was generated
  before it in block-raster order.

Bidirectional (`model.causal=False`, models/encoder.py): the same blocks with
the memory made symmetric, and every query sees its whole memory block (no
causal mask).

- Local 1D: the memory block of query block i is the block plus the
  `memory_len` positions before it and the `memory_len` positions after it.
- Local 2D: the stream is the image in plain *raster* order (row-major, as
  `[height, width]` flattens; no reordering by the data pipeline: an encoder
  generates nothing, so the block-raster order buys nothing). The memory
  block extends the query block by `flange_height` rows above and below and
  `flange_width` columns to the left and to the right, clipped at the image
  border. The queries of a block are gathered from the raster stream by a
  static permutation (`bidirectional_query_order`) and their outputs put back.

Masks come from positions (docs/design.md, contract 2): a key is seen when
it is in the query's document, it is not padding and (causal) its position
is at most the query's. Which slots form a memory block is static (the
pattern is a function of the slot in the chunk), so a chunk must start at a
block boundary (1D) or an image start (2D: `chunk_len` a multiple of
`image_height * image_width`, validated). Stateless: attends within the
chunk, rotary positions as in attention/vanilla/attention.py. Cost
O(n * memory block), never an n x n array: the keys of every query block
are gathered by static indices. With `model.attention_backend` resolving to
splash (TPU under `auto`), the 1D layout, causal or bidirectional, runs as
one splash kernel whose mask is the same block rule
(attention/image_local/splash.py; docs/kernels.md); 2D stays on XLA.
"""

import dataclasses
from typing import Optional

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from longformer_jax.attention.core import attention_backend as backends
from longformer_jax.attention.core.block_sparse_flash import masked_kernel
from longformer_jax.attention.core import projections
from longformer_jax.attention.image_local import splash as image_local_splash
from longformer_jax.attention.context import AttentionContext
from longformer_jax.attention.shared_settings import SharedSettings
from longformer_jax.attention.core.dot_product import masked_softmax
from longformer_jax.config.section import Section

LAYOUTS = ('1d', '2d')


@dataclasses.dataclass(frozen=True)
class ImageLocalConfig(Section):
  """`config.model.image_local`; causal or bidirectional by the shared `model.causal`.

  The stream's order: 1d raster order; 2d causal block-raster order (the data pipeline
  reorders, `to_block_raster`); 2d bidirectional plain raster order (row-major, no
  reordering: a 32 x 32 grey image flattened as `[32, 32]` is read as it is).
  """
  layout: str = '1d'              # 1d: raster | 2d: block-raster (causal), raster (bidirectional)
  query_len: int = 64             # 1d: l_q, positions per query block
  memory_len: int = 64            # 1d: l_m, positions before (and, bidirectional, after) the block
  image_height: int = 8           # 2d: rows of an image
  image_width: int = 8            # 2d: positions per row (pixels x channels)
  block_height: int = 2           # 2d: rows of a query block
  block_width: int = 4            # 2d: positions per row of a query block
  flange_height: int = 2          # 2d: memory rows above (and, bidirectional, below) the block
  flange_width: int = 4           # 2d: memory positions left and right of the query block

  def validate(self, env) -> None:
    self.require(self.layout in LAYOUTS, 'layout', f'must be one of {list(LAYOUTS)}')
    for name in ('query_len', 'image_height', 'image_width', 'block_height', 'block_width'):
      self.require(getattr(self, name) >= 1, name, 'must be >= 1')
    for name in ('memory_len', 'flange_height', 'flange_width'):
      self.require(getattr(self, name) >= 0, name, 'must be >= 0')
    if self.layout == '2d':
      self.require(self.image_height % self.block_height == 0, 'block_height',
                   f'must divide image_height={self.image_height}')
      self.require(self.image_width % self.block_width == 0, 'block_width',
                   f'must divide image_width={self.image_width}')
    if env is None:
      return
    # Causal or not: an encoder's model is made bidirectional after this check
    # (models/resolved_model.encoder_model_config), so no rule here may depend on it.
    if self.layout == '2d':
      image = self.image_height * self.image_width
      bad = [n for n in env.chunk_lens if n % image]
      self.require(not bad, 'image_height',
                   f'2d layout: every chunk length must hold whole images of '
                   f'{self.image_height} x {self.image_width} = {image} positions, '
                   f'got chunk_len {bad[0] if bad else 0}')


def to_block_raster(image: np.ndarray, block_height: int, block_width: int) -> np.ndarray:
  """`[..., height, width]` -> `[..., height * width]` in block-raster order."""
  *lead, height, width = image.shape
  blocks = image.reshape(*lead, height // block_height, block_height,
                         width // block_width, block_width)
  blocks = np.moveaxis(blocks, -3, -2)      # [..., block row, block col, row, col]
  return blocks.reshape(*lead, height * width)


def from_block_raster(stream: np.ndarray, height: int, width: int, block_height: int,
                      block_width: int) -> np.ndarray:
  """The inverse of `to_block_raster`: `[..., height * width]` -> `[..., height, width]`."""
  *lead, _ = stream.shape
  blocks = stream.reshape(*lead, height // block_height, width // block_width,
                          block_height, block_width)
  blocks = np.moveaxis(blocks, -2, -3)      # [..., block row, row, block col, col]
  return blocks.reshape(*lead, height, width)


def local_1d_key_slots(n: int, query_len: int, memory_len: int,
                       memory_after: int = 0) -> np.ndarray:
  """`[num_blocks, memory_len + query_len + memory_after]` key slots of each query block: the
  `memory_len` slots before it, the block, the `memory_after` slots after it (bidirectional:
  `memory_len`); -1 outside [0, n)."""
  num_blocks = -(-n // query_len)
  starts = np.arange(num_blocks)[:, None] * query_len - memory_len
  slots = starts + np.arange(memory_len + query_len + memory_after)[None, :]
  return np.where((slots >= 0) & (slots < n), slots, -1)


def _memory_window_raster(height: int, width: int, block_height: int, block_width: int,
                          rows_above: int, rows_below: int, cols_around: int) -> np.ndarray:
  """`[num_blocks, (rows_above + bh + rows_below) * (bw + 2 cols_around)]` raster positions of
  each query block's memory window (blocks in block-raster order); -1 outside the image."""
  row_offsets = np.arange(-rows_above, block_height + rows_below)
  col_offsets = np.arange(-cols_around, block_width + cols_around)
  out = []
  for block_row in range(height // block_height):
    for block_col in range(width // block_width):
      rows = block_row * block_height + row_offsets[:, None]
      cols = block_col * block_width + col_offsets[None, :]
      inside = (rows >= 0) & (rows < height) & (cols >= 0) & (cols < width)
      out.append(np.where(inside, rows * width + cols, -1).reshape(-1))
  return np.stack(out)


def local_2d_key_slots(height: int, width: int, block_height: int, block_width: int,
                       flange_height: int, flange_width: int) -> np.ndarray:
  """`[num_blocks, (bh + fh) * (bw + 2 fw)]` stream slots (block-raster order) of each
  query block's memory block (the block and its flange); -1 outside the image."""
  stream_of_raster = to_block_raster(np.arange(height * width).reshape(height, width),
                                     block_height, block_width)
  slot_of_raster = np.empty(height * width, np.int64)
  slot_of_raster[stream_of_raster] = np.arange(height * width)
  raster = _memory_window_raster(height, width, block_height, block_width,
                                 flange_height, 0, flange_width)
  return np.where(raster >= 0, slot_of_raster[np.maximum(raster, 0)], -1)


def bidirectional_2d_key_slots(height: int, width: int, block_height: int, block_width: int,
                               flange_height: int, flange_width: int) -> np.ndarray:
  """`[num_blocks, (bh + 2 fh) * (bw + 2 fw)]` raster slots of each query block's bidirectional
  memory block (the block and its flange above, below, left and right), blocks in
  block-raster order; -1 outside the image."""
  return _memory_window_raster(height, width, block_height, block_width,
                               flange_height, flange_height, flange_width)


def _per_image(table: np.ndarray, image: int, n: int) -> np.ndarray:
  """`table` (slots of one image, -1 for none) repeated for the n // image images of a chunk."""
  images = [np.where(table >= 0, table + i * image, -1) for i in range(n // image)]
  return np.concatenate(images)


def _whole_images(n: int, section) -> int:
  image = section.image_height * section.image_width
  if n % image:
    raise ValueError(f'2d local attention: chunk of {n} positions is not whole images of {image}')
  return image


def key_slots(n: int, section, causal: bool = True) -> tuple[np.ndarray, int]:
  """`(key slots [num_blocks, keys], query block length)` of a chunk of n positions.

  Causal 2D slots are in block-raster order; bidirectional 2D slots in raster order, with
  the query blocks' own slots in `bidirectional_query_order`.
  """
  if section.layout == '1d':
    memory_after = 0 if causal else section.memory_len
    return (local_1d_key_slots(n, section.query_len, section.memory_len, memory_after),
            section.query_len)
  image = _whole_images(n, section)
  tables = local_2d_key_slots if causal else bidirectional_2d_key_slots
  per_image = tables(section.image_height, section.image_width, section.block_height,
                     section.block_width, section.flange_height, section.flange_width)
  return _per_image(per_image, image, n), section.block_height * section.block_width


def bidirectional_query_order(n: int, section, causal: bool = True):
  """The raster slots of the query blocks, block after block (`[n]`, a permutation), for the
  bidirectional 2D layout (its stream is in raster order); None when the stream is already
  in query-block order (1D, causal 2D)."""
  if causal or section.layout == '1d':
    return None
  image = _whole_images(n, section)
  raster = np.arange(image).reshape(section.image_height, section.image_width)
  order = to_block_raster(raster, section.block_height, section.block_width)
  return _per_image(order, image, n)


def gathered_local_attention(q: jax.Array, k: jax.Array, v: jax.Array, positions: jax.Array,
                             segment_ids: jax.Array, valid: jax.Array, slots: np.ndarray,
                             query_len: int, *, causal: bool = True,
                             query_order: Optional[np.ndarray] = None) -> jax.Array:
  """Each query block attends to its gathered memory block (causally, or all of it).

  Args:
    q, k, v: `[batch, n, heads, head_dim]`, q already scaled by 1/sqrt(head_dim).
    positions, segment_ids, valid: `[batch, n]`.
    slots: `[num_blocks, keys]` static key slots per query block, -1 for none.
    query_len: query positions per block (the last block may be partial).
    causal: mask keys whose position is after the query's.
    query_order: `[n]` static permutation, the slots of the query blocks block after block
      (`bidirectional_query_order`); None: blocks of consecutive slots.
  Returns:
    `[batch, n, heads, head_dim]`.
  """
  batch, n, heads, head_dim = q.shape
  num_blocks = slots.shape[0]
  padded = num_blocks * query_len
  q_stream, q_positions, q_segments = q, positions, segment_ids
  if query_order is not None:                 # gather the queries into their blocks
    order = jnp.asarray(query_order)
    q_stream, q_positions, q_segments = q[:, order], positions[:, order], segment_ids[:, order]
  pad = lambda a: jnp.pad(a, [(0, 0), (0, padded - n)] + [(0, 0)] * (a.ndim - 2))
  q_blocks = pad(q_stream).reshape(batch, num_blocks, query_len, heads, head_dim)
  q_pos = pad(q_positions).reshape(batch, num_blocks, query_len)
  q_seg = pad(q_segments).reshape(batch, num_blocks, query_len)
  present = jnp.asarray(slots >= 0)
  index = jnp.asarray(np.maximum(slots, 0))
  k_blocks, v_blocks = k[:, index], v[:, index]                  # [b, blocks, keys, h, d]
  k_pos, k_seg = positions[:, index], segment_ids[:, index]       # [b, blocks, keys]
  k_ok = valid[:, index] & present[None]
  if causal:
    mask = ((k_pos[:, :, None, :] <= q_pos[..., None])
            & (k_seg[:, :, None, :] == q_seg[..., None]) & k_ok[:, :, None, :])
  else:                                       # the whole memory block, within the document
    mask = (k_seg[:, :, None, :] == q_seg[..., None]) & k_ok[:, :, None, :]
  logits = jnp.einsum('bnqhd,bnkhd->bhnqk', q_blocks, k_blocks)
  weights = masked_softmax(logits, mask)
  out = jnp.einsum('bhnqk,bnkhd->bnqhd', weights.astype(v.dtype), v_blocks)
  out = out.reshape(batch, padded, heads, head_dim)[:, :n]
  if query_order is not None:                 # back to the stream's order
    out = out[:, jnp.asarray(np.argsort(query_order))]
  return out


class ImageLocalAttention(nn.Module):
  """`__call__(x [b, c, d_model], state {}, ctx) -> (y [b, c, d_model], {}, {})`.

  Fields: `config` (`ImageLocalConfig`, the layer's `model.image_local`), `shared`
  (`SharedSettings`: heads, `attention_backend`, `causal`), `dtype`.
  """
  Config = ImageLocalConfig
  reads_mem_len = False           # stateless: attends within the chunk

  shared: SharedSettings
  config: ImageLocalConfig = ImageLocalConfig()
  dtype: jnp.dtype = jnp.float32

  @staticmethod
  def kernel_pattern(model, section) -> backends.KernelPattern:
    """What a layer with these settings asks of a kernel (config checks)."""
    return image_local_splash.kernel_pattern(model, section)

  @staticmethod
  def init_state(config: ImageLocalConfig, shared: SharedSettings, batch_size: int,
                 dtype=jnp.float32):
    """Stateless: attends within the chunk."""
    return {}

  @nn.compact
  def __call__(self, x: jax.Array, state, ctx: AttentionContext):
    config, shared = self.config, self.shared
    q, k, v = projections.chunk_rotary_qkv(x, ctx, shared.num_heads, shared.head_dim, self.dtype)
    backend = backends.resolve_backend(
        shared.attention_backend, image_local_splash.kernel_pattern(shared, config),
        dtype=jnp.dtype(self.dtype).name, head_dim=shared.head_dim)
    if backend in ('splash', 'pallas_gpu'):   # 1D only; positions consecutive along the chunk
      out = image_local_splash.image_local_1d_splash(
          q, k, v, ctx.segment_ids, ctx.valid, query_len=config.query_len,
          memory_len=config.memory_len, causal=shared.causal,
          kernel=masked_kernel(backend)).astype(self.dtype)
    else:
      n = x.shape[1]
      slots, query_len = key_slots(n, config, shared.causal)
      out = gathered_local_attention(
          q, k, v, ctx.positions, ctx.segment_ids, ctx.valid, slots, query_len,
          causal=shared.causal, query_order=bidirectional_query_order(n, config, shared.causal))
    out = nn.with_logical_constraint(out, ('batch', 'length', 'heads', 'head_dim'))
    return projections.project_output(out, shared.d_model, self.dtype), state, {}
