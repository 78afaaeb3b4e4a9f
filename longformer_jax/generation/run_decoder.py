"""A run directory read for decoding, and generate.py's decoder of it.

`read_run_config` is the run's `config.json` at the checkpoint's phase, checked
as eval.py checks it; `restore_run` reads the checkpoint's parameters (and model
state) onto one device with the run's tokenizer (`LoadedRun`); `run_decoder`
builds the decoder generate.py decodes with (`load_decoder`: all three):

- `kv_cache > 0`: a key/value cache of that many tokens per layer, one token per
  step (generation/kv_cache.py);
- `kv_cache = 0`: the chunk-window decoder of the run's own chunks;
- `kv_cache = -1`: for an imported checkpoint (its workdir holds hf_import.json),
  exact within its context (generation/context.py); else as 0.

The lm-evaluation-harness backend (generation/harness/) reads a run through the same
functions, so its greedy decoding is generate.py's.
"""

import dataclasses
from typing import Any, Optional

import jax
import ml_collections

from longformer_jax.checkpoint.resume_checks import CheckpointMismatchError
from longformer_jax.config.errors import UserError
from longformer_jax.data.tokenizers import make_tokenizer
from longformer_jax.evaluation.run_restore import restore_params
from longformer_jax.experiment_config import validate_config
from longformer_jax.generation.chunk_window_decoder import ChunkWindowDecoder
from longformer_jax.generation.context import NoticeAtContext, exact_decoding, read_import
from longformer_jax.generation.generation_checks import check_can_generate
from longformer_jax.generation.kv_cache import kv_cache_model_config
from longformer_jax.generation.saved_run import config_mismatch_message, run_config
from longformer_jax.models.resolved_model import lm_model_config
from longformer_jax.parallel.mesh import make_mesh


@dataclasses.dataclass(frozen=True)
class LoadedRun:
  """A run's checked config and checkpoint, on one device.

  Attributes:
    workdir: the run directory.
    config: its config (checked; a phased run at the checkpoint's phase).
    tokenizer: the run's tokenizer (byte level, SentencePiece or a tokenizer.json).
    params: the checkpoint's parameters on the first device.
    model_state: its non-gradient model state (`{}` for most models).
    step: the checkpoint step read.
    imported: the workdir's hf_import.json (an imported checkpoint), else None.
  """
  workdir: str
  config: ml_collections.ConfigDict
  tokenizer: Any
  params: Any
  model_state: dict
  step: int
  imported: Optional[dict]


def read_run_config(workdir: str, step: int = -1) -> ml_collections.ConfigDict:
  """The run's config at the phase of checkpoint `step` (-1: the latest), checked (an old
  run's config completed in place)."""
  config = run_config(workdir, step)
  validate_config(config, jax.device_count())
  return config


def restore_run(config: ml_collections.ConfigDict, workdir: str) -> LoadedRun:
  """The checkpoint `config.eval.step` of `workdir` (the latest when -1) on one device."""
  tokenizer = make_tokenizer(config.data)
  mesh = make_mesh(config.parallel.mesh_shape)
  try:
    params, _, step, model_state = restore_params(
        config, tokenizer, workdir, mesh, config.parallel.logical_axis_rules)
  except CheckpointMismatchError as error:
    raise UserError(config_mismatch_message(workdir, error)) from None
  params, model_state = jax.device_put(jax.device_get((params, model_state)), jax.devices()[0])
  return LoadedRun(workdir=workdir, config=config, tokenizer=tokenizer, params=params,
                   model_state=model_state or {}, step=int(step), imported=read_import(workdir))


def run_decoder(run: LoadedRun, kv_cache: int = -1):
  """generate.py's decoder of `run` (module doc for `kv_cache`): a `ChunkWindowDecoder`, or
  for an imported checkpoint decoded exactly, one that notices passing its context."""
  model_config = lm_model_config(run.config.model, run.tokenizer.vocab_size)
  chunk_len, notice = run.config.data.chunk_len, ''
  if run.imported and kv_cache < 0:        # exact within the checkpoint's context
    kv_cache, chunk_len, notice = exact_decoding(run.config.model, run.imported['context_len'])
  if kv_cache > 0 or kv_cache < -1:
    model_config = kv_cache_model_config(run.config.model, run.tokenizer.vocab_size, kv_cache)
    chunk_len = 1
  decoder = ChunkWindowDecoder(model_config, run.params, chunk_len=chunk_len,
                               pad_id=run.tokenizer.pad_id, model_state=run.model_state)
  if notice:
    decoder = NoticeAtContext(decoder, run.imported['context_len'], notice)
  return decoder


def load_decoder(workdir: str, step: int = -1, kv_cache: int = -1):
  """`(decoder, tokenizer, checkpoint step)` of the run in `workdir`; a model that cannot
  generate is refused before its checkpoint is read (`generation_checks.py`)."""
  config = read_run_config(workdir, step)
  check_can_generate(config)
  run = restore_run(config, workdir)
  return run_decoder(run, kv_cache), run.tokenizer, run.step
