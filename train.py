"""Trains a long-context language model; read top to bottom for the whole path.

  python train.py                                   # default config, built-in corpus
  python train.py --config=configs/NAME.py --workdir=DIR --config.key=value

The workdir receives checkpoints (orbax, params + optimizer + memory + RNG +
data position), `metrics.jsonl`, TensorBoard events and `config.json`. A run
started on a workdir with checkpoints resumes from the latest one.

`config.task` picks what is trained: 'lm' (default, this file), or an
encoder task, 'classification' | 'qa' | 'seq2seq' (LED), trained by
`longformer_jax/train/task_training.py`. `train.phases > 1` trains the LM
in phases of growing chunk length and window and shrinking learning rate
(Longformer, sec. 4.2; `longformer_jax/train/phases.py`).
"""

import dataclasses
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

from longformer_jax import command_line
from longformer_jax.config_errors import ConfigError
from longformer_jax.config_validation import validate_config
from longformer_jax.data.corpus import cut_into_pieces, load_corpus, tokenize_documents
from longformer_jax.data.tokenizers import make_tokenizer
from longformer_jax.data.phased_streams import PhasedStreams
from longformer_jax.data.stream_batcher import TrainStreams
from longformer_jax.models.decoder_lm import DecoderLM, lm_model_config
from longformer_jax.parallel import sharding
from longformer_jax.parallel.mesh import make_mesh
from longformer_jax.train import initialization, phases as phasing, steps
from longformer_jax.train.batches import step_arrays
from longformer_jax.train.checkpointing import Checkpointer
from longformer_jax.evaluation.lm_evaluator import Evaluator
from longformer_jax.train.loop_checks import NonFiniteLossError, check_finite  # noqa: F401 (re-exported)
from longformer_jax.train.metrics_logging import MetricsLogger, ProgressBar
from longformer_jax.train.optimizer import learning_rate_schedule, make_optimizer
from longformer_jax.train.preemption import PreemptionWatcher
from longformer_jax.train.quiet_logs import show_own_info_only
from longformer_jax.train.task_training import train_task


def write_config(config: ml_collections.ConfigDict, workdir: str) -> None:
  if jax.process_index() == 0:
    with open(os.path.join(workdir, 'config.json'), 'w') as f:
      f.write(config.to_json_best_effort(indent=2))


@dataclasses.dataclass(frozen=True)
class PhaseRun:
  """One training phase's model, state layout, jitted train step, evaluator and memory."""
  phase: phasing.Phase
  model_config: ml_collections.FrozenConfigDict
  abstract_state: object
  state_shardings: object
  train_step: object
  evaluator: Evaluator
  fresh_memory: object


def train(config: ml_collections.ConfigDict, workdir: str):
  """Runs (or resumes) training; returns `(final TrainState, last logged metrics)`."""
  if config.get('task', 'lm') != 'lm':
    return train_task(config, workdir)
  # ---- set-up: devices, config, data -----------------------------------
  if config.parallel.multi_host:
    jax.distributed.initialize()
  validate_config(config, jax.device_count())
  phases = phasing.training_phases(config)
  phased = len(phases) > 1
  os.makedirs(workdir, exist_ok=True)
  write_config(config, workdir)
  is_chief = jax.process_index() == 0

  tokenizer = make_tokenizer(config.data)
  skip = config.data.skip_undecodable
  train_docs = cut_into_pieces(
      tokenize_documents(tokenizer, load_corpus(config.data, 'train'), skip),
      config.data.batch_size)
  valid_docs = tokenize_documents(tokenizer, load_corpus(config.data, 'valid'), skip)
  # Streams are read in units of phase 0's step; a phase-p step is several units.
  tokens_per_unit = config.data.chunk_len * config.data.chunks_per_step
  streams = PhasedStreams(TrainStreams(train_docs, config.data.batch_size, tokens_per_unit,
                                       config.seed, tokenizer.bos_id, jax.process_index(),
                                       jax.process_count()))

  # ---- optimizer, mesh, and each phase's model, state layout and steps ----
  num_steps = config.train.num_steps
  optimizer = phasing.phased_optimizer(make_optimizer(config.optimizer, num_steps), phases)
  learning_rate_fn = phasing.phased_learning_rate(
      learning_rate_schedule(config.optimizer, num_steps), phases)
  mesh = make_mesh(config.parallel.mesh_shape)
  rules = config.parallel.logical_axis_rules
  batch_sharding = sharding.batch_sharding(mesh, rules)

  def build_phase(phase: phasing.Phase) -> PhaseRun:
    model_config = lm_model_config(phasing.phase_model_config(config.model, phase),
                                   tokenizer.vocab_size)
    model = DecoderLM(model_config)
    abstract_state, state_shardings = initialization.abstract_train_state(
        model, optimizer, config.seed, config.data.batch_size, phase.chunk_len, mesh, rules)
    train_step = jax.jit(
        functools.partial(steps.train_step, model=model, optimizer=optimizer,
                          learning_rate_fn=learning_rate_fn, chunk_len=phase.chunk_len,
                          grad_accum_steps=config.optimizer.grad_accum_steps),
        in_shardings=(state_shardings, batch_sharding),
        out_shardings=(state_shardings, sharding.replicated(mesh)),
        donate_argnums=0)
    evaluator = Evaluator(model_config, tokenizer, batch_size=config.data.eval_batch_size,
                          chunk_len=phase.chunk_len, mesh=mesh, rules=rules,
                          param_shardings=state_shardings.params)
    fresh_memory = jax.jit(lambda: DecoderLM.init_state(model_config, config.data.batch_size),
                           out_shardings=state_shardings.memory)
    return PhaseRun(phase, model_config, abstract_state, state_shardings, train_step, evaluator,
                    fresh_memory)

  # Built up front (abstract shapes only; each step compiles on its first call).
  runs = [build_phase(phase) for phase in phases]
  checkpointer = Checkpointer(workdir, config.train.keep_checkpoints,
                              async_save=config.train.async_checkpointing)
  latest = checkpointer.latest_step()
  # A checkpoint holds the memory of the phase that ran its last step.
  run = runs[phasing.phase_of_state(phases, latest or 0).index]
  if latest is not None:
    state, data_state = checkpointer.restore(None, run.abstract_state)
    if phased and data_state.get('phase') != run.phase.index:
      raise ConfigError('train.phase_steps',
                        f'checkpoint {latest} records phase {data_state.get("phase")}, but the '
                        f'phase settings put it in phase {run.phase.index}; resume with the '
                        f'settings it was trained with')
    streams.restore(data_state)
    logging.info('Resumed from step %d in %s', int(state.step), checkpointer.directory)
  else:
    state, _ = initialization.sharded_train_state(
        DecoderLM(run.model_config), optimizer, config.seed, config.data.batch_size,
        run.phase.chunk_len, mesh, rules)
  start_step = int(state.step)
  num_params = sum(x.size for x in jax.tree_util.tree_leaves(state.params))
  logging.info('Model: %s attention, %.2fM parameters, mesh %s', run.model_config.attention,
               num_params / 1e6, dict(mesh.shape))

  def save(step: int) -> None:
    data_state = streams.state()
    if phased:
      data_state['phase'] = run.phase.index
    checkpointer.save(step, state, data_state)

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
        if phasing.phase_of_step(phases, step).index != run.phase.index:
          # A new phase: longer chunks and window, new shapes; memory starts empty.
          run = runs[phasing.phase_of_step(phases, step).index]
          state = state.replace(memory=run.fresh_memory())
          logging.info('Phase %d from step %d: chunk_len %d, window x%d, lr x%g', run.phase.index,
                       step, run.phase.chunk_len, run.phase.window_multiple, run.phase.lr_scale)
        tokens_per_step = run.phase.chunk_len * config.data.chunks_per_step
        batch = sharding.to_global_batch(
            step_arrays(streams.next_batch(run.phase.length_multiple), tokenizer.pad_id),
            batch_sharding)
        state, metrics = run.train_step(state, batch)
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
          if phased:
            last['phase'] = run.phase.index
          logger.write(step, last, 'train')
          progress.update(step, last['loss'], last['bits_per_token'], last['tokens_per_s'])
          window_tokens, window_start = 0, time.time()

        if config.train.eval_every and step % config.train.eval_every == 0:
          last_valid = (step, run.evaluator.evaluate(state.params, valid_docs,
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
          last_valid = (step, run.evaluator.evaluate(state.params, valid_docs,
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
  _, result = train(command_line.flag_config(), flags.FLAGS.workdir)
  if 'final_valid' in result:
    print(json.dumps({'step': result['step'], 'valid': result['final_valid']}))


if __name__ == '__main__':
  command_line.define_flags('Checkpoints and logs go here.')
  command_line.run(main)
