"""Eval-time memories on imported checkpoints, against transformers' full-sequence logits.

An imported decoder (tests/data/hf: Llama with grouped-query attention and
llama3 RoPE scaling, Qwen2 with q/k/v biases) is run chunk by chunk (3 chunks
of 4 tokens) with each memory of `eval.memory_sweep`, built the way eval.py
builds it (`memory_sweep.model_overrides`, then every layer checked by
`resolve_model`). A memory that holds every earlier token of the 12 makes the
chunked model exactly the full causal model, so its logits must equal the
reference logits of the whole sequence to 1e-4 relative: XL-style cache
(vanilla `mem_len`), Attendre FIFO (both layer orders, with and without an
LM-Infinite cap longer than the sequence), StreamingLLM sinks + window. A cap
shorter than the sequence must change them; the kNN memory (its retrieved keys
carry no rotation, by the method's design) must give the reference on the
first chunk, before anything is retrieved.
"""

import os

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

from longformer_jax.attention.context import AttentionContext
from longformer_jax.convert import hf
from longformer_jax.evaluation import memory_sweep
from longformer_jax.models.decoder_lm import DecoderLM
from longformer_jax.models.resolved_model import lm_model_config
from longformer_jax.models.model_config import resolve_model
from longformer_jax.models.resolved_model import ResolvedModel
from tests.support.repo_paths import REPO_ROOT as REPO

DATA = os.path.join(REPO, 'tests', 'data', 'hf')
CHUNK = 4

EXACT_SWEEPS = {
    'xl_cache': 'variant=vanilla;memory_size=8',
    'attendre_fifo': 'variant=attendre;policy=fifo;memory_size=8',
    'attendre_paper_order': 'variant=attendre;policy=fifo;memory_size=12;order=insert_first',
    'attendre_long_cap': 'variant=attendre;policy=fifo;memory_size=8;rope_max_distance=11',
    'sinks': 'variant=streaming_sinks;policy=sink;memory_size=8',
}


def fixture(name: str, file: str) -> np.ndarray:
  return np.load(os.path.join(DATA, name, file))


@pytest.fixture(scope='module', params=('llama', 'qwen2'))
def imported(request):
  model_config, params = hf.load(os.path.join(DATA, request.param))
  return request.param, model_config, jax.tree_util.tree_map(jnp.asarray, params)


def point_config(trained: ResolvedModel, spec: str):
  """The eval-time model of the sweep's only point, as eval.py makes and checks it."""
  (point,) = memory_sweep.parse_sweep(spec, CHUNK)
  trained = ml_collections.ConfigDict(trained.to_dict())
  model_config = lm_model_config(trained, trained.vocab_size,
                                 **memory_sweep.model_overrides(point, trained))
  resolve_model(model_config.model_values())
  return model_config


def chunked_logits(model_config, params, name: str) -> np.ndarray:
  """`[2, 12, vocab]` logits of the fixture's inputs fed `CHUNK` tokens at a time."""
  tokens, mask = fixture(name, 'input_ids.npy'), fixture(name, 'attention_mask.npy')
  batch, length = tokens.shape
  model = DecoderLM(model_config)
  apply = jax.jit(model.apply)
  states = DecoderLM.init_state(model_config, batch)
  outputs = []
  for start in range(0, length, CHUNK):
    positions = jnp.tile(jnp.arange(start, start + CHUNK, dtype=jnp.int32), (batch, 1))
    ctx = AttentionContext(positions=positions, segment_ids=jnp.zeros_like(positions),
                           reset=jnp.full((batch,), start == 0),
                           valid=jnp.asarray(mask[:, start:start + CHUNK], bool))
    logits, states, _ = apply({'params': params}, jnp.asarray(tokens[:, start:start + CHUNK]),
                              states, ctx)
    outputs.append(np.asarray(logits))
  return np.concatenate(outputs, axis=1)


def relative_error(name: str, logits: np.ndarray, upto: int | None = None) -> float:
  reference = fixture(name, 'logits.npy')[:, :upto]
  valid = fixture(name, 'attention_mask.npy')[:, :upto].astype(bool)
  logits = logits[:, :upto, :reference.shape[-1]]
  return np.abs(logits[valid] - reference[valid]).max() / np.abs(reference[valid]).max()


@pytest.mark.parametrize('memory', sorted(EXACT_SWEEPS))
def test_a_memory_holding_everything_gives_the_full_model(imported, memory):
  name, trained, params = imported
  model_config = point_config(trained, EXACT_SWEEPS[memory])
  assert relative_error(name, chunked_logits(model_config, params, name)) <= 1e-4


def test_a_short_rope_cap_changes_the_far_logits(imported):
  name, trained, params = imported
  model_config = point_config(trained, 'variant=attendre;policy=fifo;memory_size=8;'
                                       'rope_max_distance=2')
  logits = chunked_logits(model_config, params, name)
  assert relative_error(name, logits, upto=3) <= 1e-4      # distances <= 2: untouched
  assert relative_error(name, logits) > 5e-4


def test_knn_memory_runs_on_grouped_heads(imported):
  name, trained, params = imported
  model_config = point_config(trained, 'variant=memorizing;memory_size=8;top_k=4')
  logits = chunked_logits(model_config, params, name)
  assert np.isfinite(logits).all()
  assert relative_error(name, logits, upto=CHUNK) <= 1e-4   # nothing retrieved yet
  assert relative_error(name, logits) > 1e-3               # retrieved keys: no rotation


def test_learned_positions_refuse_a_rope_cap():
  from longformer_jax.config.errors import ConfigError  # pylint: disable=g-import-not-at-top
  trained, _ = hf.load(os.path.join(DATA, 'gpt2'))
  with pytest.raises(ConfigError, match='rope_max_distance'):
    point_config(trained, 'variant=attendre;policy=fifo;memory_size=8;rope_max_distance=11')
  point_config(trained, 'variant=attendre;policy=lra_max;memory_size=8')
