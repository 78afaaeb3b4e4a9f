"""eval.py for encoder-task runs: a checkpoint scored on a whole split, one table, metrics.json.

  classification: accuracy          qa: span F1 and exact match
  seq2seq (LED):  token loss and accuracy, and ROUGE-1/2/L F-measures (over
                  words of the decoded text) of greedy decoding
  image:          bits per dimension (nats per intensity / ln 2)
  sentence_mask:  masked-sentence token loss and accuracy (HIBERT pretraining)
  extractive:     ROUGE-1/2/L F-measures of the top `model.hibert.summary_sentences`
                  sentences (in document order) and the oracle-label accuracy

The task, model and data settings are the run's own (`config.json`); the
split is `eval.split` and the step `eval.step` (-1: the latest).
"""

import json
import os

import jax
import ml_collections

from longformer_jax.checkpoint.checkpointer import Checkpointer
from longformer_jax.data.tokenizers import make_tokenizer
from longformer_jax.evaluation import image_sampling
from longformer_jax.evaluation.greedy_decoding import rouge_of_batches
from longformer_jax.evaluation.model_description import describe_model
from longformer_jax.evaluation.report_files import fresh_output_dir
from longformer_jax.evaluation.task_evaluator import TaskEvaluator, batch_shardings
from longformer_jax.parallel.mesh import make_mesh
from longformer_jax.train import encoder_models, hibert_task
from longformer_jax.train.encoder_task import global_batch_example
from longformer_jax.train.optimizer import make_optimizer

# (metric, column name) of the table, per task; `loss` and `examples` in every table.
TASK_COLUMNS = {
    'classification': (('accuracy', 'accuracy'),),
    'qa': (('span_f1', 'span F1'), ('exact_match', 'exact match')),
    'seq2seq': (('token_accuracy', 'token accuracy'), ('rouge1', 'ROUGE-1'),
                ('rouge2', 'ROUGE-2'), ('rougeL', 'ROUGE-L')),
    'image': (('bits_per_dim', 'bits/dim'), ('intensity_accuracy', 'intensity accuracy')),
    'sentence_mask': (('token_accuracy', 'masked token accuracy'),),
    'extractive': (('rouge1', 'ROUGE-1'), ('rouge2', 'ROUGE-2'), ('rougeL', 'ROUGE-L'),
                   ('label_accuracy', 'label accuracy')),
}


def markdown_table(task: str, result: dict) -> str:
  """One row: the model, the task's metrics, loss and the number of examples."""
  columns = TASK_COLUMNS[task]
  header = ['model'] + [name for _, name in columns] + ['loss', 'examples']
  cells = ([result['model']] + [f'{result[key]:.4f}' for key, _ in columns]
           + [f"{result['loss']:.4f}", f"{int(result['examples'])}"])
  return '\n'.join(['| ' + ' | '.join(header) + ' |',
                    '|---|' + '---:|' * (len(header) - 1),
                    '| ' + ' | '.join(cells) + ' |'])


def evaluate_task_run(config: ml_collections.ConfigDict, workdir: str) -> dict:
  """Scores the checkpoint of the task run in `workdir`; returns what it writes to metrics.json."""
  task = config.task
  tokenizer = make_tokenizer(config.data, config.task)
  arrays = encoder_models.TASK_DATA[task].load_arrays(config, config.eval.split, tokenizer)
  model_config, model = encoder_models.task_model(config, tokenizer.vocab_size)
  mesh = make_mesh(config.parallel.mesh_shape)
  rules = config.parallel.logical_axis_rules
  # The layout train.py saved: its optimizer and its batch size.
  optimizer = make_optimizer(config.optimizer, config.train.num_steps)
  abstract, state_shardings, _ = encoder_models.abstract_task_state(
      task, model, optimizer, config.seed, global_batch_example(arrays, config.data.batch_size),
      mesh, rules)
  step = None if config.eval.step < 0 else config.eval.step
  with Checkpointer(workdir, config.train.keep_checkpoints, async_save=False) as checkpointer:
    if checkpointer.latest_step() is None:
      raise FileNotFoundError(f'no checkpoint in {checkpointer.directory}; train first')
    state, _ = checkpointer.restore(step, abstract)
  batch_size = config.data.eval_batch_size
  evaluator = TaskEvaluator(
      task, encoder_models.task_sums_fn(config, model), arrays, batch_size=batch_size,
      max_examples=0, shardings=batch_shardings(global_batch_example(arrays, batch_size), mesh,
                                                rules),
      param_shardings=state_shardings.params, mesh=mesh)
  metrics = evaluator.evaluate(state.params)
  if task == 'seq2seq':
    metrics.update(rouge_of_batches(model, state.params, evaluator.batches(), tokenizer))
  if task == 'extractive':
    metrics.update(hibert_task.extractive_rouge(config, config.eval.split, model, state.params,
                                                evaluator.batches()))
  result = dict(checkpoint_step=int(state.step), split=config.eval.split, task=task,
                model=describe_model(model_config), corpus=config.data.corpus, **metrics)
  if jax.process_index() == 0:
    with fresh_output_dir(workdir) as out_dir:
      with open(os.path.join(out_dir, 'metrics.json'), 'w') as f:
        json.dump(result, f, indent=2)
      if task == 'image' and config.eval.image_samples:
        image_sampling.save_samples(config, model, state.params,
                                    os.path.join(out_dir, 'samples.png'))
    print(f'{config.eval.split} split, checkpoint step {result["checkpoint_step"]}, '
          f'task {task}:')
    print(markdown_table(task, result))
    if task == 'image' and config.eval.image_samples:
      print(f'{config.eval.image_samples} samples: {os.path.join(workdir, "eval", "samples.png")}')
  return result
