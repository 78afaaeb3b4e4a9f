"""Longformer (Beltagy et al., 2020) onto `MaskedLM`: RoBERTa embeddings, post-LN blocks,
sliding-window attention with global tokens through separate projections.

Tensor mapping (`longformer.` prefix; `L` the layer; torch `Linear` weights
`[out, in]`, transposed):

  embeddings.word_embeddings.weight         embedding/embedding (tied output)
  embeddings.position_embeddings.weight     position_embedding/embedding: rows
    [max_positions + pad + 1, d]              pad + 1 .. (RoBERTa numbers the first
                                              token pad + 1), plus token type 0
  embeddings.token_type_embeddings.weight   (row 0 folded into the positions)
  embeddings.LayerNorm                      embedding_norm/{scale,bias}
  encoder.layer.L.attention.self.{query,key,value}[_global]
                                            encoder/blocks/layer_L/attention/
                                              {query,key,value}[_global] [d, heads, head_dim]
  encoder.layer.L.attention.output.dense    attention/out [heads, head_dim, d]
  encoder.layer.L.attention.output.LayerNorm  attention_norm (after the residual sum)
  encoder.layer.L.intermediate.dense        feed_forward/wi
  encoder.layer.L.output.dense              feed_forward/wo
  encoder.layer.L.output.LayerNorm          feed_forward_norm
  lm_head.dense, lm_head.layer_norm         lm_head_dense, lm_head_norm
  lm_head.bias                              lm_head_bias
  (LongformerForMaskedLM; the classification and QA checkpoints' heads instead:
  convert/longformer_heads.py; a classifier's `num_classes` is its `head_settings`)

Windows: Hugging Face's `attention_window` is the TOTAL window (each side
sees `attention_window // 2` tokens); `model.longformer.window` is one-sided,
so it is half of it. A list with one window per layer becomes
`model.layer_schedule.longformer.window`. The model reads learned positions
at offsets 0..L-1 of each example, so row i of our table is RoBERTa's
position pad + 1 + i (right padding, as the tokenizer pads). Global tokens:
`model.longformer.global_tokens` (at most this many per row) is
`GLOBAL_TOKENS`; flag them in `ctx.global_flags`.
"""

from longformer_jax.convert import longformer_heads
from longformer_jax.convert.hf_config import required, unsupported
from longformer_jax.convert.safetensors_reader import (TensorSource, torch_layer_norm,
                                                       torch_linear)

MODEL_TYPES = ('longformer',)
ENCODER = True                   # imported as `MaskedLM` (or its classifier / span model)
# Every head's scopes: a task fine-tuning the encoder keeps those its model has and drops the
# others (convert/hf_init.py).
HEAD_SCOPES = longformer_heads.ALL_SCOPES
# The settings of the checkpoint's head (a classifier's `num_classes`): the model `load` builds
# and a task that has the setting (`model_keys`) take them (convert/loader.py, hf_init.py).
head_settings = longformer_heads.head_settings
IGNORED_SUFFIXES = ('embeddings.position_ids', 'embeddings.token_type_ids')
GLOBAL_TOKENS = 64               # most global tokens per row (override in the config)
ACTIVATIONS = {'gelu': 'gelu_exact', 'gelu_new': 'gelu', 'gelu_pytorch_tanh': 'gelu'}
PREFIX = 'longformer.'


def one_sided_windows(hf: dict) -> list:
  """Each layer's one-sided window from `attention_window` (an int or one per layer)."""
  layers = required(hf, 'num_hidden_layers')
  windows = required(hf, 'attention_window')
  windows = [windows] * layers if isinstance(windows, int) else list(windows)
  if len(windows) != layers:
    raise unsupported(hf, 'attention_window', windows,
                      f'needs one window per layer ({layers} layers)')
  for window in windows:
    if not isinstance(window, int) or window < 2 or window % 2:
      raise unsupported(hf, 'attention_window', windows,
                        'each window must be an even integer >= 2 (the total window)')
  return [w // 2 for w in windows]


def model_settings(hf: dict) -> dict:
  """The `config.model` settings of the checkpoint (vocabulary aside)."""
  d_model, heads = required(hf, 'hidden_size'), required(hf, 'num_attention_heads')
  activation = hf.get('hidden_act', 'gelu')
  if activation not in ACTIVATIONS:
    raise unsupported(hf, 'hidden_act', activation, f'supported: {sorted(ACTIVATIONS)}')
  pad = required(hf, 'pad_token_id')
  max_positions = required(hf, 'max_position_embeddings') - pad - 1
  if max_positions < 1:
    raise unsupported(hf, 'max_position_embeddings', hf['max_position_embeddings'],
                      f'leaves no position after pad_token_id + 1 = {pad + 1}')
  settings = dict(
      attention='longformer', block='post_ln', causal=False,
      num_layers=hf['num_hidden_layers'], d_model=d_model, num_heads=heads,
      head_dim=d_model // heads, d_ff=required(hf, 'intermediate_size'), dropout_rate=0.0,
      tie_embeddings=True, scale_tied_logits=False, position_embedding='learned',
      max_positions=max_positions, embedding_norm=True, qkv_bias=True, out_bias=True,
      ff_activation=ACTIVATIONS[activation], ff_bias=True, norm='layer_norm',
      norm_epsilon=float(hf.get('layer_norm_eps', 1e-5)),
      **window_settings(hf))
  return settings


def window_settings(hf: dict) -> dict:
  """`model.longformer` (and, when the layers' windows differ, `model.layer_schedule`)."""
  windows = one_sided_windows(hf)
  settings = {'longformer': {'window': windows[0], 'global_tokens': GLOBAL_TOKENS,
                             'global_projections': True}}
  if len(set(windows)) > 1:
    settings['layer_schedule'] = {'longformer': {'window': ','.join(map(str, windows))}}
  return settings


def convert_params(source: TensorSource, settings: dict, vocab_size: int, hf: dict) -> dict:
  """The `MaskedLM` parameters (numpy) from the checkpoint's tensors."""
  d, heads, head_dim, d_ff = (settings['d_model'], settings['num_heads'], settings['head_dim'],
                              settings['d_ff'])
  pad = hf['pad_token_id']
  norm = lambda name: torch_layer_norm(source, name, d)
  embeddings = PREFIX + 'embeddings.'
  table = source.take(embeddings + 'word_embeddings.weight', (vocab_size, d))
  num_positions = settings['max_positions'] + pad + 1
  positions = source.take(embeddings + 'position_embeddings.weight', (num_positions, d))
  types = source.take(embeddings + 'token_type_embeddings.weight',
                      (hf.get('type_vocab_size', 1), d))
  blocks = {}
  for layer in range(settings['num_layers']):
    pre = f'{PREFIX}encoder.layer.{layer}.'
    attention = {name: torch_linear(source, f'{pre}attention.self.{name}', (heads, head_dim),
                                    d, True)
                 for name in ('query', 'key', 'value', 'query_global', 'key_global',
                              'value_global')}
    out = torch_linear(source, f'{pre}attention.output.dense', (d,), heads * head_dim, True)
    attention['out'] = {'kernel': out['kernel'].reshape(heads, head_dim, d), 'bias': out['bias']}
    blocks[f'layer_{layer}'] = {
        'attention': attention,
        'attention_norm': norm(f'{pre}attention.output.LayerNorm'),
        'feed_forward': {'wi': torch_linear(source, f'{pre}intermediate.dense', (d_ff,), d, True),
                         'wo': torch_linear(source, f'{pre}output.dense', (d,), d_ff, True)},
        'feed_forward_norm': norm(f'{pre}output.LayerNorm'),
    }
  return {
      'embedding': {'embedding': table},
      'position_embedding': {'embedding': positions[pad + 1:] + types[0]},
      'embedding_norm': norm(embeddings + 'LayerNorm'),
      'encoder': {'blocks': blocks},
      **longformer_heads.read_head(source, hf, d, vocab_size, table),
  }
