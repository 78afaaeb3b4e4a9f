"""Importing a Hugging Face decoder checkpoint (GPT-2, Llama, Mistral, Qwen2) onto `DecoderLM`.

Python:

  from longformer_jax.convert import hf
  model_config, params = hf.load('/path/to/hf_dir')          # float32 numpy params
  model_config, params = hf.load(hf_dir, dtype='bfloat16')   # ml_dtypes.bfloat16 params
  logits, _, _ = DecoderLM(model_config).apply({'params': params}, tokens, states, ctx)
  model, params = hf.load_model(hf_dir)     # the Flax module (DecoderLM, MaskedLM, ...) too
  hf.export(workdir, out_dir)               # a run of an imported model, back to Hugging Face

Command line (a workdir that eval.py, generate.py and train.py read like any run's):

  python -m longformer_jax.convert.hf --hf_dir=DIR --workdir=OUT [--dtype=float32|bfloat16]

See docs/import.md for the tensor mapping of each family and what is not
supported. Every failure is one line naming the culprit (`ConversionError`).
"""

from longformer_jax.convert.loader import (  # pylint: disable=unused-import
    is_encoder, is_encoder_decoder, load, load_model, load_params, model_settings, vocab_multiple)
from longformer_jax.convert.hf_export import export  # pylint: disable=unused-import
from longformer_jax.convert.workdir_cli import convert_to_workdir, run  # pylint: disable=unused-import

# The Python API above, re-exported from the modules that implement it.
__all__ = ['convert_to_workdir', 'export', 'is_encoder', 'is_encoder_decoder', 'load',
           'load_model', 'load_params', 'model_settings', 'vocab_multiple']

if __name__ == '__main__':
  run()
