"""eval.py for fixed-size-example task runs: a checkpoint scored on a whole split, one table.

  classification: accuracy          qa: span F1 and exact match
  seq2seq (LED):  token loss and accuracy, and ROUGE-1/2/L F-measures (over
                  words of the decoded text) of greedy decoding
  image:          bits per dimension (nats per intensity / ln 2)
  sentence_mask:  masked-sentence token loss and accuracy (HIBERT pretraining)
  extractive:     ROUGE-1/2/L F-measures of the top `model.hibert.summary_sentences`
                  sentences (in document order) and the oracle-label accuracy

What each task reports is the task's (tasks/): its `metrics` of the summed
split, `report_extras`, its table `columns` and `report_files`; eval.py
passes the task object. The task, model and data settings are the run's own
(`config.json`); the split is `eval.split` and the step `eval.step` (-1: the
latest). The checkpoint's model state (`TrainState.model_state`, e.g. the Routing
Transformer's centroids) is restored with the parameters and read by the sums.
"""

import json
import os

import jax
import ml_collections

from longformer_jax.checkpoint.checkpointer import Checkpointer
from longformer_jax.checkpoint.storage_bound import StorageBound
from longformer_jax.evaluation.model_description import describe_model
from longformer_jax.evaluation.report_files import fresh_output_dir
from longformer_jax.evaluation.task_evaluator import TaskEvaluator, batch_shardings
from longformer_jax.parallel.mesh import make_mesh
from longformer_jax.train.example_state import abstract_task_state, global_batch_example
from longformer_jax.train.optimizer import make_optimizer
from longformer_jax.train.profiling import run_profiler


def markdown_table(columns: tuple, result: dict) -> str:
  """One row: the model, the task's metrics (`columns`: (metric, column name)), loss and the
  number of examples."""
  header = ['model'] + [name for _, name in columns] + ['loss', 'examples']
  cells = ([result['model']] + [f'{result[key]:.4f}' for key, _ in columns]
           + [f"{result['loss']:.4f}", f"{int(result['examples'])}"])
  return '\n'.join(['| ' + ' | '.join(header) + ' |',
                    '|---|' + '---:|' * (len(header) - 1),
                    '| ' + ' | '.join(cells) + ' |'])


def restore_task_state(config: ml_collections.ConfigDict, workdir: str, task, arrays: dict,
                       mesh) -> tuple:
  """`(model_config, model, state, state_shardings)`: the checkpoint of the run of `task` in
  `workdir` (`config.eval.step`, -1: the latest) in the layout train.py saved, its optimizer
  and its batch size; `arrays`: the split's examples (their shapes only)."""
  tokenizer = task.tokenizer(config.data)
  model_config, model = task.model(config, tokenizer.vocab_size)
  optimizer = make_optimizer(config.optimizer, config.train.num_steps)
  abstract, state_shardings, _ = abstract_task_state(
      model, task.init_arguments, optimizer, config.seed,
      global_batch_example(arrays, config.data.batch_size), mesh,
      config.parallel.logical_axis_rules)
  step = None if config.eval.step < 0 else config.eval.step

  def read():   # None: no checkpoint yet (reported outside the bound, as a usage error)
    with Checkpointer(workdir, config.train.keep_checkpoints, async_save=False) as checkpointer:
      if checkpointer.latest_step() is None:
        return checkpointer.directory, None
      return checkpointer.directory, checkpointer.restore(step, abstract)[0]
  directory, state = StorageBound.of(config).call('restoring the checkpoint in', workdir,
                                                  read, retry=True)
  if state is None:
    raise FileNotFoundError(f'no checkpoint in {directory}; train first')
  return model_config, model, state, state_shardings


def evaluate_task_run(config: ml_collections.ConfigDict, workdir: str, task) -> dict:
  """Scores the checkpoint of the run of `task` (tasks/, `config.task`'s) in `workdir`;
  returns what it writes to metrics.json."""
  tokenizer = task.tokenizer(config.data)
  arrays = task.load_arrays(config, config.eval.split, tokenizer)
  mesh = make_mesh(config.parallel.mesh_shape)
  rules = config.parallel.logical_axis_rules
  model_config, model, state, state_shardings = restore_task_state(config, workdir, task, arrays,
                                                                   mesh)
  batch_size = config.data.eval_batch_size
  evaluator = TaskEvaluator(
      task.metrics, task.sums_fn(config, model), arrays, batch_size=batch_size,
      max_examples=0, shardings=batch_shardings(global_batch_example(arrays, batch_size), mesh,
                                                rules),
      param_shardings=state_shardings.params, mesh=mesh,
      model_state_shardings=state_shardings.model_state)
  profiler = run_profiler(config, workdir, 'eval')
  try:
    metrics = evaluator.evaluate(state.params, state.model_state, profiler)
  finally:
    profiler.close()
  metrics.update(task.report_extras(config, config.eval.split, model, state.params,
                                    evaluator.batches(), tokenizer))
  result = dict(checkpoint_step=int(state.step), split=config.eval.split, task=task.name,
                model=describe_model(model_config), corpus=config.data.corpus, **metrics)
  if jax.process_index() == 0:
    with fresh_output_dir(workdir) as out_dir:
      with open(os.path.join(out_dir, 'metrics.json'), 'w') as f:
        json.dump(result, f, indent=2)
      files = task.report_files(config, model, state.params, out_dir)
    print(f'{config.eval.split} split, checkpoint step {result["checkpoint_step"]}, '
          f'task {task.name}:')
    print(markdown_table(task.columns, result))
    for name, what in files:
      print(f'{what}: {os.path.join(workdir, "eval", name)}')
  return result
