"""Mistral's and Qwen2's sliding window (longformer_jax/convert/llama.py, `window_settings`).

The references are transformers' float32 logits of tiny random models with a
window of 8 tokens on inputs of 19 (`tests/data/hf/{mistral,qwen2}_window`,
tools/make_hf_fixtures.py; row 1 right-padded from position 15): Mistral's
window in both layers (two key/value heads), Qwen2's in layer 1 only
(`max_window_layers` = 1; q/k/v biases). The windowed layers run the rolling
window of `streaming_sinks` with no sinks; fed whole or in chunks (the window
carried across them), the logits equal the reference; so does the command
line's workdir. Without the window the
logits of positions past it move far off, those before it do not.
"""

import json
import os
import shutil
import subprocess
import sys

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

from longformer_jax.attention.context import AttentionContext
from longformer_jax.convert import hf, loader
from longformer_jax.models.decoder_lm import DecoderLM
from longformer_jax.models.resolved_model import lm_model_config
from longformer_jax.models.model_config import resolve_model
from tests.support.hf_checkpoints import conversion_error, edited_copy
from tests.support.repo_paths import REPO_ROOT as REPO

DATA = os.path.join(REPO, 'tests', 'data', 'hf')
FAMILIES = ('mistral_window', 'qwen2_window')
WINDOW = 8


def fixture(name: str, file: str) -> np.ndarray:
  return np.load(os.path.join(DATA, name, file))


def chunked_logits(model_config, params, name: str, chunks: tuple) -> np.ndarray:
  """`[2, 19, vocab]` logits of the fixture's inputs fed in chunks of the given lengths."""
  tokens, mask = fixture(name, 'input_ids.npy'), fixture(name, 'attention_mask.npy')
  assert sum(chunks) == tokens.shape[1]
  batch = tokens.shape[0]
  model = DecoderLM(model_config)
  states = DecoderLM.init_state(model_config, batch)
  outputs, start = [], 0
  for length in chunks:
    positions = jnp.tile(jnp.arange(start, start + length, dtype=jnp.int32), (batch, 1))
    ctx = AttentionContext(positions=positions, segment_ids=jnp.zeros_like(positions),
                           reset=jnp.full((batch,), start == 0),
                           valid=jnp.asarray(mask[:, start:start + length], bool))
    logits, states, _ = model.apply({'params': params},
                                    jnp.asarray(tokens[:, start:start + length]), states, ctx)
    outputs.append(np.asarray(logits))
    start += length
  return np.concatenate(outputs, axis=1)


def relative_error(name: str, logits: np.ndarray, positions=slice(None)) -> float:
  """Largest |ours - reference| over the valid `positions`, relative to the reference's
  largest magnitude there."""
  reference = fixture(name, 'logits.npy')[:, positions]
  valid = fixture(name, 'attention_mask.npy')[:, positions].astype(bool)
  logits = logits[:, positions, :reference.shape[-1]]
  return np.abs(logits[valid] - reference[valid]).max() / np.abs(reference[valid]).max()


def load(hf_dir: str):
  model_config, params = hf.load(hf_dir)
  return model_config, jax.tree_util.tree_map(jnp.asarray, params)


@pytest.mark.parametrize('name', FAMILIES)
@pytest.mark.parametrize('chunks', [(19,), (5, 5, 5, 4), (1,) * 19])
def test_logits_match_transformers(name, chunks):
  """Whole or in chunks. Qwen2's layer 0 attends to everything: chunked, its vanilla
  attention gets a cache of the whole input (`mem_len`, as eval.py's memories do; the
  import's own is 0); the windowed layers carry their window themselves."""
  model_config, params = load(os.path.join(DATA, name))
  if model_config.layer_schedule and len(chunks) > 1:
    trained = ml_collections.ConfigDict(model_config.to_dict())
    model_config = lm_model_config(trained, trained.vocab_size, mem_len=19)
    resolve_model(model_config.model_values())
  assert relative_error(name, chunked_logits(model_config, params, name, chunks)) <= 1e-4


@pytest.mark.parametrize('name', FAMILIES)
def test_without_the_window_the_far_logits_differ(name, tmp_path):
  """The fixture needs the window: the same weights with every layer attending to the
  whole input match the reference before position 8 only."""
  hf_dir = edited_copy(os.path.join(DATA, name), tmp_path,
                       edit_config=lambda c: c.update(sliding_window=None))
  model_config, params = load(hf_dir)
  assert model_config.attention == 'vanilla' and not model_config.layer_schedule
  logits = chunked_logits(model_config, params, name, (19,))
  assert relative_error(name, logits, slice(0, WINDOW)) <= 1e-4
  assert relative_error(name, logits, slice(WINDOW, None)) > 1e-2


def test_settings_follow_each_familys_rule(tmp_path):
  mistral, _ = hf.load(os.path.join(DATA, 'mistral_window'))
  assert mistral.attention == 'streaming_sinks' and not mistral.layer_schedule
  assert (mistral.streaming_sinks.num_sinks, mistral.streaming_sinks.window) == (0, WINDOW)
  assert mistral.num_kv_heads == 2
  qwen2, _ = hf.load(os.path.join(DATA, 'qwen2_window'))
  assert qwen2.attention == 'vanilla' and qwen2.qkv_bias
  assert qwen2.layer_schedule == {'attention': 'vanilla,streaming_sinks'}

  def settings(name, **edits):
    source = os.path.join(DATA, name)
    with open(os.path.join(source, 'config.json')) as f:
      config = json.load(f)
    config.update(edits)
    config = {k: v for k, v in config.items() if v is not None}
    return loader.family(config).model_settings(config)

  # Qwen2 applies the window only with use_sliding_window (transformers drops it otherwise).
  assert settings('qwen2_window', use_sliding_window=False)['attention'] == 'vanilla'
  # Without layer_types, the layers from max_window_layers on.
  no_types = settings('qwen2_window', layer_types=None, max_window_layers=0)
  assert no_types['attention'] == 'streaming_sinks' and 'layer_schedule' not in no_types
  assert settings('qwen2_window', layer_types=None, max_window_layers=2)['attention'] == 'vanilla'
  # A window as long as the position table never binds: vanilla, as the existing fixtures.
  assert settings('mistral_window', sliding_window=64)['attention'] == 'vanilla'
  assert hf.load(os.path.join(DATA, 'mistral'))[0].attention == 'vanilla'


@pytest.mark.parametrize('edit, words', [
    (dict(sliding_window=0), 'sliding_window=0'),
    (dict(layer_types=['full_attention', 'chunked_attention']), 'layer_types=')])
def test_bad_window_settings_are_named(tmp_path, edit, words):
  name = 'qwen2_window' if 'layer_types' in edit else 'mistral_window'
  hf_dir = edited_copy(os.path.join(DATA, name), tmp_path, edit_config=lambda c: c.update(edit))
  assert words in conversion_error(hf_dir)


def test_cli_workdir_restores_the_windowed_model(tmp_path):
  sys.path.insert(0, REPO)
  import eval as eval_script  # pylint: disable=g-import-not-at-top
  import generate  # pylint: disable=g-import-not-at-top
  from longformer_jax.data.tokenizers import make_tokenizer  # pylint: disable=g-import-not-at-top
  from longformer_jax.parallel.mesh import make_mesh  # pylint: disable=g-import-not-at-top
  workdir = str(tmp_path / 'run')
  result = subprocess.run(
      [sys.executable, '-m', 'longformer_jax.convert.hf', f'--hf_dir={DATA}/mistral_window',
       f'--workdir={workdir}'], cwd=REPO, capture_output=True, text=True, check=False)
  assert result.returncode == 0, result.stderr[-2000:]
  config = generate.run_config(workdir, -1)
  assert config.model.attention == 'streaming_sinks'
  tokenizer = make_tokenizer(config.data)
  params, _, _, _ = eval_script.restore_params(
      config, tokenizer, workdir, make_mesh(config.parallel.mesh_shape),
      config.parallel.logical_axis_rules)
  model_config = lm_model_config(config.model, tokenizer.vocab_size)
  logits = chunked_logits(model_config, jax.device_get(params), 'mistral_window', (10, 9))
  assert relative_error('mistral_window', logits) <= 1e-4
  shutil.rmtree(workdir)
