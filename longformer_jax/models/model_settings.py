"""`ModelConfig`: the shared model settings of `config.model`, their defaults and rules.

Every layer reads these (the sections of the variants, blocks and stacks sit beside them
in `config.model`; models/model_config.py checks the whole). This module imports no block
or stack: the model floor's modules annotate their config with `ResolvedModel`
(models/resolved_model_type.py), which inherits `ModelConfig`, so that type stands below
the registries that import those modules. The block and stack names are checked against
their registries by `resolve_model` (models/model_config.py).
"""

import dataclasses

from longformer_jax.attention.core import attention_backend
from longformer_jax.attention.registry import ATTENTION_VARIANTS
from longformer_jax.config.errors import ConfigError
from longformer_jax.config.section import Section, closest_name
from longformer_jax.layers import positional
from longformer_jax.layers.feed_forward import FeedForwardConfig
from longformer_jax.layers.norms import NormConfig
from longformer_jax.parallel.remat import REMAT_POLICIES

COMPUTE_DTYPES = ('float32', 'bfloat16')
POOLINGS = ('cls', 'mean')     # model.pooling: what an encoder's task head reads


@dataclasses.dataclass(frozen=True)
class ModelEnv:
  """What a section's `validate` may check against.

  Attributes:
    model: the shared settings of the layer being checked.
    layer_index: that layer's index (0 for model-wide sections).
    chunk_lens: the chunk lengths the model will see (training, phases,
      evaluation); empty when unknown.
  """
  model: 'ModelConfig'
  layer_index: int = 0
  chunk_lens: tuple = ()


@dataclasses.dataclass(frozen=True)
class ModelConfig(FeedForwardConfig, NormConfig, Section):
  """Shared model settings (every variant reads these).

  The feed-forward's settings (`d_ff`, `ff_chunk_size`, `ff_activation`, `ff_bias`) and the
  norms' (`norm`, `norm_epsilon`) are declared, with their defaults and rules, by the sections
  of their modules (`layers/feed_forward.FeedForwardConfig`, `layers/norms.NormConfig`);
  this class inherits them, so their keys stay `model.d_ff`, `model.norm`, ...
  """
  attention: str = 'vanilla'       # the attention variant (attention/registry.py)
  num_layers: int = 4
  d_model: int = 256
  num_heads: int = 4
  head_dim: int = 64               # even: rotary and sinusoid features come in pairs
  dropout_rate: float = 0.0
  tie_embeddings: bool = True
  dtype: str = 'float32'           # compute dtype: float32 | bfloat16
  vocab_multiple: int = 64         # vocabulary padded to a multiple of this
  causal: bool = True              # False: bidirectional (encoders)
  attention_backend: str = 'auto'  # softmax kernel: auto | xla | splash (TPU) | cudnn (GPU)
                                   # | pallas_gpu (block-sparse, GPU); auto: splash on TPU,
                                   # cuDNN on GPU where the layer fits them, else xla
                                   # (attention/core/attention_backend.py)
  mem_len: int = 0                 # cache of past hidden states (variants that keep one)
  scan_layers: bool = False        # nn.scan over identical layers
  remat_policy: str = 'none'       # parallel/remat.py
  block: str = 'pre_ln'            # models/block_registry.py
  stack: str = 'standard'          # models/stack_registry.py
  num_classes: int = 0             # classification task: output classes
  pooling: str = 'cls'             # classification, retrieval: what the head reads: 'cls' (the
                                   # first token's final state) | 'mean' (of the valid tokens')
  decoder_layers: int = 0          # seq2seq task (LED): decoder layers
  aux_loss_weights: dict = dataclasses.field(default_factory=dict)  # aux loss name -> weight
  layer_schedule: dict = dataclasses.field(default_factory=dict)    # see models/layer_schedule.py
  # Features of imported checkpoints (docs/import.md); the defaults are this project's own models.
  position_embedding: str = 'rotary'  # rotary (in attention) | learned (absolute table, GPT-2)
                                   # | relative_buckets (T5's learned bias; vanilla attention only)
  relative_num_buckets: int = 32   # relative_buckets: buckets of key - query per layer and head
  relative_max_distance: int = 128  # relative_buckets: distances >= this share the last bucket
  max_positions: int = 0           # learned: rows of the position table
  decoder_max_positions: int = 0   # learned, encoder-decoder (LED): rows of the decoder's own
                                   # table, read at target offsets 0.. (models/encoder_decoder.py)
  logits_bias: bool = False        # encoder-decoder: a learned bias on the logits (BART's, LED's
                                   # final_logits_bias; models/encoder_decoder.py)
  rope_theta: float = 10000.0      # rotary base (layers/positional.py)
  rope_scaling: dict = dataclasses.field(default_factory=dict)  # {} | {type: linear|llama3|yarn|
                                   # dynamic|longrope, ...} (layers/positional.py)
  num_kv_heads: int = 0            # key/value heads (grouped-query attention); 0: num_heads
  qkv_bias: bool = False           # biases on the query/key/value projections
  out_bias: bool = False           # bias on the attention output projection
  embedding_norm: bool = False     # a norm after the input embeddings (RoBERTa, Longformer)
  scale_tied_logits: bool = True   # tied output divided by sqrt(d_model); False: plain x @ E^T

  def validate(self, env) -> None:
    FeedForwardConfig.validate(self, env)
    NormConfig.validate(self, env)
    for name in ('num_layers', 'd_model', 'num_heads', 'head_dim', 'vocab_multiple'):
      self.require(getattr(self, name) > 0, name, 'must be a positive integer')
    self.require(self.head_dim % 2 == 0, 'head_dim',
                 'must be even (rotary and sinusoid features come in pairs)')
    self.require(self.d_model % 2 == 0, 'd_model', 'must be even')
    self.require(0.0 <= self.dropout_rate < 1.0, 'dropout_rate', 'must be in [0, 1)')
    self.require(self.dtype in COMPUTE_DTYPES, 'dtype', f'must be one of {COMPUTE_DTYPES}')
    self.require(self.mem_len >= 0, 'mem_len', 'must be >= 0')
    self.require(self.num_classes >= 0, 'num_classes', 'must be >= 0')
    self.require(self.pooling in POOLINGS, 'pooling', f'must be one of {POOLINGS}')
    self.require(self.decoder_layers >= 0, 'decoder_layers', 'must be >= 0')
    self.require(self.attention_backend in attention_backend.BACKENDS, 'attention_backend',
                 f'is not an attention backend; choose one of {attention_backend.BACKENDS}')
    self.require(self.attention in ATTENTION_VARIANTS, 'attention',
                 f'is not a variant; choose one of {sorted(ATTENTION_VARIANTS)}'
                 f'{closest_name(self.attention, ATTENTION_VARIANTS)}')
    self.require(self.remat_policy in REMAT_POLICIES, 'remat_policy',
                 f'is not a remat policy; choose one of {sorted(REMAT_POLICIES)}')
    self._validate_import_features()
    for name, weight in self.aux_loss_weights.items():
      if not (isinstance(weight, (int, float)) and not isinstance(weight, bool) and weight >= 0):
        raise ConfigError(f'model.aux_loss_weights.{name}', f'{weight!r} must be a number >= 0')


  def _validate_import_features(self) -> None:
    """The settings of imported checkpoints (docs/import.md)."""
    self.require(self.position_embedding in POSITION_EMBEDDINGS, 'position_embedding',
                 f'must be one of {POSITION_EMBEDDINGS}')
    self.require(self.max_positions >= 0, 'max_positions', 'must be >= 0')
    if self.position_embedding == 'learned':
      self.require(self.max_positions > 0, 'max_positions',
                   "must be > 0 with position_embedding='learned' (rows of the table)")
    learned_decoder = self.position_embedding == 'learned' and self.decoder_layers > 0
    if learned_decoder:
      self.require(self.decoder_max_positions > 0, 'decoder_max_positions',
                   "must be > 0 with position_embedding='learned' and decoder_layers > 0 "
                   "(rows of the decoder's table)")
    else:
      self.require(self.decoder_max_positions == 0, 'decoder_max_positions',
                   "is read only with position_embedding='learned' and decoder_layers > 0 "
                   "(the encoder-decoder's decoder table); keep the default 0")
    self._validate_relative_buckets()
    self.require(self.rope_theta > 0, 'rope_theta', 'must be > 0')
    problem = positional.rope_scaling_error(dict(self.rope_scaling), self.head_dim)
    self.require(not problem, 'rope_scaling', problem)
    self.require(self.num_kv_heads >= 0, 'num_kv_heads', 'must be >= 0 (0: num_heads)')
    if self.num_kv_heads:
      self.require(self.num_heads % self.num_kv_heads == 0, 'num_kv_heads',
                   f'must divide num_heads = {self.num_heads}')
    defaults = ModelConfig()
    for name, readers in SETTING_READERS.items():
      if self.attention not in readers:
        self.require(getattr(self, name) == getattr(defaults, name), name,
                     f'is read by the {", ".join(readers)} attention only (this layer\'s '
                     f'attention is {self.attention!r}); keep the default '
                     f'{getattr(defaults, name)!r}')
    if self.block not in NORM_BLOCKS:
      for name in ('norm', 'norm_epsilon'):
        self.require(getattr(self, name) == getattr(defaults, name), name,
                     f'is read by the {" and ".join(NORM_BLOCKS)} blocks only (block is '
                     f'{self.block!r}); keep the default {getattr(defaults, name)!r}')

  def _validate_relative_buckets(self) -> None:
    """T5's relative position buckets (attention/core/relative_buckets.py)."""
    names = ('relative_num_buckets', 'relative_max_distance')
    if self.position_embedding != 'relative_buckets':
      defaults = ModelConfig()
      for name in names:
        self.require(getattr(self, name) == getattr(defaults, name), name,
                     f"is read only with position_embedding='relative_buckets' (not "
                     f"{self.position_embedding!r}); keep the default {getattr(defaults, name)!r}")
      return
    # The eval-time memories and the Longformer attention read position_embedding too, but
    # add no bias (their scores come from CheckpointHeads.scores or their own kernels).
    self.require(self.attention == 'vanilla', 'position_embedding',
                 f"is read by the vanilla attention only (this layer's attention is "
                 f"{self.attention!r}, which would drop the position bias)")
    self.require(self.relative_num_buckets >= 4, 'relative_num_buckets',
                 'must be >= 4 (bidirectional layers split them in two halves, each with at '
                 'least one exact bucket)')
    self.require(self.relative_max_distance > self.relative_num_buckets // 2,
                 'relative_max_distance',
                 f'must be > relative_num_buckets // 2 = {self.relative_num_buckets // 2} '
                 f'(the exact buckets end there)')


POSITION_EMBEDDINGS = ('rotary', 'learned', 'relative_buckets')
# Shared settings of imported checkpoints -> the attention variants that read them.
# The vanilla attention and the eval-time memories share their projections
# (attention/core/checkpoint_heads.py), so an imported model runs with any of them.
CHECKPOINT_HEADS_READERS = ('vanilla', 'attendre', 'memorizing', 'streaming_sinks')
SETTING_READERS = {
    'position_embedding': CHECKPOINT_HEADS_READERS + ('longformer',),
    'qkv_bias': CHECKPOINT_HEADS_READERS + ('longformer',),
    'out_bias': CHECKPOINT_HEADS_READERS + ('longformer',),
    'rope_theta': CHECKPOINT_HEADS_READERS,
    'rope_scaling': CHECKPOINT_HEADS_READERS,
    'num_kv_heads': CHECKPOINT_HEADS_READERS,
}
# Blocks that read `model.norm` and `model.norm_epsilon`.
NORM_BLOCKS = ('pre_ln', 'post_ln')
