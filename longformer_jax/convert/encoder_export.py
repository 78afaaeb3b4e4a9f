"""Writing imported T5, LED and Longformer parameters back as Hugging Face tensors.

Each function here inverts the `convert_params` of one family (convert/t5.py,
convert/led.py, convert/longformer.py): `params -> {hf_name: numpy array}`,
torch `Linear` weights `[out, in]`, with exactly the names the import reads,
so that importing the written file gives the same parameters. The tied
tables are written once, as transformers saves them: T5's `shared.weight`
(no `embed_tokens` copies; `lm_head.weight` only when untied), LED's
`led.shared.weight` and Longformer's word embeddings (no `lm_head.decoder`). A Longformer
is written with the head its parameters hold: `LongformerForMaskedLM`, or, for a run of task
classification / qa, `LongformerForSequenceClassification` / `LongformerForQuestionAnswering`
(convert/longformer_heads.py, also the written config.json's `architectures` and labels).
convert/hf_export.py dispatches to `FAMILY_TENSORS` and writes the file; its decoder
exporters share `linear_tensors`.

What the import changes is undone:
- T5: every query kernel is divided by sqrt(d_kv) again, and a scaled untied
  output kernel by d_model^-0.5 (exact up to float32 rounding). Hugging Face
  keeps one relative position table per side (block 0); ours has a copy per
  layer, kept equal in fine-tuning by the import's `optimizer.tied_parameters`
  (train/tied_parameters.py); tables that differ (a run without it) are refused.
- LED: `logits_bias [vocab]` becomes `final_logits_bias [1, vocab]`.
- Longformer: the import folds token type 0 into the position table and
  drops its rows 0..pad (positions before RoBERTa's first). Given the
  original checkpoint's `ORIGINAL_TENSORS`, those rows and the token type
  table are the original's and the positions have type 0 subtracted again
  (equal to the original up to float32 rounding); without them, the type
  table and the rows before pad + 1 are zeros (the same model: rows 0..pad
  are read for padding only, type 0 is already in the positions).
"""

import numpy as np

from longformer_jax.convert import led, longformer, longformer_heads, t5
from longformer_jax.convert.errors import ConversionError

# Tensors of the original checkpoint the import folds or drops (model_type -> names); each
# family's function takes them as `original` ({} when the checkpoint is not at hand).
LONGFORMER_EMBEDDINGS = longformer.PREFIX + 'embeddings.'
ORIGINAL_TENSORS = {'longformer': (LONGFORMER_EMBEDDINGS + 'position_embeddings.weight',
                                   LONGFORMER_EMBEDDINGS + 'token_type_embeddings.weight')}


def linear_tensors(out: dict, name: str, projection: dict, d_in: int) -> None:
  """A projection `{kernel [in, *out_shape], bias}` as torch's `name.weight [out, in]`."""
  kernel = projection['kernel']
  out[f'{name}.weight'] = kernel.reshape(d_in, -1).T
  if 'bias' in projection:
    out[f'{name}.bias'] = projection['bias'].reshape(-1)


def _layer_norm(out: dict, name: str, norm: dict) -> None:
  """`{scale [d], bias [d]}` (RMSNorm: scale only) as `name.weight`, `name.bias`."""
  out[f'{name}.weight'] = norm['scale']
  if 'bias' in norm:
    out[f'{name}.bias'] = norm['bias']


def _attention(out: dict, names: dict, attention: dict, d: int) -> None:
  """q/k/v kernels `[d, heads, head_dim]` and the output `[heads, head_dim, d]`: `names` maps
  ours ('query', ..., 'out') to the torch module names."""
  for ours, theirs in names.items():
    projection = attention[ours]
    d_in = d if ours != 'out' else int(np.prod(projection['kernel'].shape[:-1]))
    linear_tensors(out, theirs, projection, d_in)


def _longformer_attention(out: dict, self_name: str, out_name: str, attention: dict,
                          d: int) -> None:
  """The Longformer self-attention's six projections under `self_name.{query, ..., value_global}`
  and its output under `out_name` (the Longformer's and LED's encoder layers)."""
  names = {n: f'{self_name}.{n}'
           for n in ('query', 'key', 'value', 'query_global', 'key_global', 'value_global')}
  _attention(out, dict(names, out=out_name), attention, d)


def _one_relative_table(tables: list, side: str) -> np.ndarray:
  """The `[buckets, heads]` table every layer of `side` must share (Hugging Face keeps one)."""
  for layer, table in enumerate(tables[1:], 1):
    if not np.array_equal(table, tables[0]):
      raise ConversionError(f'{side} layer {layer}\'s relative position bias differs from layer '
                            f'0\'s; T5 keeps one table per side and cannot hold it (fine-tune '
                            f'with optimizer.tied_parameters=relative_attention_bias, as the '
                            f'T5 import\'s config does)')
  return tables[0]


def t5_tensors(params: dict, settings: dict, hf: dict, original: dict) -> dict:
  """Inverse of convert/t5.py (v1.0 and v1.1); `original` is not read."""
  del original
  d, d_kv, d_ff = settings['d_model'], settings['head_dim'], settings['d_ff']
  out = {'shared.weight': params['embedding']['embedding']}
  if not settings['tie_embeddings']:
    kernel = params['embedding']['output']['kernel']                   # [d, vocab]
    if t5.output_is_scaled(hf):
      kernel = t5.scaled(kernel, d ** 0.5)
    out['lm_head.weight'] = kernel.T

  def attention(name: str, params_: dict) -> None:
    unscaled = dict(params_, query={'kernel': t5.scaled(params_['query']['kernel'],
                                                        1 / np.sqrt(d_kv))})
    _attention(out, {n: f'{name}.{n[0] if n != "out" else "o"}'
                     for n in ('query', 'key', 'value', 'out')}, unscaled, d)

  def feed_forward(name: str, ff: dict) -> None:
    if settings['ff_activation'] == 'geglu':
      linear_tensors(out, f'{name}.wi_0', ff['wi'], d)
      linear_tensors(out, f'{name}.wi_1', ff['wi_up'], d)
    else:
      linear_tensors(out, f'{name}.wi', ff['wi'], d)
    linear_tensors(out, f'{name}.wo', ff['wo'], d_ff)

  blocks = [params['encoder']['blocks'][f'layer_{i}'] for i in range(settings['num_layers'])]
  decoders = [params[f'decoder_{i}'] for i in range(settings['decoder_layers'])]
  for side, attentions in (('encoder', [b['attention'] for b in blocks]),
                           ('decoder', [b['self_attention'] for b in decoders])):
    out[f'{side}.block.0.layer.0.SelfAttention.relative_attention_bias.weight'] = (
        _one_relative_table([a['relative_attention_bias']['embedding'] for a in attentions],
                            side))
  for layer, block in enumerate(blocks):
    pre = f'encoder.block.{layer}.layer.'
    attention(f'{pre}0.SelfAttention', block['attention'])
    _layer_norm(out, f'{pre}0.layer_norm', block['attention_norm'])
    feed_forward(f'{pre}1.DenseReluDense', block['feed_forward'])
    _layer_norm(out, f'{pre}1.layer_norm', block['feed_forward_norm'])
  _layer_norm(out, 'encoder.final_layer_norm', params['encoder']['final_norm'])
  for layer, block in enumerate(decoders):
    pre = f'decoder.block.{layer}.layer.'
    attention(f'{pre}0.SelfAttention', block['self_attention'])
    _layer_norm(out, f'{pre}0.layer_norm', block['self_attention_norm'])
    attention(f'{pre}1.EncDecAttention', block['cross_attention'])
    _layer_norm(out, f'{pre}1.layer_norm', block['cross_attention_norm'])
    feed_forward(f'{pre}2.DenseReluDense', block['feed_forward'])
    _layer_norm(out, f'{pre}2.layer_norm', block['feed_forward_norm'])
  _layer_norm(out, 'decoder.final_layer_norm', params['decoder_norm'])
  return out


def led_tensors(params: dict, settings: dict, hf: dict, original: dict) -> dict:
  """Inverse of convert/led.py; `original` is not read."""
  del hf, original
  d, d_ff, pre = settings['d_model'], settings['d_ff'], led.PREFIX
  out = {f'{pre}shared.weight': params['embedding']['embedding'],
         f'{pre}encoder.embed_positions.weight': params['position_embedding']['embedding'],
         f'{pre}decoder.embed_positions.weight':
             params['decoder_position_embedding']['embedding'],
         'final_logits_bias': params['logits_bias'][None]}            # [1, vocab]
  _layer_norm(out, f'{pre}encoder.layernorm_embedding', params['embedding_norm'])
  _layer_norm(out, f'{pre}decoder.layernorm_embedding', params['decoder_embedding_norm'])

  def feed_forward(layer_pre: str, block: dict) -> None:
    linear_tensors(out, f'{layer_pre}fc1', block['feed_forward']['wi'], d)
    linear_tensors(out, f'{layer_pre}fc2', block['feed_forward']['wo'], d_ff)
    _layer_norm(out, f'{layer_pre}final_layer_norm', block['feed_forward_norm'])

  for layer in range(settings['num_layers']):
    block = params['encoder']['blocks'][f'layer_{layer}']
    layer_pre = f'{pre}encoder.layers.{layer}.'
    _longformer_attention(out, f'{layer_pre}self_attn.longformer_self_attn',
                          f'{layer_pre}self_attn.output', block['attention'], d)
    _layer_norm(out, f'{layer_pre}self_attn_layer_norm', block['attention_norm'])
    feed_forward(layer_pre, block)
  for layer in range(settings['decoder_layers']):
    block, layer_pre = params[f'decoder_{layer}'], f'{pre}decoder.layers.{layer}.'
    for ours, module in (('self_attention', 'self_attn'), ('cross_attention', 'encoder_attn')):
      names = {n: f'{layer_pre}{module}.{t}_proj'
               for n, t in (('query', 'q'), ('key', 'k'), ('value', 'v'), ('out', 'out'))}
      _attention(out, names, block[ours], d)
      _layer_norm(out, f'{layer_pre}{module}_layer_norm', block[f'{ours}_norm'])
    feed_forward(layer_pre, block)
  return out


def _longformer_head(params: dict, d: int) -> dict:
  """The torch tensors of the head `params` hold (inverse of `longformer_heads.read_head`)."""
  out, head = {}, longformer_heads.params_head(params)
  if head == longformer_heads.CLASSIFICATION:
    linear_tensors(out, 'classifier.dense', params['pooler'], d)
    linear_tensors(out, 'classifier.out_proj', params['classifier'], d)
  elif head == longformer_heads.QA:
    linear_tensors(out, 'qa_outputs', params['span'], d)
  else:
    linear_tensors(out, 'lm_head.dense', params['lm_head_dense'], d)
    _layer_norm(out, 'lm_head.layer_norm', params['lm_head_norm'])
    out['lm_head.bias'] = params['lm_head_bias']
  return out


def longformer_tensors(params: dict, settings: dict, hf: dict, original: dict) -> dict:
  """Inverse of convert/longformer.py; `original`: the checkpoint's `ORIGINAL_TENSORS` or {}.
  The head is the one `params` hold (masked LM, classifier or span: convert/longformer_heads.py)."""
  d, d_ff, pre, embeddings = (settings['d_model'], settings['d_ff'], longformer.PREFIX,
                              LONGFORMER_EMBEDDINGS)
  pad = hf['pad_token_id']
  positions = params['position_embedding']['embedding']                # [max_positions, d]
  position_name, type_name = ORIGINAL_TENSORS['longformer']
  if set(ORIGINAL_TENSORS['longformer']) <= set(original):
    types, before = original[type_name], original[position_name][:pad + 1]
    positions = positions - types[0]
  else:
    types = np.zeros((hf.get('type_vocab_size', 1), d), np.float32)
    before = np.zeros((pad + 1, d), np.float32)
  out = {embeddings + 'word_embeddings.weight': params['embedding']['embedding'],
         position_name: np.concatenate([before, positions]), type_name: types,
         **_longformer_head(params, d)}
  _layer_norm(out, embeddings + 'LayerNorm', params['embedding_norm'])
  for layer in range(settings['num_layers']):
    block = params['encoder']['blocks'][f'layer_{layer}']
    layer_pre = f'{pre}encoder.layer.{layer}.'
    _longformer_attention(out, f'{layer_pre}attention.self', f'{layer_pre}attention.output.dense',
                          block['attention'], d)
    _layer_norm(out, f'{layer_pre}attention.output.LayerNorm', block['attention_norm'])
    linear_tensors(out, f'{layer_pre}intermediate.dense', block['feed_forward']['wi'], d)
    linear_tensors(out, f'{layer_pre}output.dense', block['feed_forward']['wo'], d_ff)
    _layer_norm(out, f'{layer_pre}output.LayerNorm', block['feed_forward_norm'])
  return out


FAMILY_TENSORS = {'t5': t5_tensors, 'led': led_tensors, 'longformer': longformer_tensors}
# The written config.json of a family whose architecture depends on the parameters (Longformer:
# the head a task fine-tuned, longformer_heads.head_config); the original's for the others.
FAMILY_CONFIG = {'longformer': longformer_heads.head_config}


def exported_config(hf_config: dict, params: dict) -> dict:
  """The config.json written with the tensors of `params` (the original, but for the head)."""
  return FAMILY_CONFIG.get(hf_config['model_type'], lambda hf, _: dict(hf))(hf_config, params)
