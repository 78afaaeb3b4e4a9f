"""The one training loop, for the language model and every encoder task.

The loop owns what every run does alike: restoring the latest intact
checkpoint (or creating the state), writing `config.json` once that worked,
logging to `metrics.jsonl` / TensorBoard and the console, throughput, the
non-finite stop, periodic validation, checkpoints and SIGTERM. What differs
between runs is a `TrainingTask` (`tasks/lm_training.py`, `tasks/example_training.py`):
the model and state, the batches and their data position, the compiled step,
its metrics and the evaluator.

Metrics of step s are read on the host after step s + 1 is dispatched, so
the check for non-finite values does not stall the device; a checkpoint is
saved only after the state's step checked finite.
"""

import math
import signal
import threading
import time
from typing import Any, Callable, Protocol

from absl import logging
import jax
import ml_collections

from longformer_jax.checkpoint import resume_checks
from longformer_jax.checkpoint.run_checkpoints import RunCheckpoints
from longformer_jax.checkpoint.storage_bound import StorageBound
from longformer_jax.models.saved_config import migrate_saved_config
from longformer_jax.parallel import sharding
from longformer_jax.storage.storage_errors import cause, is_storage_failure, reporting
from longformer_jax.train.metrics_logging import MetricsLogger, ProgressBar
from longformer_jax.train.profiling import run_profiler
from longformer_jax.train.run_directory import write_config


class TrainingTask(Protocol):
  """What the loop needs from a kind of run.

  Attributes:
    description: the model, described from its layer configs (for the log).
    unit: the throughput unit, 'tok' (tokens) or 'ex' (examples).
    mesh: the device mesh.
    rules: the logical axis rules.
  """
  description: str
  unit: str
  mesh: jax.sharding.Mesh
  rules: Any

  def abstract_state(self, step: int) -> Any:
    """The abstract train state (shapes, dtypes, shardings) of a state saved after `step`."""

  def fresh_state(self) -> Any:
    """The initial train state, created in its shardings."""

  def state_with_params(self, params: Any) -> Any:
    """The initial train state with `params` (a parameters-only checkpoint's, e.g. an
    import's, placed in their shardings) in place of the initialised ones."""

  def data_state(self) -> dict:
    """The data position (and whatever resuming checks), saved with a checkpoint."""

  def restore_data(self, data_state: dict, step: int) -> None:
    """Continues the data from a checkpoint of `step`; raises if it cannot."""

  def starts_segment(self, step: int) -> bool:
    """Whether step `step` starts a new segment of other shapes (an LM phase)."""

  def enter_segment(self, state: Any, step: int) -> Any:
    """Prepares the segment that runs `step` (compiles its step); returns the state."""

  def train_step(self, state: Any) -> tuple[Any, Any, int]:
    """`(new state, device metrics, units processed)` of one step on the next batch."""

  def host_metrics(self, device_metrics: Any) -> dict:
    """Floats for the log, with at least `loss` and `grad_norm`."""

  def evaluate(self, state: Any) -> dict:
    """Validation metrics of `state`."""


RATE_NAMES = {'tok': 'tokens_per_s', 'ex': 'examples_per_s'}


def one_line(metrics: dict) -> str:
  """`name value | ...` of scalar metrics (4 decimals, integers without)."""
  parts = []
  for name, value in metrics.items():
    value = float(value)
    text = f'{value:.0f}' if value.is_integer() and abs(value) >= 1 else f'{value:.4f}'
    parts.append(f'{name} {text}')
  return ' | '.join(parts)


class NonFiniteLossError(RuntimeError):
  """The loss or gradient became NaN/inf; the last good checkpoint is kept."""


def check_finite(step: int, metrics: dict) -> None:
  """Raises `NonFiniteLossError` when step `step`'s loss or gradient norm is NaN/inf (host side)."""
  for name in ('loss', 'grad_norm'):
    if not math.isfinite(metrics[name]):
      raise NonFiniteLossError(
          f'non-finite {name} ({metrics[name]}) at step {step}; stopping without saving. '
          f'The last good checkpoint is kept; lower optimizer.learning_rate or check the data.')


class PreemptionWatcher:
  """SIGTERM (TPU preemption, `kill`) turns into a flag the loop checks.

  Installs a SIGTERM handler for its lifetime (a context manager). The loop
  saves a checkpoint and returns at the end of the current step, so a
  preempted run resumes where it stopped with nothing lost.
  """

  def __init__(self):
    self._event = threading.Event()
    self._previous = None

  def _handle(self, signum, frame):
    del signum, frame
    self._event.set()

  @property
  def requested(self) -> bool:
    return self._event.is_set()

  def __enter__(self):
    if threading.current_thread() is threading.main_thread():
      self._previous = signal.signal(signal.SIGTERM, self._handle)
    return self

  def __exit__(self, *exc):
    if self._previous is not None:
      signal.signal(signal.SIGTERM, self._previous)
    return False


class Throughput:
  """Units (tokens or examples) per second over the window since the last log line.

  The window holds training only: the loop restarts it after every pause that
  is not training (the first compile, a phase change, a validation pass, a
  checkpoint save) and after every log line, each time at a point where the
  device has finished the steps dispatched so far. Steps counted in a window
  are exactly the steps run in its time span, so the rate is right at any
  `train.log_every`, including the first window after a resume or an
  evaluation.
  """

  def __init__(self, clock: Callable[[], float] = time.perf_counter):
    self._clock = clock
    self._units = 0
    self._start = clock()

  def restart(self) -> None:
    """Starts an empty window now (the device must be idle: nothing in flight is counted)."""
    self._units = 0
    self._start = self._clock()

  def exclude(self, seconds: float) -> None:
    """Leaves `seconds` of host work that was not training (a trace written) out of the
    window's time."""
    self._start += seconds

  def add(self, units: int) -> None:
    """Counts one dispatched step of `units` tokens or examples."""
    self._units += units

  def rate(self) -> float:
    """Units per second since the window started (call once the counted steps have finished)."""
    return self._units / max(self._clock() - self._start, 1e-9)


def restore_or_create(task: TrainingTask, checkpointer: RunCheckpoints, config, workdir: str,
                      bound: StorageBound):
  """The state to start from: the newest intact checkpoint's, with its data position, or fresh."""
  latest = checkpointer.latest_step()
  if latest is None:
    return task.fresh_state()
  # An old run's config.json (flat model keys) is compared in today's layout.
  bound.call('reading config.json in', workdir, lambda: resume_checks.check_resumable(
      workdir, config.to_dict(), migrate=lambda saved: migrate_saved_config(saved)[0]),
             retry=True)
  abstract = task.abstract_state(latest)
  state, data_state, step = checkpointer.restore_latest_intact(
      abstract, from_params=task.state_with_params)
  task.restore_data(data_state, step)
  logging.info('Resumed from step %d in %s', step, checkpointer.directory)
  return state


def clean_up(actions: list, stopping: 'BaseException | None') -> None:
  """Runs every `(description, callable or None)` of `actions`, in order, whatever fails.

  When an error is already stopping the run (`stopping`), that error is what the user
  must see: a failure here is logged in one line and dropped. Otherwise the first failure
  is raised once all have run (a storage failure as one `StorageError` line).
  """
  first = None
  for description, action in actions:
    if action is None:
      continue
    try:
      action()
    except Exception as error:  # pylint: disable=broad-except
      if stopping is None:
        first = first or (description, error)
      else:
        logging.warning('While stopping on the error below, %s failed too: %s',
                        description, cause(error))
  if first is not None:
    description, error = first
    if is_storage_failure(error):
      with reporting(description):
        raise error
    raise error


def run(task: TrainingTask, config: ml_collections.ConfigDict, workdir: str, lease=None):
  """Trains (or resumes) until `train.num_steps` or `train.stop_after_steps`.

  `lease` (`checkpoint/workdir_lease.py`), when given, is checked at every step: a lease
  another run took over stops this one (`LeaseLostError`) before it writes again.
  Every storage operation ends within `checkpoint.storage_timeout_s`
  (`checkpoint/storage_bound.py`), a checkpoint's background writes too (checked at every
  step); a storage failure ends the run with one `StorageError`, and nothing waits on the
  storage after it (the save in flight is abandoned, never committed).

  Returns:
    `(final state, last logged train metrics)`, the metrics with `step`,
    `final_valid` (the last validation, when the run completed with
    `train.eval_every > 0`) and `preempted` (True: SIGTERM stopped it).
  """
  train = config.train
  is_chief = jax.process_index() == 0
  check_lease = lease.check if lease is not None else lambda: None
  bound = StorageBound.of(config)
  checkpointer = RunCheckpoints(workdir, train.keep_checkpoints, train.async_checkpointing,
                                bound)
  logger = progress = None
  profiler = run_profiler(config, workdir, 'train')
  stopping = None
  try:
    state = restore_or_create(task, checkpointer, config, workdir, bound)
    bound.call('writing config.json in', workdir, lambda: write_config(config, workdir),
               retry=True)
    start_step = int(state.step)
    num_params = sum(x.size for x in jax.tree_util.tree_leaves(state.params))
    logging.info('Model: %s, %.2fM parameters, mesh %s', task.description, num_params / 1e6,
                 dict(task.mesh.shape))
    end_step = min(train.num_steps, train.stop_after_steps or train.num_steps)
    logger = bound.call('opening metrics.jsonl in', workdir, lambda: MetricsLogger(
        workdir, enabled=is_chief, resume_step=start_step, bound=bound), retry=True)
    progress = ProgressBar(end_step, start_step, enabled=is_chief)
    throughput = Throughput()
    pending, last, last_valid, preempted = None, {}, (None, None), False

    def checked(pending) -> dict:
      step, device_metrics = pending
      metrics = task.host_metrics(device_metrics)
      check_finite(step, metrics)
      return metrics

    def validate(step: int) -> tuple:
      result = task.evaluate(state)
      with reporting('writing metrics in', workdir):
        logger.write(step, result, 'valid')
      progress.note(f'valid step {step}: {one_line(result)}')
      throughput.restart()        # the window measures training only
      return step, result

    with PreemptionWatcher() as preemption, sharding.activation_sharding(
        task.mesh, task.rules, config.parallel):
      step = start_step
      while step < end_step:
        check_lease()
        checkpointer.check()          # the save in flight: failed, or past its bound?
        if step == start_step or task.starts_segment(step):
          if pending is not None:
            checked(pending)
          state = task.enter_segment(state, step)
          jax.block_until_ready(state)
          throughput.restart()
        profiler.before(step + 1)
        with profiler.annotation(step + 1):
          state, device_metrics, units = task.train_step(state)
        if pending is not None:
          checked(pending)
        step += 1
        throughput.exclude(profiler.after(step, state))   # writing a trace is not training
        pending = (step, device_metrics)
        throughput.add(units)

        if step % train.log_every == 0 or step == end_step:
          last = checked(pending)     # waits for the step: the window's steps are done
          last[RATE_NAMES[task.unit]] = throughput.rate()
          with reporting('writing metrics in', workdir):
            logger.write(step, last, 'train')
          progress.update(step, last['loss'], last[RATE_NAMES[task.unit]], task.unit,
                          last['bits_per_token'] if 'bits_per_token' in last else None)
          throughput.restart()
        if train.eval_every and step % train.eval_every == 0:
          last_valid = validate(step)
        if step % train.checkpoint_every == 0 or preemption.requested:
          checked(pending)            # never save a state that went non-finite
          check_lease()               # nor into a workdir another run took over
          checkpointer.save(step, state, task.data_state())
          logger.flush()              # the lines up to this checkpoint, durable with it
          throughput.restart()
        if preemption.requested:
          logging.warning('SIGTERM at step %d: checkpoint saved, stopping.', step)
          preempted = True
          break

      check_lease()
      checkpointer.save(step, state, task.data_state())
      if step == train.num_steps and train.eval_every:
        if last_valid[0] != step:
          last_valid = validate(step)
        last['final_valid'] = last_valid[1]
  except BaseException as error:
    stopping = error
    raise
  finally:
    # On other errors too, let a checkpoint being written finish (within its bound). After a
    # storage failure nothing waits on the storage again: the save in flight is abandoned
    # (never committed, so never listed) and the metrics past the last checkpoint, which the
    # resumed run logs again, are not uploaded.
    storage_failed = stopping is not None and is_storage_failure(stopping)
    clean_up([('stopping the profile', None if storage_failed else profiler.close),
              (f'finishing the checkpoint being saved in {checkpointer.directory}',
               None if storage_failed else checkpointer.wait),
              (f'closing the checkpoints in {checkpointer.directory}',
               None if storage_failed else checkpointer.close),
              ('closing the progress display', progress and progress.close),
              (f'uploading metrics.jsonl and TensorBoard events to {workdir}',
               logger and (lambda: logger.close(upload=not storage_failed)))], stopping)
  last['step'] = step
  last['preempted'] = preempted
  return state, last
