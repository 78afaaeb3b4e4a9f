"""Decoder-only language model: embedding, pre-LN block stack, final norm, logits.

With `model.position_embedding = 'learned'` (GPT-2) a table of
`model.max_positions` absolute position embeddings is added to the token
embeddings, read at each token's offset from the chunk's first position:
every chunk is embedded as a checkpoint trained on windows of at most
`max_positions` tokens saw its inputs (stream positions grow without bound;
offsets past the table read its last row). A memory of earlier chunks holds
hidden states that already carry their own chunk's offsets. Post-LN blocks
(`model.block = 'post_ln'`) end normalised: no final norm then.
"""

from typing import TYPE_CHECKING

import flax.linen as nn
import jax
import jax.numpy as jnp

from longformer_jax.attention.context import AttentionContext
from longformer_jax.config.errors import ConfigError
from longformer_jax.layers.embeddings import TokenEmbedding
from longformer_jax.layers.norms import NormConfig, norm_layer
from longformer_jax.models.input_embedding import embed_inputs
from longformer_jax.models.post_ln_block import ends_normalised
from longformer_jax.models.stack_registry import stack_class

if TYPE_CHECKING:  # for annotations only, never run (docs/design.md, "Layout")
  from longformer_jax.models.resolved_model_type import ResolvedModel

COMPUTE_DTYPES = {'float32': jnp.float32, 'bfloat16': jnp.bfloat16}


def compute_dtype(name: str):
  if name not in COMPUTE_DTYPES:
    raise ConfigError('model.dtype', f'unknown dtype {name!r}; choose one of {sorted(COMPUTE_DTYPES)}')
  return COMPUTE_DTYPES[name]


def padded_vocab_size(vocab_size: int, multiple: int) -> int:
  """Rounds the vocabulary up so that the `vocab` axis shards evenly."""
  return -(-vocab_size // multiple) * multiple


class DecoderLM(nn.Module):
  """`(tokens [batch, chunk], states, ctx) -> (logits [batch, chunk, vocab], states, aux)`.

  `config` is the resolved model (`models/resolved_model.lm_model_config`: typed, frozen,
  with `vocab_size` set to the padded size; not imported here, as it imports this module).
  Parameters are float32; activations use `config.dtype`; logits and the
  softmax inside attention are float32.
  """
  config: 'ResolvedModel'

  @staticmethod
  def init_state(config, batch_size: int):
    """The memory of every layer: a tuple of per-layer pytrees, leaves `[batch, ...]`."""
    stack = stack_class(config.stack)
    return stack.init_state(config, batch_size, compute_dtype(config.dtype))

  @nn.compact
  def __call__(self, tokens: jax.Array, states, ctx: AttentionContext):
    cfg = self.config
    dtype = compute_dtype(cfg.dtype)
    embedding = TokenEmbedding(cfg.vocab_size, cfg.d_model, cfg.tie_embeddings, dtype,
                               cfg.scale_tied_logits, name='embedding')
    x = embed_inputs(cfg, embedding, tokens, ctx.positions - ctx.positions[:, :1],
                     ctx.deterministic, dtype)
    x, states, aux = stack_class(cfg.stack)(cfg, dtype, name='blocks')(x, states, ctx)
    if not ends_normalised(cfg):
      x = norm_layer(NormConfig.of(cfg), 'final_norm', dtype)(x)
    logits = embedding.logits(x)
    logits = nn.with_logical_constraint(logits, ('batch', 'length', 'vocab'))
    return logits, states, aux


def state_logical_axes(states):
  """Logical axes of the memory pytree, for sharding it with the model.

  A memory dataclass that defines `logical_axes()` names its own axes (the
  same dataclass with a tuple of names in place of each array); any other
  array leaf is `[batch, memory, ...]`.
  """
  def default(leaf):
    names = ('batch', 'memory')
    return names[:leaf.ndim] + (None,) * max(0, leaf.ndim - len(names))

  def axes(node):
    if hasattr(node, 'logical_axes'):
      return node.logical_axes()
    return default(node)
  return jax.tree_util.tree_map(axes, states, is_leaf=lambda n: hasattr(n, 'logical_axes'))

