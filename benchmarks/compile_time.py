"""Compile time of the train step as the model gets deeper, with and without scan over layers.

  python benchmarks/compile_time.py [--config=configs/default.py] [--layers=2,12] [--repeats=3]

For each depth, with `model.scan_layers=True` (one layer body traced and
compiled once, `nn.scan`) and with the unrolled stack, the default model's
train step is lowered and compiled by the ahead-of-time memory check
(`memory_check.py`'s `train_step_memory`: the same step, shardings and
donation as training; nothing runs). Every (depth, layout) is compiled
`--repeats` times, the repeats interleaved so that the machine's load moves
all of them alike; each row gives the median seconds with min and max, and
the ratio of each depth's median to the shallowest depth's median of the same
layout. The issue's target: 12 layers with scan within 1.5x of 2 layers.
"""

import os
import statistics
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from absl import app, flags  # pylint: disable=g-import-not-at-top,wrong-import-position
import jax  # pylint: disable=g-import-not-at-top,wrong-import-position

from longformer_jax import command_line  # pylint: disable=wrong-import-position
from longformer_jax.experiment_config import validate_config  # pylint: disable=wrong-import-position
from memory_check import train_step_memory  # pylint: disable=wrong-import-position

FLAGS = flags.FLAGS


def ratio_rows(times: dict) -> list:
  """`times[(layers, scan)] = [seconds, ...]` -> one row each: median, min, max and the
  median over the same layout's shallowest median."""
  rows = []
  for (layers, scan), values in sorted(times.items(), key=lambda kv: (not kv[0][1], kv[0][0])):
    shallowest = min(l for l, s in times if s == scan)
    base = statistics.median(times[(shallowest, scan)])
    median = statistics.median(values)
    rows.append(dict(layers=layers, scan_layers=scan, seconds=median, seconds_min=min(values),
                     seconds_max=max(values), repeats=len(values), over_shallowest=median / base))
  return rows


def compile_seconds(layers: int, scan: bool) -> float:
  config = command_line.experiment_config(
      FLAGS.config, [('model.num_layers', str(layers)), ('model.scan_layers', str(scan))])
  validate_config(config, jax.device_count())
  start = time.perf_counter()
  train_step_memory(config)
  return time.perf_counter() - start


def main(argv) -> None:
  del argv
  depths = [int(d) for d in FLAGS.layers.split(',')]
  times = {(d, scan): [] for d in depths for scan in (True, False)}
  for _ in range(FLAGS.repeats):
    for key in times:
      times[key].append(compile_seconds(*key))
  print(f'train step compile time, {FLAGS.config}, {jax.devices()[0].platform} '
        f'({jax.device_count()} devices)')
  print('| layers | scan_layers | seconds (median) | min | max | over the shallowest |')
  print('|---:|---|---:|---:|---:|---:|')
  for row in ratio_rows(times):
    print(f"| {row['layers']} | {row['scan_layers']} | {row['seconds']:.2f} | "
          f"{row['seconds_min']:.2f} | {row['seconds_max']:.2f} | {row['over_shallowest']:.2f}x |")


if __name__ == '__main__':
  # Defined here, not at import: the tests import this module beside scripts with flags.
  flags.DEFINE_string('config', 'configs/default.py', 'The config file whose model is compiled.')
  flags.DEFINE_string('layers', '2,12', 'Depths to compile, comma-separated.')
  flags.DEFINE_integer('repeats', 3, 'Compilations of each (depth, layout), interleaved.')
  app.run(main)
