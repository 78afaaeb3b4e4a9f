"""Trains a long-context language model; read top to bottom for the whole path.

  python train.py                                   # default config, built-in corpus
  python train.py --config=configs/NAME.py --workdir=DIR --config.key=value

The workdir receives checkpoints (orbax, params + optimizer + memory + RNG +
data position), `metrics.jsonl`, TensorBoard events and `config.json`. A run
started on a workdir with checkpoints resumes from the latest one.
"""

import functools
import json
import math
import os
import time

if __name__ == '__main__':
  from longformer_jax.cpu_malloc import reexec_with_cpu_malloc_settings
  reexec_with_cpu_malloc_settings()

from absl import app, flags, logging
import jax
import ml_collections
import numpy as np

from longformer_jax.command_line import define_flags
from longformer_jax.config_validation import validate_config
from longformer_jax.data.corpus import (cut_into_pieces, load_corpus, make_tokenizer,
                                        tokenize_documents)
from longformer_jax.data.stream_batcher import TrainStreams
from longformer_jax.models.decoder_lm import DecoderLM, lm_model_config
from longformer_jax.parallel import sharding
from longformer_jax.parallel.mesh import make_mesh
from longformer_jax.train import initialization, steps
from longformer_jax.train.batches import step_arrays
from longformer_jax.train.checkpointing import Checkpointer
from longformer_jax.train.evaluation import Evaluator
from longformer_jax.train.metrics_logging import MetricsLogger, ProgressBar
from longformer_jax.train.optimizer import learning_rate_schedule, make_optimizer
from longformer_jax.train.preemption import PreemptionWatcher
from longformer_jax.train.quiet_logs import show_own_info_only



class NonFiniteLossError(RuntimeError):
  """The loss or gradient became NaN/inf; the last good checkpoint is kept."""


def check_finite(step: int, metrics: dict) -> None:
  for name in ('loss', 'grad_norm'):
    if not math.isfinite(metrics[name]):
      raise NonFiniteLossError(
          f'non-finite {name} ({metrics[name]}) at step {step}; stopping without saving. '
          f'The last good checkpoint is kept; lower optimizer.learning_rate or check the data.')


def write_config(config: ml_collections.ConfigDict, workdir: str) -> None:
  if jax.process_index() == 0:
    with open(os.path.join(workdir, 'config.json'), 'w') as f:
      f.write(config.to_json_best_effort(indent=2))


def train(config: ml_collections.ConfigDict, workdir: str):
  """Runs (or resumes) training; returns `(final TrainState, last logged metrics)`."""
  # ---- set-up: devices, config, data -----------------------------------
  if config.parallel.multi_host:
    jax.distributed.initialize()
  validate_config(config, jax.device_count())
  os.makedirs(workdir, exist_ok=True)
  write_config(config, workdir)
  is_chief = jax.process_index() == 0

  tokenizer = make_tokenizer(config.data)
  skip = config.data.skip_undecodable
  train_docs = cut_into_pieces(
      tokenize_documents(tokenizer, load_corpus(config.data, 'train'), skip),
      config.data.batch_size)
  valid_docs = tokenize_documents(tokenizer, load_corpus(config.data, 'valid'), skip)
  tokens_per_step = config.data.chunk_len * config.data.chunks_per_step
  streams = TrainStreams(train_docs, config.data.batch_size, tokens_per_step, config.seed,
                         tokenizer.bos_id, jax.process_index(), jax.process_count())

  # ---- model, optimizer, mesh, state -----------------------------------
  model_config = lm_model_config(config.model, tokenizer.vocab_size)
  model = DecoderLM(model_config)
  num_steps = config.train.num_steps
  optimizer = make_optimizer(config.optimizer, num_steps)
  mesh = make_mesh(config.parallel.mesh_shape)
  rules = config.parallel.logical_axis_rules
  state_args = (model, optimizer, config.seed, config.data.batch_size, config.data.chunk_len,
                mesh, rules)
  abstract_state, state_shardings = initialization.abstract_train_state(*state_args)

  checkpointer = Checkpointer(workdir, config.train.keep_checkpoints,
                              async_save=config.train.async_checkpointing)
  if checkpointer.latest_step() is not None:
    state, data_state = checkpointer.restore(None, abstract_state)
    streams.restore(data_state)
    logging.info('Resumed from step %d in %s', int(state.step), checkpointer.directory)
  else:
    state, _ = initialization.sharded_train_state(*state_args)
  start_step = int(state.step)
  num_params = sum(x.size for x in jax.tree_util.tree_leaves(state.params))
  logging.info('Model: %s attention, %.2fM parameters, mesh %s', model_config.attention,
               num_params / 1e6, dict(mesh.shape))

  # ---- compiled steps --------------------------------------------------
  batch_sharding = sharding.batch_sharding(mesh, rules)
  train_step = jax.jit(
      functools.partial(steps.train_step, model=model, optimizer=optimizer,
                 learning_rate_fn=learning_rate_schedule(config.optimizer, num_steps),
                 chunk_len=config.data.chunk_len,
                 grad_accum_steps=config.optimizer.grad_accum_steps),
      in_shardings=(state_shardings, batch_sharding),
      out_shardings=(state_shardings, sharding.replicated(mesh)),
      donate_argnums=0)
  evaluator = Evaluator(model_config, tokenizer, batch_size=config.data.eval_batch_size,
                        chunk_len=config.data.chunk_len, mesh=mesh, rules=rules,
                        param_shardings=state_shardings.params)

  def save(step: int) -> None:
    checkpointer.save(step, state, streams.state())

  # ---- the loop ----------------------------------------------------------
  # Metrics of step s are read on the host after step s + 1 is dispatched,
  # so the check for non-finite values does not stall the device.
  end_step = min(num_steps, config.train.stop_after_steps or num_steps)
  logger = MetricsLogger(workdir, enabled=is_chief)
  progress = ProgressBar(num_steps, start_step, enabled=is_chief)
  pending, last, last_valid = None, {}, (None, None)
  window_tokens, window_start = 0, time.time()

  def host_metrics(pending):
    step, metrics = pending
    metrics = jax.tree_util.tree_map(float, jax.device_get(metrics))
    check_finite(step, metrics)
    return metrics

  try:
    with PreemptionWatcher() as preemption, sharding.activation_sharding(mesh, rules):
      step = start_step
      while step < end_step:
        batch = sharding.to_global_batch(step_arrays(streams.next_batch(), tokenizer.pad_id),
                                         batch_sharding)
        state, metrics = train_step(state, batch)
        if pending is not None:
          host_metrics(pending)
        step += 1
        pending = (step, metrics)
        window_tokens += tokens_per_step * config.data.batch_size

        if step % config.train.log_every == 0 or step == end_step:
          elapsed = time.time() - window_start
          last = host_metrics(pending)
          last.update(bits_per_token=last['loss'] / math.log(2),
                      tokens_per_s=window_tokens / max(elapsed, 1e-9))
          logger.write(step, last, 'train')
          progress.update(step, last['loss'], last['bits_per_token'], last['tokens_per_s'])
          window_tokens, window_start = 0, time.time()

        if config.train.eval_every and step % config.train.eval_every == 0:
          last_valid = (step, evaluator.evaluate(state.params, valid_docs,
                                                 config.train.eval_max_tokens))
          logger.write(step, last_valid[1], 'valid')
          window_start = time.time()    # tokens/s measures training only
        if step % config.train.checkpoint_every == 0 or preemption.requested:
          host_metrics(pending)         # never save a state that went non-finite
          save(step)
        if preemption.requested:
          logging.warning('SIGTERM at step %d: checkpoint saved, stopping.', step)
          break

      save(step)
      if step == num_steps and config.train.eval_every:
        if last_valid[0] != step:
          last_valid = (step, evaluator.evaluate(state.params, valid_docs,
                                                 config.train.eval_max_tokens))
          logger.write(step, last_valid[1], 'valid')
        last['final_valid'] = last_valid[1]
  finally:
    # Also on errors: let a checkpoint being written finish, so it stays intact.
    checkpointer.wait()
    checkpointer.close()
    progress.close()
    logger.close()
  last['step'] = step
  return state, last


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f'unexpected arguments: {argv[1:]}')
  show_own_info_only()
  _, result = train(flags.FLAGS.config, flags.FLAGS.workdir)
  if 'final_valid' in result:
    print(json.dumps({'step': result['step'], 'valid': result['final_valid']}))


if __name__ == '__main__':
  define_flags('Checkpoints and logs go here.')
  app.run(main)
