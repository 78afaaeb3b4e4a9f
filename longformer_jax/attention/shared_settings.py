"""The model-wide settings an attention layer reads, next to its own section.

An attention module receives two frozen values and nothing else (besides its dtype):

  config  its variant's section, as `config.model.<variant>` declares and checks it
          (e.g. `XLConfig`; a variant with no settings of its own has none);
  shared  `SharedSettings` below: the few `config.model` settings every layer shares.

`attention/registry.attention_layer` builds both from a layer's resolved model config, the
one place where settings are read for a layer's attention; `attention_state` gives the same
two to the variant's `init_state(config, shared, batch_size, dtype)` for its empty memory. So
a setting is declared once, with its default, in the section that owns it; a module reads
`self.config.window` or `self.shared.num_heads`, and a test builds a layer (and its memory)
from the same two values.
"""

import dataclasses

from longformer_jax.attention.core.checkpoint_heads import CheckpointHeads


@dataclasses.dataclass(frozen=True)
class SharedSettings:
  """The shared settings of one layer (`config.model`; models/model_settings.py documents them).

  Every field is required: `ModelConfig` holds the defaults, and `of` below is the one
  builder from a model config (tests build one from `ModelConfig`'s defaults with their
  overrides: tests/support/tiny_models.shared_settings).

  Attributes:
    num_heads, head_dim, d_model: the layer's shape (`[batch, chunk, num_heads, head_dim]`
      heads of a `[batch, chunk, d_model]` input).
    causal: False for bidirectional encoders.
    mem_len: the cache of past hidden states (variants with `reads_mem_len`).
    attention_backend: the softmax kernel asked for (attention/core/attention_backend.py).
    heads: how the layer projects and positions its heads (imported checkpoints:
      grouped keys and values, biases, RoPE settings; attention/core/checkpoint_heads.py).
  """
  num_heads: int
  head_dim: int
  d_model: int
  causal: bool
  mem_len: int
  attention_backend: str
  heads: CheckpointHeads

  @classmethod
  def of(cls, config) -> 'SharedSettings':
    """The shared settings of a layer's model config: any object with the shared model
    settings as attributes (the model floor's resolved model of a layer, a `ModelConfig`)."""
    relative = config.position_embedding == 'relative_buckets'
    heads = CheckpointHeads(
        num_kv_heads=config.num_kv_heads, qkv_bias=config.qkv_bias, out_bias=config.out_bias,
        rotary=config.position_embedding == 'rotary', rope_theta=float(config.rope_theta),
        rope_scaling=tuple(sorted((key, tuple(value) if isinstance(value, (list, tuple)) else value)
                                  for key, value in dict(config.rope_scaling).items())),
        relative_num_buckets=config.relative_num_buckets if relative else 0,
        relative_max_distance=config.relative_max_distance)
    return cls(num_heads=config.num_heads, head_dim=config.head_dim, d_model=config.d_model,
               causal=config.causal, mem_len=config.mem_len,
               attention_backend=config.attention_backend, heads=heads)
