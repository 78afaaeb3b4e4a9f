r"""The Long Range Arena table: train and test every (task, variant, seed), one JSON row each.

  python -m benchmarks.lra_table --scale=mini --tasks=listops,pathfinder \
      --variants=vanilla,bigbird --seeds=0,1 --root=workdirs/lra

Each run is what a user runs, in its own processes:

  python train.py --config=configs/lra.py:TASK,VARIANT,SCALE --workdir=ROOT/SCALE/TASK/VARIANT/seedN \
      --config.seed=N
  python eval.py  --config=configs/lra.py:TASK,VARIANT,SCALE --workdir=... --config.eval.split=test

and its row (task, variant, scale, seed, test accuracy, steps, wall times, the float32 2048^3
matmul rate measured before and after training) goes into `--results`
(benchmarks/results/lra/accuracy.json), replacing an older row of the same run; the file is
rewritten whole through a temporary file, so an interrupted table loses nothing written.
The variant `first_256_bytes` (Text, Retrieval) is the vanilla model reading only each
document's first 256 bytes (`data.seq_len` 257 with [CLS]): the shortcut beside the scores.

A fair try of other settings is a run of its own: `--setting=model.bigbird.block=4` (repeat
it for more) passes `--config.model.bigbird.block=4` to both commands, trains in
`ROOT/SCALE/TASK/VARIANT+model.bigbird.block=4/seedN`, and writes a row with a `settings`
field, kept beside the row of the variant's own config (the figure plots the latter only).

Self-pretraining (Amos et al., 2024): `--pretrain_steps=N` first trains the same encoder by
masked-token prediction on the task's training inputs for N steps
(`configs/lra.py:TASK,VARIANT,SCALE,masked`, the same settings, in `WORKDIR/pretraining`),
then the classifier from it (`--config.train.init_from=WORKDIR/pretraining`), in
`ROOT/SCALE/TASK/VARIANT[+settings]+pretrain_steps=N/seedN`; the row gains `pretrain_steps`
and `pretrain_seconds`. A finished pretraining run is reused, not repeated; its
`pretrain_seconds` is then the one recorded when it trained (`pretraining/table_seconds.json`),
or null where the table did not train it from nothing (a copied or resumed run; a run
that was stopped before its first checkpoint counts as nothing).
"""

import argparse
import json
import os
import subprocess
import sys
import time

from benchmarks import matmul_rate
from benchmarks.lra_results import ACCURACY_KEY, merge_rows
from configs import lra
from longformer_jax.checkpoint.checkpointer import Checkpointer

PREFIX_VARIANT = 'first_256_bytes'
PREFIX_TASKS = ('text', 'retrieval')
PRETRAINING_SECONDS = 'table_seconds.json'   # in WORKDIR/pretraining: its training time


def run_command(arguments: list[str], log_path: str) -> float:
  """Runs a script of the repository, its output appended to `log_path`; returns its seconds.
  A failing run raises `RuntimeError` naming the log."""
  start = time.perf_counter()
  with open(log_path, 'a') as log:
    log.write(f'$ {" ".join(arguments)}\n')
    log.flush()
    status = subprocess.call([sys.executable] + arguments, stdout=log, stderr=subprocess.STDOUT)
  if status:
    raise RuntimeError(f'{arguments[0]} exited with {status}; see {log_path}')
  return time.perf_counter() - start


def gflops() -> float:
  return matmul_rate.measure().median_flops_per_s / 1e9


def parse_settings(settings: list[str]) -> list[str]:
  """`['KEY=VALUE', ...]` checked and sorted; a malformed one raises `ValueError` naming it."""
  for setting in settings:
    key, equals, value = setting.partition('=')
    if not equals or not key or not value or key.startswith('-') or '/' in setting:
      raise ValueError(f'--setting {setting!r}: expected KEY=VALUE, e.g. model.bigbird.block=4')
  return sorted(settings)


def has_saved_step(workdir: str) -> bool:
  """Whether the run in `workdir` saved a finished checkpoint (an empty `checkpoints`
  folder, left by a run stopped before its first save, is not one)."""
  if not os.path.isdir(os.path.join(workdir, 'checkpoints')):
    return False
  with Checkpointer(workdir, keep=1, async_save=False) as checkpoints:
    return checkpoints.latest_step() is not None


def recorded_pretraining_seconds(pretrained: str, seconds: float | None) -> float | None:
  """The training time of the pretraining run `pretrained`: the table run that trained it
  from nothing records `seconds` in `PRETRAINING_SECONDS`; a later one, whose train.py only
  found the run finished, reads that record back (`seconds` None: the run was there
  before, so this call's time is not its training time; None when nothing was recorded)."""
  path = os.path.join(pretrained, PRETRAINING_SECONDS)
  if os.path.isfile(path):
    with open(path) as f:
      return json.load(f)['seconds']
  if seconds is not None:
    with open(path, 'w') as f:
      json.dump({'seconds': seconds}, f)
  return seconds


def run_one(task: str, variant: str, scale: str, seed: int, root: str,
            settings: tuple = (), pretrain_steps: int = 0) -> dict:
  """Trains and tests one run (`settings`: config overrides `KEY=VALUE`; `pretrain_steps`:
  self-pretraining first, 0: none); returns its row."""
  model_variant = 'vanilla' if variant == PREFIX_VARIANT else variant
  config = f'--config=configs/lra.py:{task},{model_variant},{scale}'
  pretraining = (f'pretrain_steps={pretrain_steps}',) if pretrain_steps else ()
  run_name = '+'.join((variant,) + tuple(settings) + pretraining)
  workdir = os.path.join(root, scale, task, run_name, f'seed{seed}')
  os.makedirs(workdir, exist_ok=True)
  extra = ['--config.data.seq_len=257'] if variant == PREFIX_VARIANT else []
  extra += [f'--config.{setting}' for setting in settings]
  log_path = os.path.join(workdir, 'table.log')
  pretrain_seconds, start_from = 0.0, []
  if pretrain_steps:
    pretrained = os.path.join(workdir, 'pretraining')
    from_nothing = not has_saved_step(pretrained)
    pretrain_seconds = run_command(
        ['train.py', f'{config},{lra.PRETRAINING}', f'--workdir={pretrained}',
         f'--config.seed={seed}'] + extra + [f'--config.train.num_steps={pretrain_steps}'],
        log_path)
    pretrain_seconds = recorded_pretraining_seconds(
        pretrained, pretrain_seconds if from_nothing else None)
    start_from = [f'--config.train.init_from={pretrained}']
  rate_before = gflops()
  train_seconds = run_command(['train.py', config, f'--workdir={workdir}',
                               f'--config.seed={seed}'] + extra + start_from, log_path)
  rate_after = gflops()
  eval_seconds = run_command(['eval.py', config, f'--workdir={workdir}', f'--config.seed={seed}',
                              '--config.eval.split=test'] + extra, log_path)
  with open(os.path.join(workdir, 'eval', 'metrics.json')) as f:
    metrics = json.load(f)
  row = {'task': task, 'variant': variant, 'scale': scale, 'seed': seed,
          'accuracy': metrics['accuracy'], 'test_examples': int(metrics['examples']),
          'steps': metrics['checkpoint_step'], 'train_seconds': round(train_seconds, 1),
          'eval_seconds': round(eval_seconds, 1),
          'matmul_gflops': [round(rate_before, 1), round(rate_after, 1)],
          'command': f'python train.py {config} --workdir=W --config.seed={seed}'
                     + ''.join(f' {e}' for e in extra)}
  if settings:
    row['settings'] = ' '.join(settings)
  if pretrain_steps:
    row.update(pretrain_steps=pretrain_steps, pretrain_seconds=(
        None if pretrain_seconds is None else round(pretrain_seconds, 1)))
    row['command'] = (f'python train.py {config},{lra.PRETRAINING} --workdir=W/pretraining '
                      f'--config.seed={seed}' + ''.join(f' {e}' for e in extra)
                      + f' --config.train.num_steps={pretrain_steps}; ' + row['command']
                      + ' --config.train.init_from=W/pretraining')
  return row


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--scale', default='mini', choices=lra.SCALES)
  parser.add_argument('--tasks', default=','.join(lra.TASKS))
  parser.add_argument('--variants', default='',
                      help='comma-separated; empty: every variant of each task')
  parser.add_argument('--seeds', default='0')
  parser.add_argument('--root', default='workdirs/lra')
  parser.add_argument('--results', default='benchmarks/results/lra/accuracy.json')
  parser.add_argument('--setting', action='append', default=[],
                      help='a config override KEY=VALUE for a fair try (repeatable)')
  parser.add_argument('--pretrain_steps', type=int, default=0,
                      help='self-pretraining steps (masked tokens) before each run; 0: none')
  args = parser.parse_args(argv)
  if args.pretrain_steps < 0:
    print(f'--pretrain_steps: {args.pretrain_steps} must be >= 0 (0: none)', file=sys.stderr)
    return 2
  try:
    settings = tuple(parse_settings(args.setting))
  except ValueError as error:
    print(error, file=sys.stderr)
    return 2
  seeds = [int(s) for s in args.seeds.split(',') if s.strip()]
  failures = 0
  for task in [t.strip() for t in args.tasks.split(',') if t.strip()]:
    known = tuple(lra.variants(task, args.scale)) + (
        (PREFIX_VARIANT,) if task in PREFIX_TASKS else ())
    wanted = [v.strip() for v in args.variants.split(',') if v.strip()] or list(known)
    for variant in wanted:
      if variant not in known:
        print(f'skip {task},{variant}: not a variant of {task}', flush=True)
        continue
      for seed in seeds:
        try:
          row = run_one(task, variant, args.scale, seed, args.root, settings,
                        args.pretrain_steps)
        except RuntimeError as error:
          failures += 1
          print(f'{task},{variant},seed {seed}: {error}', flush=True)
          continue
        merge_rows(args.results, [row], ACCURACY_KEY)
        print(json.dumps(row), flush=True)
  return 1 if failures else 0


if __name__ == '__main__':
  sys.exit(main())
