"""What a task is (`config.task`): the facts, checks, data, model, sums and reports it owns.

A task is one object (`tasks/registry.py` maps its name to it). The training
loop, train.py, eval.py, the config checks, the memory check, the importers
and generation ask it; none of them switches on the task's name.

  facts     `unit` of throughput; `model_kind` in the log; whether the state
            `carries_memory` across steps or `carries_model_state`, whether
            the task `accumulates_gradients`, `needs_bos`, `generates_text`;
            `hf_checkpoint`: the Hugging Face checkpoints it fine-tunes from
  keys      `data_keys`, `train_keys`, `model_keys`, `hibert_keys`, `eval_keys`:
            of the settings only some tasks read, those this task reads (any
            other one set is a `ConfigError`, experiment_config.py)
  checks    `chunk_lengths`, `check_data`, `check_model_values`, `check_model`
  data      `tokenizer(data_config)`; `load_arrays(config, split, tokenizer) -> {name: [n, ...]}`
  model     `model(config, vocab_size) -> (model_config, model)` and
            `init_arguments(batch)`, the model's positional arguments
  training  `training_task(config, param_import)`: the loop's `TrainingTask`;
            `check_init(config)` and `initialise(config, state, mesh, rules)`
            start from a checkpoint (HIBERT's `model.hibert.init_from`)
  sums      `sums_fn(config, model) -> (variables, batch, rngs, deterministic) -> sums`
            (float32 scalars: `loss_sum` over `count`, `aux_objective`, ...)
            and `metrics(totals)`: floats with `loss`, `examples` and `columns`.
            `variables` is a `ModelVariables` (train/model_variables.py): the sums
            apply the model with `variables.apply(model, *args, rngs=rngs)` (never
            `model.apply({'params': ...})`) and read parameters, if they need them, as
            `variables.params`; in training that apply updates the model state
            (`model_state`), which the train step reads back from `variables`
  reports   `columns` ((metric, column name) of eval.py's table),
            `training_extras` and `report_extras` (metrics beyond the sums,
            e.g. ROUGE, in the loop's validation and in eval.py) and
            `report_files` (files beside metrics.json, e.g. image samples)

`ExampleTask` is the base of the fixed-size-example tasks (every task but
lm): independent examples, no memory, one loss per example batch. It carries
model state (the Routing Transformer's centroids) when its model has it; a task
whose other hooks apply the model with the parameters alone (a report that
decodes, samples or ranks) sets `carries_model_state = False`.
"""

import jax
import jax.numpy as jnp
import ml_collections
import optax

from longformer_jax.data.tokenizers import make_tokenizer
from longformer_jax.models.encoder import encoder_context
from longformer_jax.models.resolved_model import encoder_model_config
from longformer_jax.tasks.example_training import ExampleTraining
from longformer_jax.train.lm_objective import weighted_aux_losses


class Task:
  """The defaults every task starts from (see the module docstring)."""
  name = ''
  unit = 'ex'                    # throughput unit: 'tok' (tokens) | 'ex' (examples)
  model_kind = 'encoder'         # 'encoder' | 'decoder', the log's word for the model
  carries_memory = False         # the train state keeps memory from step to step
  carries_model_state = False    # the train state keeps non-gradient model state (routing)
  accumulates_gradients = False  # optimizer.grad_accum_steps > 1 is allowed
  needs_bos = True               # the tokenizer must have a beginning-of-text token
  generates_text = False         # the model has a next-token head (generate.py)
  hf_checkpoint = ''             # 'decoder' | 'encoder' | 'encoder_decoder': HF imports it takes
  data_keys = ()
  train_keys = ()
  model_keys = ()
  hibert_keys = ()
  eval_keys = ()
  columns = ()
  extra_metrics = ()             # columns that `report_extras` adds (not `metrics`)

  def tokenizer(self, data_config: ml_collections.ConfigDict):
    """`config.data`'s tokenizer; one without BOS only if the task does not `needs_bos`."""
    return make_tokenizer(data_config, needs_bos=self.needs_bos, task=self.name)

  def chunk_lengths(self, data, train, eval_, hibert) -> tuple:
    """Every chunk length the model will see (the model config checks the attention for them)."""
    del train, eval_, hibert
    return (data.seq_len,)

  def check_data(self, data) -> None:
    """Checks of the data section this task needs beyond the section's own."""

  def check_model_values(self, model_values: dict) -> None:
    """Checks of the given (unresolved) model settings."""

  def check_model(self, data, model: dict) -> None:
    """Checks of the resolved model section (a plain dict) for this task."""

  def complete_model(self, model: dict, hibert) -> None:
    """Adds the task's own model sections to the resolved `model` (HIBERT: `model.hibert`)."""

  def hf_settings(self, data: dict, model: dict, settings: dict) -> None:
    """Adds the task's settings to the `data` and `model` values of a config that fine-tunes an
    imported checkpoint with model `settings` (convert/workdir_cli.py)."""

  def check_init(self, config: ml_collections.ConfigDict) -> None:
    """Fails early (`ConfigError`) if the state cannot start as configured."""

  def initialise(self, config: ml_collections.ConfigDict, state, mesh, rules):
    """A fresh `state` with whatever the task takes from elsewhere (a pretraining run)."""
    del config, mesh, rules
    return state

  def training_extras(self, config, split: str, model, params, batches) -> dict:
    """Metrics beyond the sums of the training loop's validation (HIBERT extractive: ROUGE)."""
    del config, split, model, params, batches
    return {}

  def report_extras(self, config, split: str, model, params, batches, tokenizer) -> dict:
    """Metrics beyond the sums of a whole split (e.g. ROUGE of decoded text)."""
    del config, split, model, params, batches, tokenizer
    return {}

  def report_files(self, config, model, params, out_dir: str) -> list:
    """Writes files beside metrics.json into `out_dir`; returns `[(file name, what it holds)]`."""
    del config, model, params, out_dir
    return []

  def metrics(self, totals: dict) -> dict:
    """The metrics (floats) of summed `totals` of a batch or a split: `loss`, the `columns`."""
    raise NotImplementedError

  def training_task(self, config: ml_collections.ConfigDict, param_import=None):
    """The loop's `TrainingTask` (train/loop.py) for `config`."""
    raise NotImplementedError


class ExampleTask(Task):
  """A fixed-size-example task: `data_module.load_arrays`, an encoder `model_class` with the
  global tokens the task needs, the loop's `ExampleTraining` (tasks/example_training.py)."""
  data_module = None
  model_class = None
  carries_model_state = True     # the sums apply the model through `ModelVariables`
  train_keys = ('eval_max_examples',)

  def load_arrays(self, config: ml_collections.ConfigDict, split: str, tokenizer) -> dict:
    """The split's examples, `{name: [num_examples, ...]}` (every array has the example axis)."""
    return self.data_module.load_arrays(config, split, tokenizer)

  def curriculum_arrays(self, config: ml_collections.ConfigDict, tokenizer):
    """`(arrays, steps)`: training examples read for the first `steps` steps, of the same
    shapes as the split's (a length curriculum); None for a task without one."""
    curriculum = getattr(self.data_module, 'load_curriculum_arrays', None)
    return curriculum(config, tokenizer) if curriculum else None

  def global_tokens(self, config: ml_collections.ConfigDict) -> int:
    """Global tokens per example: [CLS] (QA: [CLS] question [SEP])."""
    del config
    return 1

  def model(self, config: ml_collections.ConfigDict, vocab_size: int):
    """`(model_config, model)`; `model.longformer.global_tokens = 0` becomes the task's number
    of global tokens (`global_tokens`), the capacity Longformer attention reserves."""
    overrides = {}
    longformer = config.model.longformer
    if not longformer.global_tokens:
      overrides['longformer'] = dict(longformer.to_dict(), global_tokens=self.global_tokens(config))
    model_config = encoder_model_config(config.model, vocab_size, **overrides)
    return model_config, self.model_class(model_config)

  def init_arguments(self, batch: dict) -> tuple:
    """The positional arguments of the model's `__call__` for `batch` (for `init`)."""
    return batch['inputs'], encoder_context(batch['input_mask'], batch['global_flags'], True)

  def metrics(self, totals: dict) -> dict:
    """`loss` (nats per `count`), `examples` and the task's metrics from summed `totals`."""
    count = max(totals['count'], 1.0)
    return {'loss': totals['loss_sum'] / count,
            'examples': totals['examples'] if 'examples' in totals else totals['count']}

  def training_task(self, config: ml_collections.ConfigDict, param_import=None):
    """The loop's `TrainingTask` for `config` (`param_import`: see `ExampleTraining`)."""
    return ExampleTraining(self, config, param_import)


def token_metrics(metrics: dict, totals: dict) -> dict:
  """`metrics` plus `token_accuracy` and `tokens` (per-token tasks)."""
  count = max(totals['count'], 1.0)
  metrics.update(token_accuracy=totals['correct'] / count, tokens=totals['count'])
  return metrics


def token_sums(model, logits: jax.Array, aux, targets: jax.Array, mask: jax.Array,
               weight: jax.Array) -> dict:
  """The sums of a per-token task's batch (image, seq2seq, sentence_mask).

  Args:
    model: the task's model (its `config.aux_loss_weights` weigh `aux`).
    logits: `[..., vocab]` float; targets: `[...]` int; mask: `[...]` float, 0 where a token
      does not count (padding, a padded example); weight: `[b]`, 1 for a real example.
  Returns:
    `loss_sum` (nats) and `correct` (argmax hits) over the `count` masked tokens,
    `aux_objective`, `examples`.
  """
  nll = optax.softmax_cross_entropy_with_integer_labels(logits, targets)
  correct = (jnp.argmax(logits, axis=-1) == targets).astype(jnp.float32)
  aux_objective, _ = weighted_aux_losses(aux, model.config.aux_loss_weights)
  return {'loss_sum': jnp.sum(nll * mask), 'count': jnp.sum(mask),
          'aux_objective': aux_objective, 'correct': jnp.sum(correct * mask),
          'examples': jnp.sum(weight)}
