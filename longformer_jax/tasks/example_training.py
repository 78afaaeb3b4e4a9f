"""The training loop's side of a fixed-size-example task (every task but lm).

Examples are fixed-size and independent: the train state has no memory
(`memory=()`), batches are shuffled epochs (`data/task_batches.TaskBatches`)
whose data position is the step alone. Validation scores the whole valid
split (at most `train.eval_max_examples`) with the task's sums and
`metrics` (tasks/); the extractive task adds ROUGE of its top sentences.
A model's non-gradient state (`TrainState.model_state`: the Routing
Transformer's centroids) is updated by every train step and read by
validation (train/model_variables.py).
What differs between the tasks (data, model, sums, initialisation) is asked
of the task object (tasks/base.py).
"""

import functools

from absl import logging
import jax
import ml_collections

from longformer_jax.config.errors import ConfigError
from longformer_jax.data.curriculum_streams import CurriculumStreams
from longformer_jax.data.task_batches import TaskBatches
from longformer_jax.evaluation.model_description import describe_model
from longformer_jax.evaluation.task_evaluator import TaskEvaluator, batch_shardings, to_global
from longformer_jax.parallel import sharding
from longformer_jax.parallel.mesh import make_mesh
from longformer_jax.train import steps
from longformer_jax.train.example_state import abstract_task_state, global_batch_example
from longformer_jax.train.optimizer import learning_rate_schedule, make_optimizer

HF_KEY = 'train.init_from_hf'


class ExampleTraining:
  """A fixed-size-example `task` (tasks/base.ExampleTask) run by the loop (a `loop.TrainingTask`).

  `param_import` fine-tunes imported weights (`train.init_from_hf`): an object
  with `imported(config)` (checks the setting, failing early with a
  `ConfigError` naming the key) and `with_imported_params(config, state)`;
  train.py passes convert/hf_init.py.
  """

  def __init__(self, task, config: ml_collections.ConfigDict, param_import=None):
    self.unit = task.unit
    task.check_init(config)
    if config.train.init_from_hf:
      if param_import is None:
        raise ConfigError(HF_KEY, 'needs an importer of Hugging Face weights (train.py passes '
                          'convert/hf_init.py)')
      param_import.imported(config)     # fails early, naming the key
    self.config = config
    self.task = task
    self.param_import = param_import
    tokenizer = task.tokenizer(config.data)
    train_arrays = task.load_arrays(config, 'train', tokenizer)
    valid_arrays = task.load_arrays(config, 'valid', tokenizer)
    self.batches = TaskBatches(train_arrays, config.data.batch_size, config.seed,
                               jax.process_index(), jax.process_count())
    curriculum = task.curriculum_arrays(config, tokenizer)
    if curriculum:                     # shorter examples first, of the same shapes
      first_arrays, switch = curriculum
      self.batches = CurriculumStreams(
          TaskBatches(first_arrays, config.data.batch_size, config.seed, jax.process_index(),
                      jax.process_count()), self.batches, switch)
      logging.info('Length curriculum: %d steps of %d shorter examples first', switch,
                   len(first_arrays['weight']))
    logging.info('Task %s: %d train, %d valid examples', task.name, len(train_arrays['weight']),
                 len(valid_arrays['weight']))

    model_config, model = task.model(config, tokenizer.vocab_size)
    self.description = f'{task.name} {task.model_kind}, ' + describe_model(model_config)
    num_steps = config.train.num_steps
    optimizer = make_optimizer(config.optimizer, num_steps)
    self.mesh = make_mesh(config.parallel.mesh_shape)
    self.rules = config.parallel.logical_axis_rules
    example = global_batch_example(train_arrays, config.data.batch_size)
    self._abstract_state, state_shardings, self._create_state = (
        abstract_task_state(model, task.init_arguments, optimizer, config.seed, example,
                            self.mesh, self.rules))
    self.shardings = batch_shardings(example, self.mesh, self.rules)
    sums_fn = task.sums_fn(config, model)
    self._train_step = jax.jit(
        functools.partial(steps.task_train_step, sums_fn=sums_fn, optimizer=optimizer,
                          learning_rate_fn=learning_rate_schedule(config.optimizer, num_steps)),
        in_shardings=(state_shardings, self.shardings),
        out_shardings=(state_shardings, sharding.replicated(self.mesh)),
        donate_argnums=0)
    self.evaluator = TaskEvaluator(
        task.metrics, sums_fn, valid_arrays, batch_size=config.data.eval_batch_size,
        max_examples=config.train.eval_max_examples, shardings=self.shardings,
        param_shardings=state_shardings.params, mesh=self.mesh,
        model_state_shardings=state_shardings.model_state)
    self._model = model
    self._optimizer = optimizer
    self._compiled_step = None
    self._next_batch = None

  def abstract_state(self, step: int):
    del step  # one state layout for the whole run
    return self._abstract_state

  def fresh_state(self):
    state = self._create_state(jax.random.PRNGKey(self.config.seed))
    if self.config.train.init_from_hf:
      state = self.param_import.with_imported_params(self.config, state)
    return self.task.initialise(self.config, state, self.mesh, self.rules)

  def state_with_params(self, params):
    state = self._create_state(jax.random.PRNGKey(self.config.seed))
    return state.replace(params=params, opt_state=self._optimizer.init(params))

  def data_state(self) -> dict:
    return self.batches.state()

  def restore_data(self, data_state: dict, step: int) -> None:
    del step  # the data position is the step, saved in `data_state`
    self.batches.restore(data_state)

  def starts_segment(self, step: int) -> bool:
    del step  # shapes never change
    return False

  def enter_segment(self, state, step: int):
    del step
    self._next_batch = self._load_batch()
    self._compiled_step = self._train_step.lower(state, self._next_batch).compile()
    return state

  @property
  def compiled_train_step(self):
    """The train step compiled by `enter_segment` (its `memory_analysis()` is the step's plan)."""
    return self._compiled_step

  def _load_batch(self) -> dict:
    return to_global(self.batches.next_batch(), self.shardings)

  def train_step(self, state):
    batch = self._next_batch if self._next_batch is not None else self._load_batch()
    self._next_batch = None
    state, metrics = self._compiled_step(state, batch)
    return state, metrics, self.config.data.batch_size

  def host_metrics(self, device_metrics) -> dict:
    """The task metrics of the step's batch, its grad norm and learning rate."""
    sums = jax.tree_util.tree_map(float, jax.device_get(device_metrics))
    metrics = self.task.metrics(sums)
    metrics.update(grad_norm=sums['grad_norm'], learning_rate=sums['learning_rate'])
    return metrics

  def evaluate(self, state) -> dict:
    metrics = self.evaluator.evaluate(state.params, state.model_state)
    metrics.update(self.task.training_extras(self.config, 'valid', self._model, state.params,
                                             self.evaluator.batches()))
    return metrics
