"""The Longformer's heads both ways: transformers' masked-LM, sequence-classification and
question-answering heads, and ours (`MaskedLM`'s `lm_head_*`, `SequenceClassifier`'s
`pooler` + `classifier`, `SpanExtractor`'s `span`).

Which head a checkpoint has is its config.json's `architectures` (`HEADS`); which head a
run has is the scopes of its parameters (a task's model: `classification` ->
SequenceClassifier, `qa` -> SpanExtractor; models/encoder.py). Everything that depends on
the head is here: the import (`read_head`, `head_settings`), the export's config
(`head_config`; its tensors: `encoder_export.longformer_tensors`, by `params_head`) and the
module that runs it (`model_class`).

  transformers (torch Linear [out, in])     ours (kernel [in, out])
  lm_head.dense, lm_head.layer_norm,        lm_head_dense, lm_head_norm, lm_head_bias
    lm_head.bias (decoder tied)               (output tied to the word embeddings)
  classifier.dense [d, d]                   pooler [d, d]
  classifier.out_proj [num_labels, d]       classifier [d, num_classes]
  qa_outputs [2, d] (start, end)            span [d, 2] (start, end)

Both classifiers compute out_proj(tanh(dense(h[:, 0]))) (dropout aside: transformers also
drops out before `dense` in training). Global tokens: transformers flags token 0 for
classification and, for QA, every token before the first separator (`<s>` and the
question) when given no `global_attention_mask`; our tasks flag [CLS] (classification)
and [CLS] question [SEP] (qa, tasks/qa.py).
"""

import numpy as np

from longformer_jax.convert.errors import ConversionError
from longformer_jax.convert.hf_config import unsupported
from longformer_jax.convert.safetensors_reader import (TensorSource, torch_layer_norm,
                                                       torch_linear)
from longformer_jax.models.encoder import SequenceClassifier, SpanExtractor
from longformer_jax.models.masked_lm import MaskedLM

MASKED_LM = 'LongformerForMaskedLM'
CLASSIFICATION = 'LongformerForSequenceClassification'
QA = 'LongformerForQuestionAnswering'
# transformers' architecture -> the scopes of our parameters that hold its head.
HEADS = {MASKED_LM: ('lm_head_dense', 'lm_head_norm', 'lm_head_bias'),
         CLASSIFICATION: ('pooler', 'classifier'),
         QA: ('span',)}
ALL_SCOPES = tuple(scope for scopes in HEADS.values() for scope in scopes)
QA_LABELS = 2                    # start and end


def architecture(hf: dict) -> str:
  """The head of a checkpoint's config.json: one of `HEADS` (masked LM when none is named)."""
  named = [name for name in hf.get('architectures') or () if name in HEADS]
  return named[0] if named else MASKED_LM


def num_labels(hf: dict) -> int:
  """transformers' `num_labels`: the number of `id2label` entries (2 when absent)."""
  if isinstance(hf.get('id2label'), dict):
    return len(hf['id2label'])
  return int(hf.get('num_labels', 2))


def head_settings(hf: dict) -> dict:
  """The `config.model` settings the head fixes: a classifier's `num_classes`."""
  if architecture(hf) == CLASSIFICATION:
    return {'num_classes': num_labels(hf)}
  return {}


def read_head(source: TensorSource, hf: dict, d: int, vocab_size: int,
              table: np.ndarray) -> dict:
  """Our head parameters from the checkpoint's head tensors (`table`: the word embeddings,
  which a saved masked-LM decoder copy must equal)."""
  head = architecture(hf)
  if head == CLASSIFICATION:
    return {'pooler': torch_linear(source, 'classifier.dense', (d,), d, True),
            'classifier': torch_linear(source, 'classifier.out_proj', (num_labels(hf),), d,
                                       True)}
  if head == QA:
    if num_labels(hf) != QA_LABELS:
      raise ConversionError(f'config.json: {QA} with num_labels={num_labels(hf)}; the span '
                            f'head has {QA_LABELS} (start, end)')
    return {'span': torch_linear(source, 'qa_outputs', (QA_LABELS,), d, True)}
  lm_bias = source.take('lm_head.bias', (vocab_size,))
  _check_tied_copy(source, 'lm_head.decoder.weight', table)
  _check_tied_copy(source, 'lm_head.decoder.bias', lm_bias)
  return {'lm_head_dense': torch_linear(source, 'lm_head.dense', (d,), d, True),
          'lm_head_norm': torch_layer_norm(source, 'lm_head.layer_norm', d),
          'lm_head_bias': lm_bias}


def _check_tied_copy(source: TensorSource, name: str, expected: np.ndarray) -> None:
  """A saved copy of a tied tensor (older files keep one) must equal the tensor itself."""
  if source.has(name):
    if not np.array_equal(source.take(name, expected.shape), expected):
      raise unsupported({'model_type': 'longformer'}, name, 'untied',
                        'the masked-LM decoder is tied to the word embeddings and lm_head.bias')


def params_head(params: dict) -> str:
  """The head (`HEADS` key) whose scopes `params` hold."""
  for head, scopes in HEADS.items():
    if all(scope in params for scope in scopes):
      return head
  heads = '; '.join(f'{head}: {" + ".join(scopes)}' for head, scopes in HEADS.items())
  raise ConversionError(f'the parameters have none of the Longformer heads transformers '
                        f'writes ({heads})')


def head_config(hf: dict, params: dict) -> dict:
  """The config.json of the export of `params`: the original `hf` with the architecture of
  their head and, for a classifier or span head, its labels (the original's when their number
  is unchanged, absent ones meaning transformers' 2; else transformers' LABEL_i)."""
  head = params_head(params)
  out = dict(hf, architectures=[head])
  if head == MASKED_LM:
    return out
  count = (params['classifier']['bias'].shape[-1] if head == CLASSIFICATION else QA_LABELS)
  if num_labels(hf) != count:
    out['id2label'] = {str(i): f'LABEL_{i}' for i in range(count)}
    out['label2id'] = {f'LABEL_{i}': i for i in range(count)}
  out.pop('num_labels', None)
  return out


def model_class(params: dict):
  """The Flax module of an imported Longformer with these parameters."""
  return {MASKED_LM: MaskedLM, CLASSIFICATION: SequenceClassifier,
          QA: SpanExtractor}[params_head(params)]
