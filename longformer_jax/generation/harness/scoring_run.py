"""The model the harness scores with: a run read as eval.py reads it, and its memory.

eval.py reads a document chunk by chunk, every layer's memory carried from one
chunk to the next and reset at the document's BOS (evaluation/lm_evaluator.py);
the harness reads each request the same way, with the same chunk length:
`chunk_len` when given, else an import's context (exact within it,
generation/context.py), else the run's training chunk. The memory is the run's own
as trained, or resized (`memory_size`, evaluation/trained_memory.py). A model whose
memory holds nothing (vanilla attention with `model.mem_len=0`, a plain import)
sees each chunk alone: `carries_memory` is False and the backend refuses requests
longer than one chunk rather than score them with a context cut at chunk
boundaries.

For `generate_until` the decoder is generate.py's (generation/run_decoder.py) when
the run is read as it is; with another chunk or memory, the chunk-window decoder of
the scoring model, so that generation and scoring read the same model.
"""

import dataclasses

import jax

from longformer_jax.config.errors import ConfigError
from longformer_jax.evaluation import trained_memory
from longformer_jax.evaluation.model_description import describe_model
from longformer_jax.generation.chunk_window_decoder import ChunkWindowDecoder
from longformer_jax.generation.harness.harness_settings import HarnessSettings
from longformer_jax.generation.run_decoder import (LoadedRun, read_run_config, restore_run,
                                                   run_decoder)
from longformer_jax.models.decoder_lm import DecoderLM
from longformer_jax.models.model_config import resolve_model
from longformer_jax.models.resolved_model import ResolvedModel, lm_model_config
from longformer_jax.tasks.registry import readers, task_for


@dataclasses.dataclass(frozen=True)
class ScoringRun:
  """A loaded run and the model the harness reads requests with.

  Attributes:
    run: the run's config, tokenizer and parameters (generation/run_decoder.py).
    model_config: the scoring model (the run's, its memory resized if asked).
    chunk_len: tokens per chunk.
    carries_memory: whether anything passes from one chunk to the next.
    resized: whether `chunk_len` or the memory differ from the run's own reading.
  """
  run: LoadedRun
  model_config: ResolvedModel
  chunk_len: int
  carries_memory: bool
  resized: bool

  @property
  def fits_chunk(self) -> bool:
    """Whether a batch may be read in a chunk fitted to its longest row (request_scorer.py):
    every layer vanilla causal attention, and no memory."""
    model = self.run.config.model
    return (not self.carries_memory and model.causal and model.attention == 'vanilla'
            and 'attention' not in dict(model.layer_schedule))

  def memory_description(self) -> dict:
    """Which memory and chunks the harness read with (the backend's `get_model_info`)."""
    memory = describe_model(self.model_config)
    return {
        'workdir': self.run.workdir, 'checkpoint_step': self.run.step,
        'attention': memory, 'chunk_len': self.chunk_len,
        'carries_memory': self.carries_memory,
        'memory': (f'{memory}: memory carried across chunks of {self.chunk_len} tokens, '
                   'reset at each request' if self.carries_memory else
                   f'{memory}: no memory; each request must fit one chunk of '
                   f'{self.chunk_len} tokens'),
        'imported_context': (self.run.imported or {}).get('context_len'),
    }

  def decoder(self):
    """The greedy decoder of `generate_until` (module doc)."""
    if not self.resized:
      return run_decoder(self.run)
    return ChunkWindowDecoder(self.model_config, self.run.params, chunk_len=self.chunk_len,
                              pad_id=self.run.tokenizer.pad_id,
                              model_state=self.run.model_state)


def memory_entries(model_config: ResolvedModel) -> int:
  """Elements of one row's memory (every layer's state); 0 when nothing carries over."""
  shapes = jax.eval_shape(lambda: DecoderLM.init_state(model_config, 1))
  return sum(leaf.size for leaf in jax.tree_util.tree_leaves(shapes))


def load_scoring_run(settings: HarnessSettings) -> ScoringRun:
  """Reads `settings.workdir` (checked, then its checkpoint) and builds the scoring model."""
  config = read_run_config(settings.workdir, settings.step)
  if not task_for(config.task).generates_text:
    raise settings.error('workdir', f'{settings.workdir!r} is a run of task {config.task!r}, '
                         f'which has no next-token head; the harness scores language models '
                         f'(task {" or ".join(map(repr, readers("generates_text")))})')
  try:
    run = restore_run(config, settings.workdir)
  except FileNotFoundError as error:        # no checkpoint, or not the step asked for
    name = 'step' if settings.step >= 0 else 'workdir'
    raise settings.error(name, f'{error} (an import: python -m longformer_jax.convert.hf '
                         f'--hf_dir=DIR --workdir={settings.workdir})') from None
  chunk_len = (settings.chunk_len or (run.imported or {}).get('context_len')
               or config.data.chunk_len)
  overrides = trained_memory.model_overrides(config.model, settings.memory_size)
  try:
    model_config = lm_model_config(config.model, run.tokenizer.vocab_size, **overrides)
    resolve_model(model_config.model_values())
    entries = memory_entries(model_config)
  except ConfigError as error:
    raise settings.error('memory_size', f'{settings.memory_size} builds no model ({error})') \
        from None
  resized = bool(overrides) or chunk_len != (
      (run.imported or {}).get('context_len') or config.data.chunk_len)
  return ScoringRun(run=run, model_config=model_config, chunk_len=int(chunk_len),
                    carries_memory=entries > 0, resized=resized)

