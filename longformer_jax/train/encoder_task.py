"""The fixed-size-example tasks of the training loop: classification, qa, seq2seq (LED), image.

Examples are fixed-size and independent: the train state has no memory
(`memory=()`), batches are shuffled epochs (`data/task_batches.TaskBatches`)
whose data position is the step alone. Validation scores the whole valid
split (at most `train.eval_max_examples`): accuracy (classification), span
F1 and exact match (qa), token loss and accuracy (seq2seq;
eval.py adds ROUGE of greedy decoding), bits per dimension (image, a causal
decoder: `train/image_task.py`), HIBERT (`train/hibert_task.py`): masked-sentence
token loss and accuracy (sentence_mask), label accuracy and ROUGE of the top
sentences (extractive; `model.hibert.init_from` starts from a sentence_mask run).
"""

import functools

from absl import logging
import jax
import ml_collections
import numpy as np

from longformer_jax.data.task_batches import TaskBatches
from longformer_jax.data.tokenizers import make_tokenizer
from longformer_jax.evaluation.model_description import describe_model
from longformer_jax.evaluation.task_evaluator import TaskEvaluator, batch_shardings, to_global
from longformer_jax.evaluation.task_metrics import task_metrics
from longformer_jax.parallel import sharding
from longformer_jax.parallel.mesh import make_mesh
from longformer_jax.train import encoder_models, hf_init, hibert_init, hibert_task, steps
from longformer_jax.train.optimizer import learning_rate_schedule, make_optimizer


def global_batch_example(arrays: dict, batch_size: int) -> dict:
  """Zeros of a global batch of `batch_size` rows shaped like `arrays` (for shapes only)."""
  return {name: np.zeros((batch_size,) + value.shape[1:], value.dtype)
          for name, value in arrays.items()}


class EncoderTask:
  """`config.task` in classification | qa | seq2seq | image | sentence_mask | extractive
  (a `loop.TrainingTask`)."""

  unit = 'ex'

  def __init__(self, config: ml_collections.ConfigDict):
    encoder_models.validate_task_config(config)
    hibert_init.check_init_from(config)
    if config.train.init_from_hf:
      hf_init.imported(config)     # fails early, naming the key
    self.config = config
    self.task = config.task
    tokenizer = make_tokenizer(config.data, config.task)
    data_module = encoder_models.TASK_DATA[self.task]
    train_arrays = data_module.load_arrays(config, 'train', tokenizer)
    valid_arrays = data_module.load_arrays(config, 'valid', tokenizer)
    self.batches = TaskBatches(train_arrays, config.data.batch_size, config.seed,
                               jax.process_index(), jax.process_count())
    logging.info('Task %s: %d train, %d valid examples', self.task, self.batches.num_examples,
                 len(valid_arrays['weight']))

    model_config, model = encoder_models.task_model(config, tokenizer.vocab_size)
    kind = 'decoder' if self.task == 'image' else 'encoder'
    self.description = f'{self.task} {kind}, ' + describe_model(model_config)
    num_steps = config.train.num_steps
    optimizer = make_optimizer(config.optimizer, num_steps)
    self.mesh = make_mesh(config.parallel.mesh_shape)
    self.rules = config.parallel.logical_axis_rules
    example = global_batch_example(train_arrays, config.data.batch_size)
    self._abstract_state, state_shardings, self._create_state = (
        encoder_models.abstract_task_state(self.task, model, optimizer, config.seed, example,
                                           self.mesh, self.rules))
    self.shardings = batch_shardings(example, self.mesh, self.rules)
    sums_fn = encoder_models.task_sums_fn(config, model)
    self._train_step = jax.jit(
        functools.partial(steps.task_train_step, sums_fn=sums_fn, optimizer=optimizer,
                          learning_rate_fn=learning_rate_schedule(config.optimizer, num_steps)),
        in_shardings=(state_shardings, self.shardings),
        out_shardings=(state_shardings, sharding.replicated(self.mesh)),
        donate_argnums=0)
    self.evaluator = TaskEvaluator(
        self.task, sums_fn, valid_arrays, batch_size=config.data.eval_batch_size,
        max_examples=config.train.eval_max_examples, shardings=self.shardings,
        param_shardings=state_shardings.params, mesh=self.mesh)
    self._model = model
    self._compiled_step = None
    self._next_batch = None

  def abstract_state(self, step: int):
    del step  # one state layout for the whole run
    return self._abstract_state

  def fresh_state(self):
    state = self._create_state(jax.random.PRNGKey(self.config.seed))
    state = hf_init.with_imported_params(self.config, state)
    return hibert_init.with_pretrained_encoder(self.config, state, self.mesh, self.rules)

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
    metrics = task_metrics(self.task, sums)
    metrics.update(grad_norm=sums['grad_norm'], learning_rate=sums['learning_rate'])
    return metrics

  def evaluate(self, state) -> dict:
    metrics = self.evaluator.evaluate(state.params)
    if self.task == 'extractive':
      metrics.update(hibert_task.extractive_rouge(self.config, 'valid', self._model, state.params,
                                                  self.evaluator.batches()))
    return metrics
