"""Task `lm` (the default): next-token prediction on streams of documents, memory across steps.

Rows of a batch are endless streams of documents; the memory (Transformer-XL
cache, kNN memory, ...) and the model state (routing's centroids) are part of
the train state, carried from step to step; `train.phases > 1` trains in
phases of growing chunk length (`train/phases.py`). The loop's side:
`tasks/lm_training.py`; eval.py scores it over memory lengths
(`evaluation/lm_evaluator.py`). The only task that generates text
(generate.py), takes gradient accumulation, and imports Hugging Face decoders
(as a workdir, convert/workdir_cli.py).
"""

import math

from longformer_jax.tasks.base import Task
from longformer_jax.tasks.lm_training import LanguageModelTraining


class LanguageModelTask(Task):
  name = 'lm'
  unit = 'tok'
  model_kind = 'decoder'
  carries_memory = True
  carries_model_state = True
  accumulates_gradients = True
  generates_text = True
  hf_checkpoint = 'decoder'
  data_keys = ('chunks_per_step',)
  train_keys = ('eval_max_tokens', 'phases', 'phase_steps', 'phase_length_factor',
                'phase_window_factor', 'phase_lr_factor')
  eval_keys = ('passkey_grid', 'harness_tasks')
  columns = (('bits_per_token', 'bits/token'),)

  def chunk_lengths(self, data, train, eval_, hibert) -> tuple:
    """The chunk length of every training phase and of evaluation (`eval.chunk_len`)."""
    del hibert
    lengths = {data.chunk_len * train.phase_length_factor ** p for p in range(train.phases)}
    if eval_.chunk_len:
      lengths.add(eval_.chunk_len)
    return tuple(sorted(lengths))

  def metrics(self, totals: dict) -> dict:
    """The train step's metrics (floats) with `bits_per_token` (loss / ln 2)."""
    return dict(totals, bits_per_token=totals['loss'] / math.log(2))

  def training_task(self, config, param_import=None):
    """The loop's `TrainingTask` (a decoder imports as a workdir: no `param_import`)."""
    del param_import
    return LanguageModelTraining(self, config)


TASK = LanguageModelTask()
