"""Llama, Mistral and Qwen2 onto `DecoderLM`: RMSNorm, SwiGLU, grouped-query RoPE attention.

Tensor mapping (`L` the layer; torch `Linear` weights are `[out, in]`, so
each is transposed, then split into heads):

  model.embed_tokens.weight [vocab, d]        embedding/embedding
  lm_head.weight [vocab, d]                   embedding/output/kernel [d, vocab] (untied)
  model.layers.L.input_layernorm.weight       blocks/layer_L/attention_norm/scale
  model.layers.L.self_attn.q_proj.weight      attention/query/kernel [d, heads, head_dim]
  model.layers.L.self_attn.{k,v}_proj.weight  attention/{key,value}/kernel [d, kv_heads, head_dim]
  model.layers.L.self_attn.{q,k,v}_proj.bias  attention/{query,key,value}/bias (Qwen2;
                                              Llama with attention_bias)
  model.layers.L.self_attn.o_proj.weight      attention/out/kernel [heads, head_dim, d]
  model.layers.L.post_attention_layernorm     feed_forward_norm/scale
  model.layers.L.mlp.gate_proj.weight         feed_forward/wi/kernel (SiLU-gated)
  model.layers.L.mlp.up_proj.weight           feed_forward/wi_up/kernel
  model.layers.L.mlp.down_proj.weight         feed_forward/wo/kernel
  model.norm.weight                           final_norm/scale

RoPE: `rope_theta` and `rope_scaling` (types default, linear, llama3, yarn, dynamic,
longrope; layers/positional.py), read from `rope_parameters` (newer files) or
`rope_theta`/`rope_scaling`, with transformers' defaults made explicit: yarn's and
longrope's `original_max_position_embeddings` default to `max_position_embeddings`, a
missing yarn or longrope `factor` is `max_position_embeddings` over it, and dynamic's
threshold is always `max_position_embeddings` (transformers ignores any other).

Sliding window (`window_settings`): Mistral's `sliding_window` (every layer)
and Qwen2's (`use_sliding_window`; the layers `layer_types` names
`sliding_attention`, else those from `max_window_layers` on): a query at
position i attends to keys j with 0 <= i - j < sliding_window, as transformers
masks them. Those layers use the project's rolling-window attention,
`streaming_sinks` with no sinks (attention/streaming_sinks.py): a FIFO of the
window's earlier keys and values carried from chunk to chunk, RoPE at the text
positions, the checkpoint's grouped heads, biases and RoPE settings
(core/checkpoint_heads.py); the parameters are vanilla's. A window at least
`max_position_embeddings` long never binds within the positions the
checkpoint was trained for, and the import keeps the vanilla attention.
"""

from longformer_jax.convert.hf_config import required, unsupported
from longformer_jax.convert.safetensors_reader import TensorSource, torch_linear

MODEL_TYPES = ('llama', 'mistral', 'qwen2')
IGNORED_SUFFIXES = ('rotary_emb.inv_freq',)
LLAMA3_KEYS = ('factor', 'low_freq_factor', 'high_freq_factor',
               'original_max_position_embeddings')
# yarn's optional keys that transformers reads as absent when missing, None or 0.
YARN_OPTIONAL = ('beta_fast', 'beta_slow', 'mscale', 'mscale_all_dim')
SUPPORTED_ROPE = 'supported: default, linear, llama3, yarn, dynamic, longrope'


def rope_settings(hf: dict) -> tuple:
  """`(rope_theta, rope_scaling)` in the project's form (layers/positional.py)."""
  parameters = dict(hf.get('rope_parameters') or {})
  scaling = dict(hf.get('rope_scaling') or parameters)
  theta = float(parameters.get('rope_theta', hf.get('rope_theta', 10000.0)))
  kind = scaling.get('rope_type', scaling.get('type', 'default'))
  if scaling.get('partial_rotary_factor', 1.0) != 1.0:   # transformers reads it for every type
    raise unsupported(hf, 'rope_scaling.partial_rotary_factor', scaling['partial_rotary_factor'],
                      'the rotary embedding here rotates every feature of the head (1.0)')
  if kind == 'default':
    return theta, {}
  if kind == 'linear':
    return theta, {'type': 'linear', 'factor': float(scaling['factor'])}
  if kind == 'llama3':
    return theta, {'type': 'llama3', **{k: float(scaling[k]) for k in LLAMA3_KEYS}}
  if kind not in ('yarn', 'dynamic', 'longrope'):
    raise unsupported(hf, 'rope_scaling.rope_type', kind, SUPPORTED_ROPE)
  if kind == 'dynamic':
    return theta, {'type': 'dynamic', 'factor': float(scaling_value(hf, scaling, 'factor')),
                   'original_max_position_embeddings': context_length(hf)}
  original = scaling.get('original_max_position_embeddings') or context_length(hf)
  factor = scaling.get('factor')
  if factor is None:                  # transformers: the ratio of the two contexts
    factor = context_length(hf) / original
  result = {'type': kind, 'factor': float(factor), 'original_max_position_embeddings': original}
  if scaling.get('attention_factor') is not None:
    result['attention_factor'] = float(scaling['attention_factor'])
  if kind == 'longrope':
    result.update(short_factor=[float(v) for v in scaling_value(hf, scaling, 'short_factor')],
                  long_factor=[float(v) for v in scaling_value(hf, scaling, 'long_factor')])
    return theta, result
  result.update({k: float(scaling[k]) for k in YARN_OPTIONAL if scaling.get(k)})
  if scaling.get('truncate') is not None:
    result['truncate'] = bool(scaling['truncate'])
  return theta, result


def scaling_value(hf: dict, scaling: dict, key: str):
  """`scaling[key]`, which the scaling needs (a one-line error naming it if missing)."""
  if scaling.get(key) is None:
    raise unsupported(hf, f'rope_scaling.{key}', None,
                      f'rope_type {scaling.get("rope_type", scaling.get("type"))!r} needs it')
  return scaling[key]


def context_length(hf: dict) -> int:
  return int(required(hf, 'max_position_embeddings'))


def model_settings(hf: dict) -> dict:
  """The `config.model` settings of the checkpoint (vocabulary aside)."""
  d_model, heads = required(hf, 'hidden_size'), required(hf, 'num_attention_heads')
  activation = hf.get('hidden_act', 'silu')
  if activation != 'silu':
    raise unsupported(hf, 'hidden_act', activation, 'SwiGLU uses silu')
  if hf.get('pretraining_tp', 1) != 1:
    raise unsupported(hf, 'pretraining_tp', hf['pretraining_tp'], 'only 1')
  theta, scaling = rope_settings(hf)
  attention_bias = bool(hf.get('attention_bias', False))
  qwen2 = hf['model_type'] == 'qwen2'
  num_layers = required(hf, 'num_hidden_layers')
  return dict(
      **window_settings(hf, num_layers), num_layers=required(hf, 'num_hidden_layers'), d_model=d_model,
      num_heads=heads, head_dim=hf.get('head_dim') or d_model // heads,
      num_kv_heads=hf.get('num_key_value_heads') or heads,
      d_ff=required(hf, 'intermediate_size'), dropout_rate=0.0,
      tie_embeddings=bool(hf.get('tie_word_embeddings', False)), scale_tied_logits=False,
      position_embedding='rotary', rope_theta=theta, rope_scaling=scaling,
      qkv_bias=qwen2 or attention_bias, out_bias=attention_bias,
      ff_activation='swiglu', ff_bias=bool(hf.get('mlp_bias', False)), norm='rms_norm',
      norm_epsilon=float(hf.get('rms_norm_eps', 1e-6)))


SLIDING, FULL = 'sliding_attention', 'full_attention'


def windowed_layers(hf: dict, num_layers: int) -> list[bool]:
  """Which layers attend through the sliding window (transformers' rule for the family)."""
  if hf['model_type'] == 'mistral':     # every layer (MistralConfig ignores layer_types)
    return [True] * num_layers
  types = hf.get('layer_types')
  if types is None:
    first = hf.get('max_window_layers', 28)
    types = [SLIDING if i >= first else FULL for i in range(num_layers)]
  if len(types) != num_layers or any(t not in (SLIDING, FULL) for t in types):
    raise unsupported(hf, 'layer_types', types, f'one of {FULL!r}, {SLIDING!r} per layer')
  return [t == SLIDING for t in types]


def window_settings(hf: dict, num_layers: int) -> dict:
  """`attention` (and `layer_schedule`, `streaming_sinks`) of the checkpoint's sliding window."""
  vanilla = {'attention': 'vanilla'}
  window = hf.get('sliding_window')
  if hf['model_type'] == 'llama' or window is None:
    return vanilla
  if hf['model_type'] == 'qwen2' and not hf.get('use_sliding_window', False):
    return vanilla                       # transformers drops the window then
  if not isinstance(window, int) or window < 1:
    raise unsupported(hf, 'sliding_window', window, 'a positive number of tokens')
  if window >= (hf.get('max_position_embeddings') or window + 1):
    return vanilla                       # never shorter than an input the checkpoint takes
  windowed = windowed_layers(hf, num_layers)
  if not any(windowed):
    return vanilla
  section = {'streaming_sinks': {'num_sinks': 0, 'window': window, 'positions': 'original'}}
  if all(windowed):
    return {'attention': 'streaming_sinks', **section}
  schedule = ','.join('streaming_sinks' if w else 'vanilla' for w in windowed)
  return {**vanilla, 'layer_schedule': {'attention': schedule}, **section}


def convert_params(source: TensorSource, settings: dict, vocab_size: int, hf: dict) -> dict:
  """The `DecoderLM` parameters (numpy) from the checkpoint's tensors."""
  del hf  # every setting it needs is in `settings`
  d, heads, kv_heads, head_dim, d_ff = (settings['d_model'], settings['num_heads'],
                                        settings['num_kv_heads'], settings['head_dim'],
                                        settings['d_ff'])
  qkv_bias, out_bias, ff_bias = settings['qkv_bias'], settings['out_bias'], settings['ff_bias']
  blocks = {}
  for layer in range(settings['num_layers']):
    pre = f'model.layers.{layer}.'
    out = source.take(f'{pre}self_attn.o_proj.weight', (d, heads * head_dim))
    out_params = {'kernel': out.T.reshape(heads, head_dim, d)}
    if out_bias:
      out_params['bias'] = source.take(f'{pre}self_attn.o_proj.bias', (d,))
    blocks[f'layer_{layer}'] = {
        'attention_norm': {'scale': source.take(f'{pre}input_layernorm.weight', (d,))},
        'attention': {
            'query': torch_linear(source, f'{pre}self_attn.q_proj', (heads, head_dim), d, qkv_bias),
            'key': torch_linear(source, f'{pre}self_attn.k_proj', (kv_heads, head_dim), d,
                                qkv_bias),
            'value': torch_linear(source, f'{pre}self_attn.v_proj', (kv_heads, head_dim), d,
                             qkv_bias),
            'out': out_params},
        'feed_forward_norm': {
            'scale': source.take(f'{pre}post_attention_layernorm.weight', (d,))},
        'feed_forward': {
            'wi': torch_linear(source, f'{pre}mlp.gate_proj', (d_ff,), d, ff_bias),
            'wi_up': torch_linear(source, f'{pre}mlp.up_proj', (d_ff,), d, ff_bias),
            'wo': torch_linear(source, f'{pre}mlp.down_proj', (d,), d_ff, ff_bias)},
    }
  embedding = {'embedding': source.take('model.embed_tokens.weight', (vocab_size, d))}
  if not settings['tie_embeddings']:
    embedding['output'] = {'kernel': source.take('lm_head.weight', (vocab_size, d)).T}
  elif source.has('lm_head.weight'):
    source.take('lm_head.weight', (vocab_size, d))  # a tied copy some files carry
  return {
      'embedding': embedding,
      'blocks': blocks,
      'final_norm': {'scale': source.take('model.norm.weight', (d,))},
  }
