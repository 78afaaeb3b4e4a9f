"""LED (Beltagy et al., 2020, sec. 7; `LEDForConditionalGeneration`) onto `EncoderDecoder`:
BART's layout (learned positions and an embedding norm on both sides, post-LN
layers, biases everywhere, exact GELU, a bias on the tied logits) with
Longformer self-attention in the encoder.

Tensor mapping (`led.` prefix; `L` the layer; torch `Linear` weights `[out, in]`,
transposed; q/k/v kernels `[d, heads, head_dim]`, outputs `[heads, head_dim, d]`):

  shared.weight [vocab, d]                  embedding/embedding (tied output; the copies
                                              encoder.embed_tokens, decoder.embed_tokens
                                              and lm_head.weight, if saved, must equal it)
  encoder.embed_positions.weight [Pe, d]    position_embedding/embedding (rows 0..Pe-1,
                                              no padding offset)
  encoder.layernorm_embedding               embedding_norm
  encoder.layers.L.self_attn.longformer_self_attn.{query,key,value}[_global]
                                            encoder/blocks/layer_L/attention/
                                              {query,key,value}[_global]
  encoder.layers.L.self_attn.output         encoder/blocks/layer_L/attention/out
  encoder.layers.L.self_attn_layer_norm     .../attention_norm (after the residual sum)
  encoder.layers.L.fc1, fc2                 .../feed_forward/wi, wo
  encoder.layers.L.final_layer_norm         .../feed_forward_norm
  decoder.embed_positions.weight [Pd, d]    decoder_position_embedding/embedding
  decoder.layernorm_embedding               decoder_embedding_norm
  decoder.layers.L.self_attn.{q,k,v,out}_proj     decoder_L/self_attention/
                                                    {query,key,value,out}
  decoder.layers.L.self_attn_layer_norm           decoder_L/self_attention_norm
  decoder.layers.L.encoder_attn.{q,k,v,out}_proj  decoder_L/cross_attention/
                                                    {query,key,value,out}
  decoder.layers.L.encoder_attn_layer_norm        decoder_L/cross_attention_norm
  decoder.layers.L.fc1, fc2, final_layer_norm     decoder_L/feed_forward/{wi,wo},
                                                    feed_forward_norm
  final_logits_bias [1, vocab] (no prefix)  logits_bias [vocab] (zeros when not saved,
                                              as transformers does)

Settings: `block='post_ln'` (post-LN layers), `logits_bias`,
`position_embedding='learned'` with `max_positions` =
`max_encoder_position_embeddings` and `decoder_max_positions` =
`max_decoder_position_embeddings`, `embedding_norm`, `qkv_bias`, `out_bias`,
`ff_activation='gelu_exact'`, `norm_epsilon=1e-5` (torch's LayerNorm default),
`scale_tied_logits=False`. Windows as for Longformer (convert/longformer.py):
`attention_window` is the TOTAL window, `model.longformer.window` half of it,
one per encoder layer through `model.layer_schedule`. Encoder and decoder
must have the same heads and feed-forward width (our layers share
`num_heads`, `d_ff`); `scale_embedding=True` and untied output are refused.
"""

import numpy as np

from longformer_jax.convert import longformer
from longformer_jax.convert.hf_config import required, unsupported
from longformer_jax.convert.safetensors_reader import (TensorSource, torch_layer_norm,
                                                       torch_linear)

MODEL_TYPES = ('led',)
ENCODER_DECODER = True           # imported as `EncoderDecoder` (models/encoder_decoder.py)
IGNORED_SUFFIXES = ()
PREFIX = 'led.'
NORM_EPSILON = 1e-5              # LED's LayerNorms use torch's default epsilon


def _shared(hf: dict, encoder_key: str, decoder_key: str):
  """The value both sides must agree on (our encoder and decoder layers share it)."""
  encoder, decoder = required(hf, encoder_key), required(hf, decoder_key)
  if encoder != decoder:
    raise unsupported(hf, decoder_key, decoder,
                      f'must equal {encoder_key}={encoder!r} (encoder and decoder share it)')
  return encoder


def model_settings(hf: dict) -> dict:
  """The `config.model` settings of the checkpoint (vocabulary aside)."""
  if hf.get('scale_embedding'):
    raise unsupported(hf, 'scale_embedding', hf['scale_embedding'],
                      'embeddings scaled by sqrt(d_model) are not implemented')
  if not hf.get('tie_word_embeddings', True):
    raise unsupported(hf, 'tie_word_embeddings', False,
                      'the output is tied to the shared embeddings')
  d_model = required(hf, 'd_model')
  heads = _shared(hf, 'encoder_attention_heads', 'decoder_attention_heads')
  if d_model % heads:
    raise unsupported(hf, 'encoder_attention_heads', heads, f'must divide d_model={d_model}')
  d_ff = _shared(hf, 'encoder_ffn_dim', 'decoder_ffn_dim')
  activation = hf.get('activation_function', 'gelu')
  if activation not in longformer.ACTIVATIONS:
    raise unsupported(hf, 'activation_function', activation,
                      f'supported: {sorted(longformer.ACTIVATIONS)}')
  encoder_layers = required(hf, 'encoder_layers')
  settings = dict(
      attention='longformer', block='post_ln', logits_bias=True, causal=False,
      num_layers=encoder_layers,
      decoder_layers=required(hf, 'decoder_layers'), d_model=d_model, num_heads=heads,
      head_dim=d_model // heads, d_ff=d_ff, dropout_rate=0.0, tie_embeddings=True,
      scale_tied_logits=False, position_embedding='learned',
      max_positions=required(hf, 'max_encoder_position_embeddings'),
      decoder_max_positions=required(hf, 'max_decoder_position_embeddings'),
      embedding_norm=True, qkv_bias=True, out_bias=True,
      ff_activation=longformer.ACTIVATIONS[activation], ff_bias=True, norm='layer_norm',
      norm_epsilon=NORM_EPSILON,
      **longformer.window_settings(dict(hf, num_hidden_layers=encoder_layers)))
  return settings


def convert_params(source: TensorSource, settings: dict, vocab_size: int, hf: dict) -> dict:
  """The `EncoderDecoder` parameters (numpy) from the checkpoint's tensors."""
  d, heads, head_dim, d_ff = (settings['d_model'], settings['num_heads'], settings['head_dim'],
                              settings['d_ff'])
  norm = lambda name: torch_layer_norm(source, name, d)
  # [d, heads, head_dim] projections and the [heads, head_dim, d] output, with biases.
  heads_in = lambda name: torch_linear(source, name, (heads, head_dim), d, True)

  def heads_out(name):
    out = torch_linear(source, name, (d,), heads * head_dim, True)
    return {'kernel': out['kernel'].reshape(heads, head_dim, d), 'bias': out['bias']}

  def feed_forward(pre):
    return {'wi': torch_linear(source, f'{pre}fc1', (d_ff,), d, True),
            'wo': torch_linear(source, f'{pre}fc2', (d,), d_ff, True)}

  table = source.take(PREFIX + 'shared.weight', (vocab_size, d))
  for copy in (PREFIX + 'encoder.embed_tokens.weight', PREFIX + 'decoder.embed_tokens.weight',
               'lm_head.weight'):
    _check_tied_copy(source, copy, table)
  params = {
      'embedding': {'embedding': table},
      'position_embedding': {'embedding': source.take(
          PREFIX + 'encoder.embed_positions.weight', (settings['max_positions'], d))},
      'embedding_norm': norm(PREFIX + 'encoder.layernorm_embedding'),
      'decoder_position_embedding': {'embedding': source.take(
          PREFIX + 'decoder.embed_positions.weight', (settings['decoder_max_positions'], d))},
      'decoder_embedding_norm': norm(PREFIX + 'decoder.layernorm_embedding'),
  }
  blocks = {}
  for layer in range(settings['num_layers']):
    pre = f'{PREFIX}encoder.layers.{layer}.'
    attention = {name: heads_in(f'{pre}self_attn.longformer_self_attn.{name}')
                 for name in ('query', 'key', 'value', 'query_global', 'key_global',
                              'value_global')}
    attention['out'] = heads_out(f'{pre}self_attn.output')
    blocks[f'layer_{layer}'] = {
        'attention': attention, 'attention_norm': norm(f'{pre}self_attn_layer_norm'),
        'feed_forward': feed_forward(pre), 'feed_forward_norm': norm(f'{pre}final_layer_norm')}
  params['encoder'] = {'blocks': blocks}
  for layer in range(settings['decoder_layers']):
    pre = f'{PREFIX}decoder.layers.{layer}.'
    attention = lambda module: {'query': heads_in(f'{pre}{module}.q_proj'),
                                'key': heads_in(f'{pre}{module}.k_proj'),
                                'value': heads_in(f'{pre}{module}.v_proj'),
                                'out': heads_out(f'{pre}{module}.out_proj')}
    params[f'decoder_{layer}'] = {
        'self_attention': attention('self_attn'),
        'self_attention_norm': norm(f'{pre}self_attn_layer_norm'),
        'cross_attention': attention('encoder_attn'),
        'cross_attention_norm': norm(f'{pre}encoder_attn_layer_norm'),
        'feed_forward': feed_forward(pre), 'feed_forward_norm': norm(f'{pre}final_layer_norm')}
  if source.has('final_logits_bias'):
    params['logits_bias'] = source.take('final_logits_bias', (1, vocab_size))[0]
  else:  # transformers, too, starts it at zeros when a checkpoint lacks it
    params['logits_bias'] = np.zeros((vocab_size,), table.dtype)
  return params


def _check_tied_copy(source: TensorSource, name: str, expected: np.ndarray) -> None:
  """A saved copy of the tied table (some files keep one) must equal the table itself."""
  if source.has(name):
    if not np.array_equal(source.take(name, expected.shape), expected):
      raise unsupported({'model_type': 'led'}, name, 'untied',
                        'it must equal led.shared.weight (the embeddings and output are tied)')
