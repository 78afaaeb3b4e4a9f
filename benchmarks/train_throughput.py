"""Tokens per second and model-FLOPs utilisation of a training run.

  python benchmarks/train_throughput.py [--config=configs/default.py] [--steps=60] [--windows=5]

Runs train.py's own `train()` on the config for `--steps` steps (checkpoints
and evaluation off, a throw-away workdir). The first half of the steps
absorbs compilation; the second half is timed in `--windows` equal log
windows (the loop's own throughput windows, read back from metrics.jsonl).
Tokens/s is the second half's tokens over its time; the spread is the mean
step time of each window (median, min, max).

MFU is the model's training FLOPs per token (`longformer_jax/models/flop_count.py`)
times tokens/s over the matmul rate (float32, or bfloat16 with `--rate_dtype=bfloat16`), measured twice next to the timed
half so that both see its load: when the loop reads the last step of the first
half (the device idle, before the timed windows start) and right after training
returns. MFU uses the mean of the two. With `--peak_memory` (GPU, TPU) it also prints
the device's peak bytes in use against memory_check.py's prediction for the config. The
last line is `tokens_per_s=... mfu=...`.
"""

import functools
import json
import os
import statistics
import sys
import tempfile
from unittest import mock

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

if __name__ == '__main__':
  from longformer_jax.cpu_malloc import reexec_with_cpu_malloc_settings
  reexec_with_cpu_malloc_settings()

from absl import flags
import jax
import jax.numpy as jnp

from benchmarks.matmul_rate import measure
from longformer_jax import command_line
from longformer_jax.data.tokenizers import make_tokenizer
from longformer_jax.models.resolved_model import lm_model_config
from longformer_jax.models.flop_count import train_flops_per_token
from longformer_jax.tasks.lm import TASK as LM_TASK
from longformer_jax.train.quiet_logs import show_own_info_only
import train as train_script


def timed_half_summary(window_rates: list, units_per_step: int, steps_per_window: int) -> dict:
  """Tokens/s and step-time spread of equal windows, from each window's tokens/s.

  Every window holds the same tokens, so the half's rate (total tokens over
  total time) is the harmonic mean of the window rates.
  """
  step_seconds = [units_per_step / rate for rate in window_rates]   # mean step of each window
  total_seconds = sum(s * steps_per_window for s in step_seconds)
  return dict(tokens_per_s=units_per_step * steps_per_window * len(window_rates) / total_seconds,
              step_seconds=statistics.median(step_seconds), step_seconds_min=min(step_seconds),
              step_seconds_max=max(step_seconds), windows=len(window_rates))


def model_flops_utilisation(flops_per_token: float, tokens_per_s: float, rate_before: float,
                            rate_after: float) -> float:
  """Achieved FLOP/s over the mean of the matmul rates measured before and after the run."""
  return flops_per_token * tokens_per_s / ((rate_before + rate_after) / 2.0)


class MatmulProbeTask:
  """A training task that measures the matmul rate between the two halves of the run.

  It delegates everything to `task`; when the loop first reads the metrics of
  step `probe_step` (the log line that ends the first half: the loop waits for
  the step, and the next throughput window starts after the line), it measures
  the matmul rate into `rate_before`.
  """

  def __init__(self, task, probe_step: int, measure_rate=None):
    self._task = task
    self._measure_rate = measure_rate      # None: `measure()`, the float32 rate
    self._probe_step = probe_step
    self._steps = 0
    self._probe_metrics = None
    self.units_per_step = None
    self.rate_before = None

  def __getattr__(self, name):
    return getattr(self._task, name)

  def train_step(self, state):
    state, device_metrics, units = self._task.train_step(state)
    self._steps += 1
    self.units_per_step = units
    if self._steps == self._probe_step:
      self._probe_metrics = device_metrics
    return state, device_metrics, units

  def host_metrics(self, device_metrics) -> dict:
    metrics = self._task.host_metrics(device_metrics)
    if self.rate_before is None and device_metrics is self._probe_metrics:
      self.rate_before = (self._measure_rate or measure)()
    return metrics


def peak_memory_line(stats, predicted_bytes: int) -> str:
  """The device's measured peak (`Device.memory_stats()['peak_bytes_in_use']`, the whole
  process's: the state, the step's temporaries, the matmul probe's operands) against
  memory_check.py's prediction for the same config (its phase-0 `total`)."""
  if not stats or 'peak_bytes_in_use' not in stats:
    return (f'peak memory: not reported by this backend; memory_check predicts '
            f'{predicted_bytes / 2**30:.2f} GiB per device')
  peak = int(stats['peak_bytes_in_use'])
  return (f'peak_bytes={peak} ({peak / 2**30:.2f} GiB) predicted_bytes={predicted_bytes} '
          f'({predicted_bytes / 2**30:.2f} GiB): prediction / measured = '
          f'{predicted_bytes / peak:.3f}')


def window_rates(workdir: str, first_step: int, rate_name: str = 'tokens_per_s') -> list:
  """The logged rate of every train window that ends after `first_step`."""
  with open(os.path.join(workdir, 'metrics.jsonl'), encoding='utf-8') as f:
    records = [json.loads(line) for line in f if line.strip()]
  return [float(r[rate_name]) for r in records
          if r.get('split') == 'train' and r['step'] > first_step and rate_name in r]


def main(argv):
  del argv
  show_own_info_only()
  config = command_line.flag_config()
  windows = max(1, flags.FLAGS.windows)
  steps = max(2 * windows, flags.FLAGS.steps // (2 * windows) * (2 * windows))
  config.train.update(num_steps=steps, log_every=steps // (2 * windows), eval_every=0,
                      checkpoint_every=10 * steps, async_checkpointing=False)
  probes = []
  rate_dtype = jnp.dtype(flags.FLAGS.rate_dtype)
  measure_rate = functools.partial(measure, dtype=rate_dtype)

  def probed_task(task_config, param_import=None):
    probes.append(MatmulProbeTask(real_task(task_config, param_import), steps // 2,
                                  measure_rate))
    return probes[-1]

  real_task = LM_TASK.training_task
  with tempfile.TemporaryDirectory() as workdir:
    # train()'s own setup and loop; only the LM's training task is wrapped, to time the
    # matmul mid-run.
    with mock.patch.object(LM_TASK, 'training_task', probed_task):
      train_script.train(config, workdir)
    if not probes:
      sys.exit(f'train_throughput: config.task={config.task!r}: only language models are timed')
    rate_after = measure_rate()
    rates = window_rates(workdir, steps // 2)
  if not rates:   # train() stops early on SIGTERM (a time limit) and on a diverged loss
    sys.exit(f'train_throughput: no training window ended after step {steps // 2} of {steps}: '
             'the run stopped early')
  probe = probes[0]
  rate_before = probe.rate_before
  summary = timed_half_summary(rates, probe.units_per_step, steps // (2 * windows))
  model_config = lm_model_config(config.model, make_tokenizer(config.data).vocab_size)
  flops_per_token = train_flops_per_token(model_config, config.data.chunk_len,
                                          config.data.batch_size)
  tokens_per_s = summary['tokens_per_s']
  mfu = model_flops_utilisation(flops_per_token, tokens_per_s, rate_before.best_flops_per_s,
                                rate_after.best_flops_per_s)
  device = jax.devices()[0]
  print(f'backend={jax.default_backend()} device={device.platform}:{device.device_kind} '
        f'devices={jax.device_count()} '
        f'attention={model_config.attention} layers={model_config.num_layers} '
        f'd_model={model_config.d_model} chunk={config.data.chunk_len} '
        f'mem_len={model_config.mem_len} batch={config.data.batch_size} steps={steps}')
  print(f'{rate_dtype.name} matmul rate ({rate_before.size}^3, best): before the timed half '
        f'{rate_before.best_flops_per_s / 1e9:.1f} GFLOP/s, after '
        f'{rate_after.best_flops_per_s / 1e9:.1f} GFLOP/s (medians '
        f'{rate_before.median_flops_per_s / 1e9:.1f}, {rate_after.median_flops_per_s / 1e9:.1f}); '
        f'model: {flops_per_token / 1e6:.2f} MFLOP/token (train); '
        f'achieved {flops_per_token * tokens_per_s / 1e9:.1f} GFLOP/s')
  print(f'step seconds over {summary["windows"]} windows of the timed half: median '
        f'{summary["step_seconds"]:.4f}, min {summary["step_seconds_min"]:.4f}, '
        f'max {summary["step_seconds_max"]:.4f}')
  if flags.FLAGS.peak_memory:
    import memory_check  # deferred: a root script; only this option compiles the step again
    predicted = memory_check.train_step_memory(config)[0].total
    print(peak_memory_line(jax.local_devices()[0].memory_stats(), predicted))
  print(f'tokens_per_s={tokens_per_s:.1f} mfu={mfu:.3f}')


if __name__ == '__main__':
  flags.DEFINE_integer('steps', 60, 'Training steps to run (rounded down to a multiple of 2 x windows).')
  flags.DEFINE_enum('rate_dtype', 'float32', ['float32', 'bfloat16'],
                    'The matmul rate MFU divides by: float32, or bfloat16 (the ceiling of a '
                    'bfloat16 model on a GPU or TPU).')
  flags.DEFINE_bool('peak_memory', False,
                    "Print the device's peak bytes in use (GPU, TPU) against memory_check.py's "
                    'prediction for the same config.')
  flags.DEFINE_integer('windows', 5, 'Timing windows in the second half (the step-time spread).')
  command_line.define_flags('unused: the run goes to a temporary folder')
  command_line.run(main)
