"""Evaluates a checkpoint of any run: language models over memory lengths, encoder tasks.

Language models (`task` 'lm'): bits per byte / token and perplexity on
held-out documents, over one or more memory lengths or a memory sweep.
Encoder tasks: accuracy (classification), span F1 and exact match (qa),
ROUGE-1/2/L of greedy decoding (seq2seq, LED); the image task: bits per
dimension; HIBERT: masked-sentence token accuracy (sentence_mask), ROUGE-1/2/L
of the top sentences (extractive); what each task reports is its own
(`longformer_jax/tasks/`, run by `longformer_jax/evaluation/task_report.py`).
Every evaluation replaces the report files of the previous one in `DIR/eval`
(evaluation/report_files.py).

  python eval.py                                     # default workdir, latest step
  python eval.py --workdir=DIR --config.eval.mem_lens=0,128,512 \
      --config.eval.chunk_len=128 --config.eval.split=test [--config.eval.step=N]

The model and data settings come from the run's own `DIR/config.json`
(written by train.py), so a checkpoint is always read with the architecture
it was trained with; `--config.eval.*` and `--config.parallel.*` come from
the command line. A command line that would change the architecture
(`--config.model.*`, `--config.data.tokenizer`,
`--config.data.sentencepiece_model`, or a `--config` file whose model
differs) is refused, naming the settings, and so is any other override outside
`eval` and `parallel` (eval.py would not read it; the evaluation batch is
`--config.eval.batch_size`). Memory length is a free choice at evaluation time
(Transformer-XL evaluates with a longer memory than it trained with; 0 means
no memory). Prints a table and writes `DIR/eval/metrics.json` and, for
several memory lengths, `DIR/eval/bits_per_byte_vs_mem_len.png`.

Memory sweep: the memory variant, size and eviction policy are free choices
too (a model trained with vanilla attention and no memory, evaluated with an
Attendre / Memorizing / StreamingLLM memory), swept in one command:

  python eval.py --config=configs/short_context.py --workdir=DIR \
      --config.eval.memory_sweep='variant=attendre;policy=fifo,lra_max,lfa;memory_size=128,512'

writes `DIR/eval/memory_sweep.{json,md,png}` (longformer_jax/evaluation/memory_sweep.py
documents the flag) instead of metrics.json.

Passkey retrieval: `--config.eval.passkey_grid='lengths=256,1024,4096;memories=none,xl,sinks'`
scores a passkey model (configs/passkey.py) over document lengths x key depths for
each eval-time memory, and writes `DIR/eval/passkey_grid.json` and one heat map
`DIR/eval/passkey_grid_<memory>.png` per memory instead of metrics.json
(longformer_jax/evaluation/passkey_grid.py documents the flag).

lm-evaluation-harness tasks: `--config.eval.harness_tasks=passkey_4k,hellaswag` scores the
run on lm-eval tasks with its own memory instead and writes `DIR/harness/results.json`
(longformer_jax/generation/harness/; also `python -m longformer_jax.generation.harness`).

Far recurrences: `--config.eval.far_distance=D` (D > 0) also scores, alone,
the targets whose bigram last occurred more than D tokens back in the
document, the ones only a far-reaching memory helps to copy
(longformer_jax/data/far_recurrences.py): `far_bits_per_byte` in every row.
"""

import json
import os

if __name__ == '__main__':
  from longformer_jax.cpu_malloc import reexec_with_cpu_malloc_settings
  reexec_with_cpu_malloc_settings()

from absl import app, flags, logging
import jax
import ml_collections

from longformer_jax import command_line
from longformer_jax.config.errors import ConfigError
from longformer_jax.experiment_config import parse_int_list, validate_config
from longformer_jax.generation.context import read_import
from longformer_jax.generation.harness.harness_settings import HarnessSettings
from longformer_jax.models.model_config import resolve_model
from longformer_jax.data.corpus import load_corpus, tokenize_documents
from longformer_jax.data.tokenizers import make_tokenizer
from longformer_jax.models.decoder_lm import DecoderLM
from longformer_jax.models.resolved_model import ResolvedModel, lm_model_config
from longformer_jax.parallel import distributed
from longformer_jax.parallel.mesh import make_mesh
from longformer_jax.parallel.parallel_config import ParallelConfig
from longformer_jax.evaluation import memory_sweep, passkey_grid, span_report
from longformer_jax.evaluation.architecture_overrides import (architecture_overrides,
                                                              given_settings, unread_overrides)
from longformer_jax.evaluation.model_description import describe_model
from longformer_jax.evaluation.report_files import fresh_output_dir
from longformer_jax.checkpoint.storage_bound import StorageBound
from longformer_jax.evaluation.run_restore import (at_checkpoint_phase, check_saved_run,
                                                   restore_params, saved_config)
from longformer_jax.storage import paths
from longformer_jax.evaluation.task_report import evaluate_task_run
from longformer_jax.tasks.registry import readers, task_for, task_keys
from longformer_jax.evaluation.lm_evaluator import Evaluator
from longformer_jax.evaluation.line_plots import save_line_plot
from longformer_jax.train.profiling import run_profiler
from longformer_jax.train.quiet_logs import show_own_info_only


def run_config(cli_config: ml_collections.ConfigDict, workdir: str,
               device_count: int | None = None) -> ml_collections.ConfigDict:
  """The checked config eval.py evaluates `workdir` with: its `config.json` (any layout)
  at the checkpoint's phase, with the command line's `eval` and `parallel` sections."""
  config = at_checkpoint_phase(training_config(cli_config, workdir), workdir)
  return validate_config(config, device_count)


def training_config(cli_config: ml_collections.ConfigDict, workdir: str) -> ml_collections.ConfigDict:
  """The run's saved config with the command line's `eval`, `parallel` and `checkpoint`
  sections (`eval.batch_size > 0` replaces the run's `data.eval_batch_size`; for an
  imported checkpoint, `eval.chunk_len = 0` means its context, generation/context.py)."""
  # The storage reads end within the command line's checkpoint.storage_timeout_s (status 75).
  saved, imported = StorageBound.of(cli_config).call(
      'reading the run in', workdir,
      lambda: (saved_config(check_saved_run(workdir), log=True), read_import(workdir)),
      retry=True)
  config = ml_collections.ConfigDict(saved)
  config.eval = cli_config.eval
  config.parallel = cli_config.parallel
  if cli_config.get('checkpoint') is not None:   # the reader's own storage bound
    config.checkpoint = cli_config.checkpoint
  if imported and not config.eval.chunk_len:   # an imported checkpoint: exact within its context
    config.eval.chunk_len = imported['context_len']
  if config.eval.batch_size:
    config.data.eval_batch_size = config.eval.batch_size
  return config


def markdown_table(rows: list[dict]) -> str:
  """One line per evaluated model (memory length); far-recurrence columns when scored."""
  far = 'far_bits_per_byte' in rows[0]
  lines = ['| model | chunk | loss (nats/token) | bits/token | bits/byte | perplexity | tokens |'
           + (' far bits/byte | far tokens |' if far else ''),
           '|---|---:|---:|---:|---:|---:|---:|' + ('---:|---:|' if far else '')]
  for r in rows:
    lines.append(f"| {r['model']} | {r['chunk_len']} | {r['loss']:.4f} | "
                 f"{r['bits_per_token']:.4f} | {r['bits_per_byte']:.4f} | "
                 f"{r['perplexity']:.3f} | {int(r['tokens'])} |"
                 + (f" {r['far_bits_per_byte']:.4f} | {int(r['far_tokens'])} |" if far else ''))
  return '\n'.join(lines)


def plot_bits_per_byte(rows: list[dict], path: str, title: str) -> None:
  series = [([r['mem_len'] for r in rows], [r['bits_per_byte'] for r in rows], None)]
  save_line_plot(series, path, xlabel='evaluation mem_len', ylabel='bits per byte', title=title)


def check_eval_keys(config: ml_collections.ConfigDict, task) -> None:
  """An `eval` setting only other tasks read (their `eval_keys`) is an error, naming the key."""
  for name in task_keys('eval_keys'):
    value = config.eval[name]
    if value and name not in task.eval_keys:
      shown = f'{value} ' if isinstance(value, int) else ''
      raise ConfigError(f'eval.{name}', f'{shown}is read only by task '
                        f'{" or ".join(repr(n) for n in readers("eval_keys", name))} '
                        f"(this run's task is {config.task!r})")


def evaluate_run(cli_config: ml_collections.ConfigDict, workdir: str) -> dict:
  """Evaluates the run in `workdir`; returns what it writes to metrics.json."""
  parallel = cli_config.get('parallel')
  distributed.initialize(ParallelConfig.build(parallel.to_dict() if parallel else None, 'parallel'))
  config = run_config(cli_config, workdir, jax.device_count())
  task = task_for(config.task)
  check_eval_keys(config, task)
  if not task.carries_memory:      # every task but lm: fixed-size examples
    return evaluate_task_run(config, workdir, task)
  if config.eval.harness_tasks:
    # deferred: lm-eval takes seconds to import, and only eval.harness_tasks reads it
    from longformer_jax.generation.harness.task_run import evaluate_workdir
    return evaluate_workdir(HarnessSettings.from_eval_config(config.eval, workdir))
  mem_lens = parse_int_list(config.eval.mem_lens, 'eval.mem_lens') or [config.model.mem_len]
  chunk_len = config.eval.chunk_len or config.data.chunk_len
  tokenizer = make_tokenizer(config.data)
  documents = tokenize_documents(tokenizer, load_corpus(config.data, config.eval.split),
                                 config.data.skip_undecodable)
  mesh = make_mesh(config.parallel.mesh_shape)
  rules = config.parallel.logical_axis_rules
  params, param_shardings, step, model_state = restore_params(config, tokenizer, workdir, mesh,
                                                              rules)
  if config.eval.passkey_grid:
    return passkey_grid.evaluate_run_grid(config, workdir, tokenizer, mesh, rules, params,
                                          param_shardings, step, model_state)
  if config.eval.memory_sweep:
    return evaluate_memory_sweep(config, workdir, tokenizer, documents, mesh, rules, params,
                                 param_shardings, step, model_state)

  rows = []
  profiler = run_profiler(config, workdir, 'eval')    # the first memory length's batches
  for mem_len in mem_lens:
    model_config = lm_model_config(config.model, tokenizer.vocab_size, mem_len=mem_len)
    evaluator = Evaluator(model_config, tokenizer, batch_size=config.data.eval_batch_size,
                          chunk_len=chunk_len, mesh=mesh, rules=rules,
                          param_shardings=param_shardings,
                          far_distance=config.eval.far_distance)
    try:
      metrics = evaluator.evaluate(params, documents, config.eval.max_tokens, model_state,
                                   profiler)
    finally:
      profiler.close()
    rows.append(dict(model=describe_model(model_config), mem_len=mem_len, chunk_len=chunk_len,
                     **metrics))
    logging.info('%s: %.4f bits/byte', rows[-1]['model'], metrics['bits_per_byte'])

  described = describe_model(config.model)
  result = dict(rows[0], checkpoint_step=step, split=config.eval.split,
                attention=config.model.attention, corpus=config.data.corpus,
                tokenizer=config.data.tokenizer, by_mem_len=rows)
  spans = span_report.learned_spans(params, lm_model_config(config.model, tokenizer.vocab_size))
  if spans:
    result['learned_spans'] = spans
  if jax.process_index() == 0:
    with fresh_output_dir(workdir) as out_dir:
      with open(os.path.join(out_dir, 'metrics.json'), 'w') as f:
        json.dump(result, f, indent=2)
      if len(rows) > 1:
        plot_bits_per_byte(rows, os.path.join(out_dir, 'bits_per_byte_vs_mem_len.png'),
                           f'{config.model.attention}, step {step}, {config.eval.split}')
      if spans:
        write_span_report(spans, out_dir, f'learned spans, step {step}')
    print(f'{config.eval.split} split, checkpoint step {step}, trained: {described}')
    print(markdown_table(rows))
  return result


def write_span_report(spans: list, out_dir: str, title: str) -> None:
  """Adaptive-Span runs: each head's learned span, as `spans.json`, a table and `spans.png`."""
  with open(os.path.join(out_dir, 'spans.json'), 'w') as f:
    json.dump(spans, f, indent=2)
  span_report.plot_spans(spans, os.path.join(out_dir, 'spans.png'), title)
  print('learned attention spans (tokens):')
  print(span_report.markdown_spans(spans))


def sweep_model_config(config, tokenizer, point) -> ResolvedModel:
  """The eval-time model of one sweep point, checked (every layer's settings) before use."""
  model_config = lm_model_config(config.model, tokenizer.vocab_size,
                                 **memory_sweep.model_overrides(point, config.model))
  resolve_model(model_config.model_values())
  jax.eval_shape(lambda: DecoderLM.init_state(model_config, 1))
  return model_config


def evaluate_memory_sweep(config, workdir: str, tokenizer, documents, mesh, rules, params,
                          param_shardings, step: int, model_state=None) -> dict:
  """`config.eval.memory_sweep`: one evaluation per point; writes the table and the plot."""
  points = memory_sweep.parse_sweep(config.eval.memory_sweep,
                                    config.eval.chunk_len or config.data.chunk_len)
  model_configs = {point: sweep_model_config(config, tokenizer, point) for point in points}

  def evaluate_point(point):
    evaluator = Evaluator(model_configs[point], tokenizer, batch_size=config.data.eval_batch_size,
                          chunk_len=point.chunk, mesh=mesh, rules=rules,
                          param_shardings=param_shardings,
                          far_distance=config.eval.far_distance)
    metrics = evaluator.evaluate(params, documents, config.eval.max_tokens, model_state)
    logging.info('%s: %.4f bits/byte', point.describe(), metrics['bits_per_byte'])
    return metrics

  rows = memory_sweep.run_sweep(points, evaluate_point)
  header = dict(checkpoint_step=step, split=config.eval.split,
                trained_attention=config.model.attention,
                trained_model=describe_model(config.model),
                trained_chunk=config.data.chunk_len, corpus=config.data.corpus)
  if jax.process_index() == 0:
    title = f'{config.model.attention}-trained, step {step}, {config.eval.split}'
    with fresh_output_dir(workdir) as out_dir:
      memory_sweep.write_sweep(rows, out_dir, title, header)
    print(f'{config.eval.split} split, checkpoint step {step}, memory sweep:')
    print(memory_sweep.markdown_table(rows))
  return dict(header, memory_sweep=rows)


def check_overrides_apply(cli_config: ml_collections.ConfigDict, workdir: str) -> None:
  """Refuses command-line settings that eval.py would not apply (architecture_overrides.py).

  The architecture is compared with the whole `--config` file when one was
  given (its model must be the run's), otherwise with what the
  `--config.KEY=VALUE` overrides changed; other sections only by the
  overrides.
  """
  path = os.path.join(workdir, 'config.json')
  saved = StorageBound.of(cli_config).call(
      'reading the run in', workdir,
      lambda: saved_config(path) if paths.as_path(path).exists() else None, retry=True)
  if saved is None:
    return                                   # evaluate_run reports the missing file
  overrides = given_settings(cli_config.to_dict(),
                             command_line.experiment_config(flags.FLAGS.config, []).to_dict())
  given = cli_config.to_dict() if flags.FLAGS['config'].present else overrides
  changed = architecture_overrides(given, saved, overrides)
  if changed:
    raise ConfigError(changed[0], f'eval.py reads the architecture from {path}; the command line '
                      f'would change {", ".join(changed)}: drop these settings (or evaluate '
                      'another memory with --config.eval.mem_lens / --config.eval.memory_sweep)')
  unread = unread_overrides(overrides, saved)
  if unread:
    raise ConfigError(unread[0], f'eval.py takes {", ".join(unread)} from {path} and only '
                      'eval.*, parallel.* and checkpoint.storage_timeout_s from the command '
                      'line: drop these settings (the evaluation batch is '
                      '--config.eval.batch_size)')


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f'unexpected arguments: {argv[1:]}')
  show_own_info_only()
  cli_config = command_line.flag_config()
  check_overrides_apply(cli_config, flags.FLAGS.workdir)
  evaluate_run(cli_config, flags.FLAGS.workdir)


if __name__ == '__main__':
  command_line.define_flags('The training run to evaluate.')
  command_line.run(main)
