"""The Sparse Transformer's strided and fixed patterns through the splash kernel.

`sparse_transformer_splash` computes exactly what
`attention/sparse_transformer.sparse_transformer_attention` computes (the
rules of its module docstring, documents and padding on top, 0 for a query
with no allowed key), as one splash kernel (`splash_kernels.py`) whose mask is
a rule on slot ids within the chunk:

  strided_local    0 <= i - j < l                     `Strided(l, 'local')`
  strided_summary  j <= i and i % l == j % l          `Strided(l, 'summary')`
  fixed_local      j <= i and j // l == i // l        `Fixed(l, 'local')`
  fixed_summary    j <= i and j % l >= l - c          `Fixed(l, 'summary', c)`

Bidirectional (`causal=False`, an encoder): the same rules without `j <= i`
(strided_local becomes |i - j| < l), `Strided(..., causal=False)`,
`Fixed(..., causal=False)`.

The module's rules are on positions relative to the chunk's first token; they
equal these rules on slots because positions are consecutive along a chunk
(the splash path's one precondition, splash_kernels.py). Integrations:

- merged (pattern 'strided' or 'fixed'): every head gets the `Union` of the
  two components (one softmax over the union);
- multihead: the first num_heads // 2 heads get the local component, the
  others the summary one (a `MultiHeadMask` with two different head masks);
- a single-component pattern (interleaved layers): every head gets it.

Every head having the same rule, the kernel evaluates the rule in-kernel on
each block; with different heads (multihead) it loads the few distinct partial
blocks of the mask instead (the package's choice), found block by block when
the kernel is built.
"""

import jax

from longformer_jax.attention.core import attention_backend as backends
from longformer_jax.attention.core import splash_kernels
from longformer_jax.attention.core.splash_kernels import Fixed, Strided, Union

UNIONS = {'strided': ('strided_local', 'strided_summary'),
          'fixed': ('fixed_local', 'fixed_summary')}


def component_rule(component: str, stride: int, summary_len: int = 1, causal: bool = True):
  """The splash rule of one component ('strided_local', ..., 'fixed_summary')."""
  family, part = component.split('_')
  if family == 'strided':
    return Strided(stride, part, causal)
  if family == 'fixed':
    return Fixed(stride, part, summary_len if part == 'summary' else 1, causal)
  raise ValueError(f'unknown Sparse Transformer component {component!r}')


def pattern_rules(pattern: str, integration: str, stride: int, summary_len: int,
                  num_heads: int, causal: bool = True) -> tuple:
  """One splash rule per head for a layer's settings (hashable: the kernel cache key)."""
  components = UNIONS.get(pattern, (pattern,))
  rules = [component_rule(c, stride, summary_len, causal) for c in components]
  if integration == 'multihead' and len(rules) == 2:
    split = num_heads // 2
    return (rules[0],) * split + (rules[1],) * (num_heads - split)
  if integration not in ('merged', 'multihead'):
    raise ValueError(f'unknown integration {integration!r}')
  return (rules[0] if len(rules) == 1 else Union(tuple(rules)),) * num_heads


def kernel_pattern(model, section) -> backends.KernelPattern:
  """What a Sparse Transformer layer asks of a kernel (config checks, `resolve_backend`).

  Within the chunk (stateless), causal or bidirectional as `model.causal`; not
  O(n^2) (no dense mask for cuDNN), and a strided / fixed pattern that only the
  static masks on slots express (splash, and the Pallas block-sparse kernel,
  which `auto` picks on a GPU).
  """
  return backends.KernelPattern(left=None, right=0 if model.causal else None, in_chunk=True,
                                dense_mask_ok=False,
                                splash_only=f'the Sparse Transformer {section.pattern!r} '
                                            f'pattern', block_sparse_on_gpu=True)


def sparse_transformer_splash(q: jax.Array, k: jax.Array, v: jax.Array, segment_ids: jax.Array,
                              valid: jax.Array, *, pattern: str, stride: int,
                              summary_len: int = 1, integration: str = 'merged',
                              causal: bool = True, interpret=None, kernel=None) -> jax.Array:
  """The Sparse Transformer's attention within one chunk through the splash kernel.

  Args:
    q, k, v: `[batch, n, heads, head_dim]`, q already scaled by 1/sqrt(head_dim).
    segment_ids, valid: `[batch, n]`; positions must be consecutive along the chunk.
    pattern, stride, summary_len, integration: the layer's settings
      (`SparseTransformerConfig`); causal: the shared `model.causal` (False: the
      bidirectional rules).
    interpret: Pallas interpret mode (None: off on TPU only).
    kernel: the masked-attention kernel (default `splash_kernels.splash_attention`;
      `block_sparse_flash.block_sparse_attention` on a GPU).
  Returns:
    `[batch, n, heads, head_dim]` in q's dtype.
  """
  rules = pattern_rules(pattern, integration, stride, summary_len, q.shape[2], causal)
  return (kernel or splash_kernels.splash_attention)(q, k, v, segment_ids, valid, mask=rules,
                                                     interpret=interpret)
