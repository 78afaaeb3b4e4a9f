"""GPT-2 (Radford et al., 2019) onto `DecoderLM`: learned positions, biases, LayerNorm, GELU.

Tensor mapping (`transformer.` prefix optional; `L` the layer; Conv1D weights
are already `[in, out]`):

  wte.weight [vocab, d]              embedding/embedding (tied output)
  wpe.weight [n_positions, d]        position_embedding/embedding
  h.L.ln_1.{weight,bias}             blocks/layer_L/attention_norm/{scale,bias}
  h.L.attn.c_attn.weight [d, 3d]     attention/{query,key,value}/kernel [d, heads, head_dim]
  h.L.attn.c_attn.bias [3d]          attention/{query,key,value}/bias [heads, head_dim]
  h.L.attn.c_proj.{weight,bias}      attention/out/kernel [heads, head_dim, d], bias [d]
  h.L.ln_2.{weight,bias}             feed_forward_norm/{scale,bias}
  h.L.mlp.c_fc.{weight,bias}         feed_forward/wi/{kernel,bias}
  h.L.mlp.c_proj.{weight,bias}       feed_forward/wo/{kernel,bias}
  ln_f.{weight,bias}                 final_norm/{scale,bias}
"""

import numpy as np

from longformer_jax.convert.hf_config import required, unsupported
from longformer_jax.convert.safetensors_reader import TensorSource, torch_layer_norm

MODEL_TYPES = ('gpt2',)
# Causal-mask buffers some GPT-2 files carry; not parameters.
IGNORED_SUFFIXES = ('.attn.bias', '.attn.masked_bias')
GELU_TANH = ('gelu_new', 'gelu_pytorch_tanh', 'gelu_fast')


def model_settings(hf: dict) -> dict:
  """The `config.model` settings of the checkpoint (vocabulary aside)."""
  d_model, heads = required(hf, 'n_embd'), required(hf, 'n_head')
  activation = hf.get('activation_function', 'gelu_new')
  if activation not in GELU_TANH:
    raise unsupported(hf, 'activation_function', activation, f'supported: {GELU_TANH}')
  if hf.get('scale_attn_by_inverse_layer_idx'):
    raise unsupported(hf, 'scale_attn_by_inverse_layer_idx', True, 'not implemented')
  if not hf.get('scale_attn_weights', True):
    raise unsupported(hf, 'scale_attn_weights', False, 'attention always scales by head_dim^-1/2')
  if hf.get('add_cross_attention'):
    raise unsupported(hf, 'add_cross_attention', True, 'decoder-only import')
  return dict(
      attention='vanilla', num_layers=required(hf, 'n_layer'), d_model=d_model, num_heads=heads,
      head_dim=d_model // heads, d_ff=hf.get('n_inner') or 4 * d_model, dropout_rate=0.0,
      tie_embeddings=True, scale_tied_logits=False, position_embedding='learned',
      max_positions=required(hf, 'n_positions'), qkv_bias=True, out_bias=True,
      ff_activation='gelu', ff_bias=True, norm='layer_norm',
      norm_epsilon=float(hf.get('layer_norm_epsilon', 1e-5)))


def _prefix(source: TensorSource) -> str:
  return 'transformer.' if source.has('transformer.wte.weight') else ''


def convert_params(source: TensorSource, settings: dict, vocab_size: int, hf: dict) -> dict:
  """The `DecoderLM` parameters (numpy) from the checkpoint's tensors."""
  del hf  # every setting it needs is in `settings`
  p = _prefix(source)
  d, heads, head_dim, d_ff = (settings['d_model'], settings['num_heads'], settings['head_dim'],
                              settings['d_ff'])
  norm = lambda name: torch_layer_norm(source, name, d)
  blocks = {}
  for layer in range(settings['num_layers']):
    h = f'{p}h.{layer}.'
    qkv = source.take(f'{h}attn.c_attn.weight', (d, 3 * d))
    qkv_bias = source.take(f'{h}attn.c_attn.bias', (3 * d,))
    attention = {}
    for i, name in enumerate(('query', 'key', 'value')):
      attention[name] = {
          'kernel': qkv[:, i * d:(i + 1) * d].reshape(d, heads, head_dim),
          'bias': qkv_bias[i * d:(i + 1) * d].reshape(heads, head_dim)}
    attention['out'] = {
        'kernel': source.take(f'{h}attn.c_proj.weight', (d, d)).reshape(heads, head_dim, d),
        'bias': source.take(f'{h}attn.c_proj.bias', (d,))}
    blocks[f'layer_{layer}'] = {
        'attention_norm': norm(f'{h}ln_1'),
        'attention': attention,
        'feed_forward_norm': norm(f'{h}ln_2'),
        'feed_forward': {
            'wi': {'kernel': source.take(f'{h}mlp.c_fc.weight', (d, d_ff)),
                   'bias': source.take(f'{h}mlp.c_fc.bias', (d_ff,))},
            'wo': {'kernel': source.take(f'{h}mlp.c_proj.weight', (d_ff, d)),
                   'bias': source.take(f'{h}mlp.c_proj.bias', (d,))}},
    }
  table = source.take(f'{p}wte.weight', (vocab_size, d))
  return {
      'embedding': {'embedding': table},
      'position_embedding': {
          'embedding': source.take(f'{p}wpe.weight', (settings['max_positions'], d))},
      'blocks': blocks,
      'final_norm': norm(f'{p}ln_f'),
  }


def lm_head_check(source: TensorSource, vocab_size: int, d: int) -> None:
  """A saved `lm_head.weight` must be the tied table (GPT-2 always ties)."""
  if source.has('lm_head.weight'):
    head = source.take('lm_head.weight', (vocab_size, d))
    table = source.take(f'{_prefix(source)}wte.weight', (vocab_size, d))
    if not np.array_equal(head, table):
      raise unsupported({'model_type': 'gpt2'}, 'lm_head.weight', 'untied', 'GPT-2 ties it to wte')
