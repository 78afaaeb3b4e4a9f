"""BP-Transformer attention (Ye et al., 2019): fine-to-coarse attention over a binary partition.

Within the chunk (stateless). The chunk is padded to N = 2^m slots and
partitioned by a perfect binary tree: node (l, p) at level l spans the slots
[p 2^l, (p + 1) 2^l); level 0 holds the tokens. Positions are relative to the
chunk's first token (consecutive along the chunk, as in block_sparse.py).

Contextual edges (section 3): token i attends to, with the paper's k,

  level 0   the tokens j with |i - j| <= k (causal: 0 <= i - j <= k), itself included;
  level l   the k nearest nodes on each side (causal: on the left) whose spans are not
            inside what the finer levels cover: with [A, B] the chunk's tokens covered
            by levels < l, the nodes with a token left of A or right of B, nearest
            first; A and B then grow to the taken nodes' spans.

Spans count the chunk's n tokens only, not the slots padded up to N. On the
left, in node units: lo_0 = i - k, hi_l = ceil(lo_{l-1} / 2), nodes hi_l - k ..
hi_l - 1, lo_l = hi_l - k; on the right, in tokens: B_0 = min(i + k, n - 1),
st_l = floor((B_{l-1} + 1) / 2^l), nodes st_l .. st_l + k - 1 (none once
B = n - 1), B_l = min((st_l + k) 2^l - 1, n - 1). `neighbour_graph`
evaluates this with array arithmetic for all tokens at once, as indices
`[n, num_neighbours]` into [tokens; nodes]: (2k + 1) + 2k L neighbours per token
(causal: k + 1 + k L) for L = min(num_levels, ceil(log2 n)) levels, so the cost
is O(n k log n) and no n x n array is built. A node may overlap the finer
levels by one child (the tree's spans are aligned, the fine window is not). A
causal token only sees nodes whose spans end at or before it (true by
construction, and masked by the rule span end <= query position on top).
`bp_transformer_attention` reads the graph on one of three paths with the same
result: grouped (bp_transformer_grouped.py: the queries of a level in groups
that share their nodes), gathered (each token's neighbours gathered), or dense
(every token over all of [tokens; nodes] under the graph as a mask: O(n^2),
but plain matmuls, the fastest on the CPU up to 256 tokens). The layer takes
the dense path for chunks of at most `dense_max_len` tokens and the grouped
one beyond (docs/benchmarks.md times the three).

Node representations (affiliated edges, section 3): a node's initial
representation is the mean of the inputs of its valid tokens; as the
projections are linear, its query, key and value are the means of its tokens'
queries, keys and values. The node then attends to its two children (their
initial keys and values; the children of a level-1 node are tokens), and the
result is the node's value; its key stays the mean key. One such step per
layer (the paper's graph updates every node in every layer; here the stack
carries only the token states, so the nodes are rebuilt from each layer's
input).

Relative positions (section 3): a learned key r[l, o] per level l and
relative offset o (level 0: o = j - i in [-k, k]; level l: the node's rank
+-1 .. +-k on its side, nearest first) is added to the neighbour's key:
logit = q_i . (k_u + r[l, o]) (the paper's relative position representation).

Documents and padding: a node is used only when all of its valid tokens belong
to one document; a node mixing documents (or holding padding only) is masked
for every query. Tokens and nodes of another document are masked (contract 2).

Settings: `config.model.bp_transformer` (`BPTransformerConfig`).
"""

import dataclasses
from typing import NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from longformer_jax.attention import bp_transformer_grouped
from longformer_jax.attention.core import block_sparse, projections
from longformer_jax.attention.context import AttentionContext
from longformer_jax.attention.shared_settings import SharedSettings
from longformer_jax.attention.core.dot_product import masked_softmax
from longformer_jax.config.section import Section


@dataclasses.dataclass(frozen=True)
class BPTransformerConfig(Section):
  """`config.model.bp_transformer`; causal or bidirectional is the shared `model.causal`."""
  k: int = 4                      # the paper's k: tokens on each side, and nodes per level and side
  num_levels: int = 8             # coarsest level used: spans of up to 2^num_levels tokens
  dense_max_len: int = 256        # chunks up to this long attend densely over [tokens; nodes]

  def validate(self, env) -> None:
    self.require(self.k >= 1, 'k', 'must be >= 1')
    self.require(0 <= self.num_levels <= 30, 'num_levels', 'must be in [0, 30]')
    self.require(self.dense_max_len >= 0, 'dense_max_len',
                 'must be >= 0 (0: always the grouped path)')


class Graph(NamedTuple):
  """Token i's neighbours, each `[n, num_neighbours]`: level, node index, offset, present."""
  level: np.ndarray
  node: np.ndarray
  offset: np.ndarray
  present: np.ndarray


def tree_levels(n: int, num_levels: int) -> int:
  """Levels above the tokens: min(num_levels, ceil(log2 n))."""
  return min(num_levels, max(0, (n - 1).bit_length()))


def neighbour_graph(n: int, k: int, num_levels: int, causal: bool) -> Graph:
  """Contextual edges of every token (module docstring), by array arithmetic over tokens."""
  i = np.arange(n)[:, None]
  columns = []

  def add(level, node, offset, present):
    node = np.broadcast_to(node, present.shape)
    columns.append((np.full(present.shape, level), np.where(present, node, 0),
                    np.broadcast_to(offset, present.shape), present))

  fine = np.arange(-k, 1 if causal else k + 1)[None]
  add(0, i + fine, fine, (i + fine >= 0) & (i + fine < n))
  rank = np.arange(1, k + 1)[None]
  lo = i - k                      # left: first covered node of the level below
  last = np.minimum(i + k, n - 1)  # right: last covered real token
  for level in range(1, tree_levels(n, num_levels) + 1):
    hi = -(-lo // 2)                                        # ceil(lo / 2)
    add(level, hi - rank, -rank, hi - rank >= 0)
    lo = hi - k
    if not causal:
      st = (last + 1) >> level                              # first node ending after `last`
      count = -(-n // 2 ** level)                           # nodes holding a real token
      add(level, st + rank - 1, rank, (st + rank - 1 < count) & (last < n - 1))
      last = np.minimum((st + k) * 2 ** level - 1, n - 1)
  return Graph(*(np.concatenate([c[f] for c in columns], axis=1) for f in range(4)))


def num_offsets(k: int) -> int:
  return 2 * k + 1


class TreeNodes(NamedTuple):
  """[tokens; level-1 nodes; level-2 nodes; ...] of a chunk padded to N = 2^m slots.

  keys, values: `[batch, N + nodes, heads, head_dim]`; ok (usable: real tokens of
  one document), segments and end (relative position of the span's last slot):
  `[batch, N + nodes]`; starts: `[levels + 1]` numpy, where each level begins;
  level_keys, level_values: the same keys and values per level, level l
  `[batch, N / 2^l, heads, head_dim]` (the grouped path reads them unjoined, so
  that their gradients are not summed back through one padded array).
  """
  keys: jax.Array
  values: jax.Array
  ok: jax.Array
  segments: jax.Array
  end: jax.Array
  starts: np.ndarray
  level_keys: tuple
  level_values: tuple


def tree_nodes(q: jax.Array, k: jax.Array, v: jax.Array, positions: jax.Array,
               segment_ids: jax.Array, valid: jax.Array, levels: int) -> TreeNodes:
  """The tokens and the span nodes of levels 1..`levels`, with their keys and values.

  Args:
    q, k, v: `[batch, n, heads, head_dim]`, q already scaled by 1/sqrt(head_dim).
    positions, segment_ids, valid: `[batch, n]`; positions consecutive along the chunk.
  """
  b, n = q.shape[:2]
  padded = 2 ** max(0, (n - 1).bit_length())
  rel, seg, ok = block_sparse.blocked_context(positions, segment_ids, valid, padded)
  q, k, v = (block_sparse.pad_length(a, padded) for a in (q, k, v))
  weight = ok.astype(jnp.float32)[..., None, None]
  big = jnp.iinfo(jnp.int32).max
  # Level by level: sums and counts of real tokens, the least and greatest document id.
  sums = [tuple(a.astype(jnp.float32) * weight for a in (q, k, v))]
  counts = [ok.astype(jnp.float32)]
  seg_lo, seg_hi = [jnp.where(ok, seg, big)], [jnp.where(ok, seg, -big)]
  keys, values, usable, segments, end = [k], [v], [ok], [seg], [rel]
  pair = lambda a: a.reshape(b, a.shape[1] // 2, 2, *a.shape[2:])     # children of each node
  mean = lambda s, c: (s / jnp.maximum(c, 1.0)[..., None, None]).astype(q.dtype)
  for level in range(1, levels + 1):
    sums.append(tuple(jnp.sum(pair(a), axis=2) for a in sums[-1]))
    counts.append(jnp.sum(pair(counts[-1]), axis=2))
    seg_lo.append(jnp.min(pair(seg_lo[-1]), axis=2))
    seg_hi.append(jnp.max(pair(seg_hi[-1]), axis=2))
    # Initial representation: the mean over real tokens (of q, k, v: projections are linear).
    node_q, node_k = (mean(s, counts[-1]) for s in sums[-1][:2])
    child_k, child_v = ((mean(s, counts[-2]) for s in sums[-2][1:]) if level > 1 else (k, v))
    # Affiliated edges: the node attends to its two children; the result is its value.
    logits = jnp.einsum('bphd,bpchd->bhpc', node_q, pair(child_k))
    weights = masked_softmax(logits, pair(counts[-2] > 0)).astype(v.dtype)
    values.append(jnp.einsum('bhpc,bpchd->bphd', weights, pair(child_v)))
    keys.append(node_k)
    usable.append((counts[-1] > 0) & (seg_lo[-1] == seg_hi[-1]))
    segments.append(seg_lo[-1])
    end.append(rel[:, 2 ** level - 1::2 ** level])
  join = lambda parts: jnp.concatenate(parts, axis=1)
  starts = np.cumsum([0] + [padded >> level for level in range(levels)])
  return TreeNodes(join(keys), join(values), join(usable), join(segments), join(end), starts,
                   tuple(keys), tuple(values))


def graph_index(graph: Graph, starts: np.ndarray) -> np.ndarray:
  """`[n, m]` indices of the neighbours in [tokens; level 1; level 2; ...]."""
  return starts[graph.level] + graph.node


def relative_index(graph: Graph, radius: int) -> np.ndarray:
  """`[n, m]` row of r[l, o] in `rel_keys` flattened over (level, offset)."""
  return graph.level * num_offsets(radius) + graph.offset + radius


PATHS = ('grouped', 'gathered', 'dense')


def bp_transformer_attention(q: jax.Array, k: jax.Array, v: jax.Array, rel_keys: jax.Array,
                             positions: jax.Array, segment_ids: jax.Array, valid: jax.Array, *,
                             radius: int, num_levels: int, causal: bool,
                             path: str = 'grouped') -> jax.Array:
  """Token attention over the binary-partition graph.

  Three paths give the same result:
  - 'grouped' (bp_transformer_grouped.py): a level's queries in groups of 2^l that
    share their nodes, one small matmul per group: O(n k log n) work, and the keys
    read per level fall with 2^l; the long-chunk default.
  - 'gathered': each token gathers its `[n, m]` neighbours' keys and values, O(n k
    log n) but `[batch, n, m, heads, head_dim]` arrays and a scatter-add backward;
    kept as the plain reading of the graph that the other two are checked against.
  - 'dense': every token over all of [tokens; nodes] (about 2n columns) with the
    graph as a mask: O(n^2) plain matmuls, the fastest for short chunks
    (`BPTransformerConfig.dense_max_len`).
  docs/benchmarks.md times the three against chunk length.

  Args:
    q, k, v: `[batch, n, heads, head_dim]`, q already scaled by 1/sqrt(head_dim).
    rel_keys: `[num_levels + 1, 2 radius + 1, heads, head_dim]`: r[l, o + radius].
    positions, segment_ids, valid: `[batch, n]`; positions consecutive along the chunk.
    radius: the paper's k. num_levels: coarsest level used. causal: edges to the left only.
    path: one of `PATHS`.
  Returns:
    `[batch, n, heads, head_dim]`; a query with no allowed neighbour gives zeros.
  """
  if path not in PATHS:
    raise ValueError(f'path must be one of {PATHS}, not {path!r}')
  n = q.shape[1]
  nodes = tree_nodes(q, k, v, positions, segment_ids, valid, tree_levels(n, num_levels))
  graph = neighbour_graph(n, radius, num_levels, causal)
  index = graph_index(graph, nodes.starts)
  q_rel = (positions - positions[:, :1])[:, :, None]
  flat = rel_keys.reshape(-1, *rel_keys.shape[2:])
  relative = relative_index(graph, radius)
  if path == 'dense':
    return _dense_graph_attention(q, nodes, graph, index, relative, flat, q_rel, segment_ids,
                                  causal)
  # r[l, o] is one row per column: a column's level and offset do not depend on the token.
  assert (relative == relative[:1]).all(), 'a column mixes relative offsets'
  columns = slice(None)
  if path == 'grouped':
    blocks = bp_transformer_grouped.column_blocks(graph.level, graph.node, graph.present,
                                                  radius, causal)
    grouped_plan = bp_transformer_grouped.plan(blocks, n)
    columns = grouped_plan.columns                   # the graph's columns in the plan's order
  index = jnp.asarray(index[:, columns])
  gather = lambda a: a[:, index]                                        # [batch, n, m, ...]
  mask = (jnp.asarray(graph.present[:, columns])[None] & gather(nodes.ok)
          & (gather(nodes.segments) == segment_ids[:, :, None]))
  if causal:
    mask &= gather(nodes.end) <= q_rel
  column_offsets = flat[jnp.asarray(relative[0, columns])].astype(q.dtype)        # [m, h, d]
  if path == 'grouped':   # [batch, n, heads, m]: the layout of the groups' products, no transpose
    logits = (bp_transformer_grouped.grouped_logits(q, nodes.level_keys, grouped_plan)
              + jnp.einsum('bnhd,mhd->bnhm', q, column_offsets))
    weights = masked_softmax(logits, mask[:, :, None]).astype(v.dtype)
    return bp_transformer_grouped.grouped_values(weights, nodes.level_values, grouped_plan)
  logits = (jnp.einsum('bnhd,bnmhd->bhnm', q, gather(nodes.keys))
            + jnp.einsum('bnhd,mhd->bhnm', q, column_offsets))
  weights = masked_softmax(logits, mask).astype(v.dtype)
  return jnp.einsum('bhnm,bnmhd->bnhd', weights, gather(nodes.values))


def _dense_graph_attention(q: jax.Array, nodes: TreeNodes, graph: Graph, index: np.ndarray,
                           relative: np.ndarray, flat_rel_keys: jax.Array, q_rel: jax.Array,
                           segment_ids: jax.Array, causal: bool) -> jax.Array:
  """`bp_transformer_attention`'s dense path: the graph scattered (in numpy, once) into an
  `[n, width]` mask and relative-key index over the `width` columns of [tokens; nodes]."""
  n, width = q.shape[1], nodes.keys.shape[1]
  rows = np.broadcast_to(np.arange(n)[:, None], index.shape)[graph.present]
  columns = index[graph.present]
  allowed = np.zeros((n, width), bool)
  allowed[rows, columns] = True
  assert allowed.sum() == graph.present.sum(), 'a token reaches one column twice'
  relative_dense = np.zeros((n, width), np.int32)
  relative_dense[rows, columns] = relative[graph.present]
  mask = (jnp.asarray(allowed)[None] & nodes.ok[:, None, :]
          & (nodes.segments[:, None, :] == segment_ids[:, :, None]))
  if causal:
    mask &= nodes.end[:, None, :] <= q_rel
  # q_i . r[l, o] for every (level, offset) row, then picked per column: [b, h, n, width].
  by_offset = jnp.einsum('bnhd,rhd->bhnr', q, flat_rel_keys.astype(q.dtype))
  logits = (jnp.einsum('bnhd,bwhd->bhnw', q, nodes.keys)
            + jnp.take_along_axis(by_offset, jnp.asarray(relative_dense)[None, None], axis=-1))
  weights = masked_softmax(logits, mask).astype(nodes.values.dtype)
  return jnp.einsum('bhnw,bwhd->bnhd', weights, nodes.values)


class BPTransformerAttention(nn.Module):
  """`__call__(x [b, c, d_model], state {}, ctx) -> (y [b, c, d_model], {}, {})`.

  Fields: `config` (`BPTransformerConfig`, the layer's `model.bp_transformer`), `shared`
  (`SharedSettings`: heads, `causal`), `dtype`.
  """
  Config = BPTransformerConfig
  reads_mem_len = False           # stateless: attends within the chunk

  shared: SharedSettings
  config: BPTransformerConfig = BPTransformerConfig()
  dtype: jnp.dtype = jnp.float32

  @staticmethod
  def init_state(config: BPTransformerConfig, shared: SharedSettings, batch_size: int,
                 dtype=jnp.float32):
    """Stateless: attends within the chunk."""
    return {}

  @nn.compact
  def __call__(self, x: jax.Array, state, ctx: AttentionContext):
    config, shared = self.config, self.shared
    q, k, v = projections.chunk_qkv(x, shared.num_heads, shared.head_dim, self.dtype)
    init = nn.with_logical_partitioning(nn.initializers.normal(stddev=0.02),
                                        (None, None, 'heads', 'head_dim'))
    rel_keys = self.param('relative_keys', init, (config.num_levels + 1, num_offsets(config.k),
                                                  shared.num_heads, shared.head_dim), jnp.float32)
    path = 'dense' if x.shape[1] <= config.dense_max_len else 'grouped'
    out = bp_transformer_attention(q, k, v, rel_keys, ctx.positions, ctx.segment_ids, ctx.valid,
                                   radius=config.k, num_levels=config.num_levels,
                                   causal=shared.causal, path=path)
    out = nn.with_logical_constraint(out, ('batch', 'length', 'heads', 'head_dim'))
    return projections.project_output(out, shared.d_model, self.dtype), state, {}
