"""Exported encoders load in transformers and compute what the originals compute.

  pip install torch==2.13.0 transformers   # dev-only; the tests never need them
  python -m benchmarks.hf_export_load_check

For each tiny encoder fixture of tests/data/hf (T5 v1.0 and v1.1, LED, the Longformer
masked LM and its classification and QA heads): the checkpoint is imported (`hf.load`),
written back by the exporter's own writer (`hf_export.export_tensors` and
`encoder_export.exported_config`, the tensors and config.json `python -m
longformer_jax.convert.hf_export` saves), loaded with transformers' `from_pretrained` (the
class of the written `architectures`), and run on the same ids as the original directory
loaded the same way: random ids, or for the heads the fixture's own (QA needs three
separators per row), with transformers' own global flags. Prints the largest absolute
difference of the logits (QA: start and end logits) and exits non-zero above 1e-5.
"""

import json
import os
import sys
import tempfile

import numpy as np
from safetensors.numpy import load_file, save_file

from longformer_jax.convert import encoder_export, hf, hf_export

DATA = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), 'tests',
                    'data', 'hf')
# fixture -> the transformers class that loads it
MODELS = {'t5': 'T5ForConditionalGeneration', 't5_v11': 'T5ForConditionalGeneration',
          'led': 'LEDForConditionalGeneration', 'longformer': 'LongformerForMaskedLM',
          'longformer_cls': 'LongformerForSequenceClassification',
          'longformer_qa': 'LongformerForQuestionAnswering'}
HEADS = ('longformer_cls', 'longformer_qa')      # run on the fixture's own ids
TOLERANCE = 1e-5


def export_to(source: str, out: str) -> None:
  """The exporter's tensors of the import of `source`, with its config.json, in `out`."""
  with open(os.path.join(source, 'config.json')) as f:
    config = json.load(f)
  original = load_file(os.path.join(source, 'model.safetensors'))
  kept = {k: original[k] for k in encoder_export.ORIGINAL_TENSORS.get(config['model_type'], ())}
  _, params = hf.load(source)
  save_file(hf_export.export_tensors(params, config, kept),
            os.path.join(out, 'model.safetensors'), metadata={'format': 'pt'})
  with open(os.path.join(out, 'config.json'), 'w') as f:
    json.dump(encoder_export.exported_config(config, params), f)


def logits(directory: str, class_name: str, ids, mask=None) -> np.ndarray:
  import torch  # deferred: torch, a dev-only reference, never needed by the package  # pylint: disable=g-import-not-at-top
  import transformers  # deferred: as torch  # pylint: disable=g-import-not-at-top
  with open(os.path.join(directory, 'config.json')) as f:
    assert json.load(f)['architectures'] == [class_name], directory
  model = getattr(transformers, class_name).from_pretrained(directory).eval()
  inputs = torch.tensor(ids)
  with torch.no_grad():
    if 'ConditionalGeneration' in class_name:
      out = model(input_ids=inputs, decoder_input_ids=inputs[:, :5])
    elif mask is not None:
      out = model(input_ids=inputs, attention_mask=torch.tensor(mask))
    else:
      out = model(input_ids=inputs)
  if 'QuestionAnswering' in class_name:
    return np.stack([out.start_logits.numpy(), out.end_logits.numpy()])
  return out.logits.numpy()


def main() -> int:
  worst = 0.0
  rng = np.random.default_rng(0)
  for name, class_name in MODELS.items():
    source = os.path.join(DATA, name)
    with open(os.path.join(source, 'config.json')) as f:
      vocab = json.load(f)['vocab_size']
    ids, mask = rng.integers(3, vocab, size=(2, 12)).tolist(), None
    if name in HEADS:
      ids = np.load(os.path.join(source, 'input_ids.npy')).astype(np.int64).tolist()
      mask = np.load(os.path.join(source, 'attention_mask.npy')).astype(np.int64).tolist()
    with tempfile.TemporaryDirectory() as out:
      export_to(source, out)
      difference = float(np.max(np.abs(logits(out, class_name, ids, mask)
                                        - logits(source, class_name, ids, mask))))
    worst = max(worst, difference)
    print(f'{name}: {class_name} loads the export; largest |logit difference| {difference:.2e}')
  return 0 if worst <= TOLERANCE else 1


if __name__ == '__main__':
  sys.exit(main())
