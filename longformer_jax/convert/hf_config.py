"""A Hugging Face `config.json`: reading it and the checks every family shares."""

import json
import os

from longformer_jax.convert.errors import ConversionError

CONFIG_FILE = 'config.json'


def read_hf_config(hf_dir: str) -> dict:
  """`hf_dir/config.json` as a dict."""
  if not os.path.isdir(hf_dir):
    raise ConversionError(f'{hf_dir}: not a directory (pass --hf_dir=DIR with config.json and '
                          f'*.safetensors)')
  path = os.path.join(hf_dir, CONFIG_FILE)
  if not os.path.exists(path):
    raise ConversionError(f'{path}: missing (a Hugging Face model directory has one)')
  try:
    with open(path) as f:
      config = json.load(f)
  except json.JSONDecodeError as e:
    raise ConversionError(f'{path}: not valid JSON ({e})') from None
  if 'model_type' not in config:
    raise ConversionError(f'{path}: no model_type')
  return config


def required(hf: dict, key: str):
  """`hf[key]`, which the family needs."""
  if hf.get(key) is None:
    raise ConversionError(f'config.json: {hf["model_type"]} needs {key!r}')
  return hf[key]


def unsupported(hf: dict, key: str, value, why: str) -> ConversionError:
  return ConversionError(f'config.json: {key}={value!r} is not supported for '
                         f'{hf["model_type"]} ({why})')
