"""Exported encoders load in transformers and compute what the originals compute.

  pip install torch==2.13.0 transformers   # dev-only; the tests never need them
  python -m benchmarks.hf_export_load_check

For each tiny encoder fixture of tests/data/hf (T5 v1.0 and v1.1, LED, Longformer): the
checkpoint is imported (`hf.load`), written back by the exporter's own writer
(`hf_export.export_tensors`, the tensors `python -m longformer_jax.convert.hf_export`
saves) beside the original config.json, loaded with transformers' `from_pretrained`, and
run on the same random ids as the original directory loaded the same way. Prints the
largest absolute difference of the logits and exits non-zero above 1e-5.
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
          'led': 'LEDForConditionalGeneration', 'longformer': 'LongformerForMaskedLM'}
TOLERANCE = 1e-5


def export_to(source: str, out: str) -> None:
  """The exporter's tensors of the import of `source`, with its config.json, in `out`."""
  with open(os.path.join(source, 'config.json')) as f:
    config = json.load(f)
  original = load_file(os.path.join(source, 'model.safetensors'))
  name = os.path.basename(source)
  kept = {k: original[k] for k in encoder_export.ORIGINAL_TENSORS.get(name, ())}
  _, params = hf.load(source)
  save_file(hf_export.export_tensors(params, config, kept),
            os.path.join(out, 'model.safetensors'), metadata={'format': 'pt'})
  with open(os.path.join(out, 'config.json'), 'w') as f:
    json.dump(config, f)


def logits(directory: str, class_name: str, ids) -> np.ndarray:
  import torch  # deferred: torch, a dev-only reference, never needed by the package  # pylint: disable=g-import-not-at-top
  import transformers  # deferred: as torch  # pylint: disable=g-import-not-at-top
  model = getattr(transformers, class_name).from_pretrained(directory).eval()
  inputs = torch.tensor(ids)
  with torch.no_grad():
    if 'ConditionalGeneration' in class_name:
      out = model(input_ids=inputs, decoder_input_ids=inputs[:, :5])
    else:
      out = model(input_ids=inputs)
  return out.logits.numpy()


def main() -> int:
  worst = 0.0
  rng = np.random.default_rng(0)
  for name, class_name in MODELS.items():
    source = os.path.join(DATA, name)
    with open(os.path.join(source, 'config.json')) as f:
      vocab = json.load(f)['vocab_size']
    ids = rng.integers(3, vocab, size=(2, 12)).tolist()
    with tempfile.TemporaryDirectory() as out:
      export_to(source, out)
      difference = float(np.max(np.abs(logits(out, class_name, ids)
                                        - logits(source, class_name, ids))))
    worst = max(worst, difference)
    print(f'{name}: {class_name} loads the export; largest |logit difference| {difference:.2e}')
  return 0 if worst <= TOLERANCE else 1


if __name__ == '__main__':
  sys.exit(main())
