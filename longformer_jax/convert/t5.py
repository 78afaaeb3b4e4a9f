"""T5 (Raffel et al., 2020; `T5ForConditionalGeneration`, v1.0 and v1.1) onto `EncoderDecoder`.

T5 is a pre-LN encoder-decoder without biases, with RMSNorm (T5LayerNorm), a
final norm on each side, no position embeddings on the inputs, and a learned
relative position bias in every self-attention layer: one scalar per
(bucket of key - query, head), bidirectional buckets in the encoder,
unidirectional in the decoder (attention/core/relative_buckets.py).

Tensor mapping (no prefix; `L` the layer; torch `Linear` weights `[out, in]`,
transposed; q/k/v kernels `[d, heads, d_kv]`, outputs `[heads, d_kv, d]`; the
inner width `heads * d_kv` may differ from `d_model`):

  shared.weight [vocab, d]                 embedding/embedding (the copies
                                             encoder/decoder.embed_tokens, if saved,
                                             must equal it)
  lm_head.weight [vocab, d] (untied only)  embedding/output/kernel [d, vocab]
  encoder.block.L.layer.0.SelfAttention.{q,k,v,o}
                                           encoder/blocks/layer_L/attention/
                                             {query,key,value,out} (q scaled, below)
  encoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight [buckets, heads]
                                           encoder/blocks/layer_L/attention/
                                             relative_attention_bias/embedding, every L
  encoder.block.L.layer.0.layer_norm       .../attention_norm/scale
  encoder.block.L.layer.1.DenseReluDense.{wi | wi_0, wi_1}, wo
                                           .../feed_forward/{wi | wi, wi_up}, wo
  encoder.block.L.layer.1.layer_norm       .../feed_forward_norm/scale
  encoder.final_layer_norm                 encoder/final_norm/scale
  decoder.block.L.layer.0.SelfAttention.*  decoder_L/self_attention/* (relative bias
                                             of block 0 in every L), layer_norm ->
                                             self_attention_norm
  decoder.block.L.layer.1.EncDecAttention.{q,k,v,o}, layer_norm
                                           decoder_L/cross_attention/*, cross_attention_norm
  decoder.block.L.layer.2.DenseReluDense.*, layer_norm
                                           decoder_L/feed_forward/*, feed_forward_norm
  decoder.final_layer_norm                 decoder_norm/scale

- T5 does not scale its attention logits by 1/sqrt(d_kv); ours do, so every
  query kernel (self- and cross-attention) is multiplied by sqrt(d_kv) here
  (exact up to rounding, and exactly when sqrt(d_kv) is a power of two, as for 64).
- Hugging Face keeps the relative bias in block 0 only and reuses it in the
  other layers; ours has a table per layer, each a copy of block 0's: the same
  function when imported, but the copies train separately when fine-tuned.
- Output: v1.0 ties it to `shared` and scales the decoder's output by
  d_model^-0.5 (`tie_embeddings=True`, `scale_tied_logits=True`); v1.1 has an
  untied `lm_head` without the scale (`tie_word_embeddings=false`). Whether
  the output is scaled is `scale_decoder_outputs` when config.json has it
  (transformers 5 writes it, and `tie_word_embeddings: true` always),
  else `tie_word_embeddings`; a scaled untied output folds the scale into
  its kernel. config.json decides the tying: an `lm_head.weight` that differs
  from `shared.weight` under `tie_word_embeddings: true` is refused.
- `feed_forward_proj`: 'relu' (v1.0, `ff_activation='relu'`) or 'gated-gelu'
  (v1.1, `ff_activation='geglu'`, the tanh GELU); others are refused.
- The unused `EncDecAttention.relative_attention_bias` of old checkpoints is
  ignored, as transformers does.
"""

import numpy as np

from longformer_jax.convert.errors import ConversionError
from longformer_jax.convert.hf_config import required, unsupported
from longformer_jax.convert.safetensors_reader import (TensorSource, torch_layer_norm,
                                                       torch_linear)

MODEL_TYPES = ('t5',)
ENCODER_DECODER = True           # imported as `EncoderDecoder` (models/encoder_decoder.py)
IGNORED_SUFFIXES = ('EncDecAttention.relative_attention_bias.weight',)
# The layers' copies of block 0's table stay equal in fine-tuning (the import's task config
# sets optimizer.tied_parameters to it: train/tied_parameters.py), so the run writes back.
TIED_PARAMETERS = 'relative_attention_bias'
# feed_forward_proj -> (our ff_activation, the dense_act_fn transformers derives from it)
FEED_FORWARD = {'relu': ('relu', 'relu'), 'gated-gelu': ('geglu', 'gelu_new')}


def output_is_scaled(hf: dict) -> bool:
  """Whether the decoder's output is multiplied by d_model^-0.5 before the logits."""
  if hf.get('scale_decoder_outputs') is not None:
    return bool(hf['scale_decoder_outputs'])
  return bool(hf.get('tie_word_embeddings', True))


def model_settings(hf: dict) -> dict:
  """The `config.model` settings of the checkpoint (vocabulary aside)."""
  if not hf.get('is_encoder_decoder', True):
    raise unsupported(hf, 'is_encoder_decoder', hf['is_encoder_decoder'],
                      'only T5ForConditionalGeneration checkpoints (encoder and decoder) import')
  proj = hf.get('feed_forward_proj', 'relu')
  if proj not in FEED_FORWARD:
    raise unsupported(hf, 'feed_forward_proj', proj, f'supported: {sorted(FEED_FORWARD)}')
  activation, act_fn = FEED_FORWARD[proj]
  if hf.get('dense_act_fn', act_fn) != act_fn:
    raise unsupported(hf, 'dense_act_fn', hf['dense_act_fn'],
                      f'feed_forward_proj={proj!r} computes {act_fn!r}')
  d_kv = required(hf, 'd_kv')
  if d_kv % 2:
    raise unsupported(hf, 'd_kv', d_kv, "our head_dim must be even")
  num_layers = required(hf, 'num_layers')
  decoder_layers = hf.get('num_decoder_layers')
  decoder_layers = num_layers if decoder_layers is None else decoder_layers
  if decoder_layers < 1:
    raise unsupported(hf, 'num_decoder_layers', decoder_layers,
                      'the encoder-decoder needs at least one decoder layer')
  buckets = hf.get('relative_attention_num_buckets', 32)
  max_distance = hf.get('relative_attention_max_distance', 128)
  if buckets < 4:
    raise unsupported(hf, 'relative_attention_num_buckets', buckets, 'must be >= 4')
  if max_distance <= buckets // 2:
    raise unsupported(hf, 'relative_attention_max_distance', max_distance,
                      f'must be > relative_attention_num_buckets // 2 = {buckets // 2}')
  tied = bool(hf.get('tie_word_embeddings', True))
  settings = dict(
      attention='vanilla', block='pre_ln', causal=False, num_layers=num_layers,
      decoder_layers=decoder_layers, d_model=required(hf, 'd_model'),
      num_heads=required(hf, 'num_heads'), head_dim=d_kv, d_ff=required(hf, 'd_ff'),
      dropout_rate=0.0, tie_embeddings=tied, position_embedding='relative_buckets',
      relative_num_buckets=buckets, relative_max_distance=max_distance,
      qkv_bias=False, out_bias=False, ff_activation=activation, ff_bias=False,
      norm='rms_norm', norm_epsilon=float(hf.get('layer_norm_epsilon', 1e-6)))
  if tied:
    settings['scale_tied_logits'] = output_is_scaled(hf)
  return settings


def convert_params(source: TensorSource, settings: dict, vocab_size: int, hf: dict) -> dict:
  """The `EncoderDecoder` parameters (numpy) from the checkpoint's tensors."""
  d, heads, d_kv, d_ff = (settings['d_model'], settings['num_heads'], settings['head_dim'],
                          settings['d_ff'])
  buckets = settings['relative_num_buckets']
  norm = lambda name: torch_layer_norm(source, name, d, bias=False)   # T5LayerNorm: RMSNorm

  def attention(name: str, relative_bias: np.ndarray | None = None) -> dict:
    query = torch_linear(source, f'{name}.q', (heads, d_kv), d, False)['kernel']
    out = torch_linear(source, f'{name}.o', (d,), heads * d_kv, False)['kernel']
    params = {
        # T5's logits are q.k unscaled; ours divide by sqrt(d_kv), which this undoes.
        'query': {'kernel': scaled(query, np.sqrt(d_kv))},
        'key': torch_linear(source, f'{name}.k', (heads, d_kv), d, False),
        'value': torch_linear(source, f'{name}.v', (heads, d_kv), d, False),
        'out': {'kernel': out.reshape(heads, d_kv, d)}}
    if relative_bias is not None:
      params['relative_attention_bias'] = {'embedding': relative_bias.copy()}
    return params

  def feed_forward(name: str) -> dict:
    if settings['ff_activation'] == 'geglu':
      params = {'wi': torch_linear(source, f'{name}.wi_0', (d_ff,), d, False),
                'wi_up': torch_linear(source, f'{name}.wi_1', (d_ff,), d, False)}
    else:
      params = {'wi': torch_linear(source, f'{name}.wi', (d_ff,), d, False)}
    params['wo'] = torch_linear(source, f'{name}.wo', (d,), d_ff, False)
    return params

  def relative_bias(side: str) -> np.ndarray:
    return source.take(f'{side}.block.0.layer.0.SelfAttention.relative_attention_bias.weight',
                       (buckets, heads))

  table = source.take('shared.weight', (vocab_size, d))
  for copy in ('encoder.embed_tokens.weight', 'decoder.embed_tokens.weight'):
    _check_tied_copy(source, copy, table)
  params = {'embedding': {'embedding': table}}
  if settings['tie_embeddings']:
    _check_tied_copy(source, 'lm_head.weight', table)
  else:
    lm_head = source.take('lm_head.weight', (vocab_size, d)).T
    params['embedding']['output'] = {
        'kernel': scaled(lm_head, d ** -0.5) if output_is_scaled(hf) else lm_head}

  encoder_bias = relative_bias('encoder')
  blocks = {}
  for layer in range(settings['num_layers']):
    pre = f'encoder.block.{layer}.layer.'
    blocks[f'layer_{layer}'] = {
        'attention': attention(f'{pre}0.SelfAttention', encoder_bias),
        'attention_norm': norm(f'{pre}0.layer_norm'),
        'feed_forward': feed_forward(f'{pre}1.DenseReluDense'),
        'feed_forward_norm': norm(f'{pre}1.layer_norm')}
  params['encoder'] = {'blocks': blocks, 'final_norm': norm('encoder.final_layer_norm')}

  decoder_bias = relative_bias('decoder')
  for layer in range(settings['decoder_layers']):
    pre = f'decoder.block.{layer}.layer.'
    params[f'decoder_{layer}'] = {
        'self_attention': attention(f'{pre}0.SelfAttention', decoder_bias),
        'self_attention_norm': norm(f'{pre}0.layer_norm'),
        'cross_attention': attention(f'{pre}1.EncDecAttention'),
        'cross_attention_norm': norm(f'{pre}1.layer_norm'),
        'feed_forward': feed_forward(f'{pre}2.DenseReluDense'),
        'feed_forward_norm': norm(f'{pre}2.layer_norm')}
  params['decoder_norm'] = norm('decoder.final_layer_norm')
  return params


def scaled(kernel: np.ndarray, factor: float) -> np.ndarray:
  """`kernel * factor`, computed in float32 and returned in the kernel's dtype."""
  return (kernel.astype(np.float32) * np.float32(factor)).astype(kernel.dtype)


def _check_tied_copy(source: TensorSource, name: str, table: np.ndarray) -> None:
  """A saved copy of the tied table (some files keep one) must equal the table itself."""
  if source.has(name) and not np.array_equal(source.take(name, table.shape), table):
    why = ('config.json ties them (tie_word_embeddings: true); set it to false for an untied '
           'output' if name == 'lm_head.weight' else 'T5 ties them')
    raise ConversionError(f'tensor {name!r} differs from \'shared.weight\' ({why})')
