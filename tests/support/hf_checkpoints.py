"""Edited copies of the Hugging Face fixtures (tests/data/hf), for the importers' error tests."""

import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from longformer_jax.convert import hf
from longformer_jax.convert.errors import ConversionError


def edited_copy(source: str, destination, edit_tensors=None, edit_config=None) -> str:
  """`source`'s config.json and model.safetensors written to `destination` after the edits
  (each edits the dict it is given in place); returns `destination` as a string."""
  tensors = load_file(os.path.join(source, 'model.safetensors'))
  with open(os.path.join(source, 'config.json')) as f:
    config = json.load(f)
  if edit_tensors:
    edit_tensors(tensors)
  if edit_config:
    edit_config(config)
  save_file(tensors, os.path.join(str(destination), 'model.safetensors'))
  with open(os.path.join(str(destination), 'config.json'), 'w') as f:
    json.dump(config, f)
  return str(destination)


def conversion_error(hf_dir: str) -> str:
  """The one-line message `hf.load(hf_dir)` fails with."""
  with pytest.raises(ConversionError) as info:
    hf.load(hf_dir)
  message = str(info.value)
  assert '\n' not in message
  return message


def reference_error(logits: np.ndarray, reference: np.ndarray,
                    valid: np.ndarray) -> tuple[float, float]:
  """(largest |ours - reference| over the `valid` positions, largest |reference| there)."""
  assert logits.shape == reference.shape
  return np.abs(logits[valid] - reference[valid]).max(), np.abs(reference[valid]).max()


def load_float32(hf_dir: str) -> tuple:
  """`(model_config, params)` of `hf.load(hf_dir)`, the parameters as float32 JAX arrays."""
  model_config, params = hf.load(hf_dir)
  return model_config, jax.tree_util.tree_map(lambda a: jnp.asarray(a, jnp.float32), params)
