"""What a short passkey training with the kNN memory gives its retrieval (docs/passkey.md).

  python -m benchmarks.passkey_knn_short_training --steps=1,300 --seeds=0,1 \\
      --root=workdirs/knn_short
  python -m benchmarks.passkey_knn_short_training --steps=1 --seeds=0 --random_retrieval \\
      --root=workdirs/knn_short
  python -m benchmarks.passkey_knn_short_training --score=workdirs/passkey_knn \\
      --random_retrieval --out=random.json

Trains configs/passkey_memory.py:knn (batch 16, chunks of 128, kNN memory
of 2,048 in layer 2, local cache of 128) for each number of steps and seed
in `ROOT/<steps>_<seed>` (the first half of the steps on documents of one
chunk, the length curriculum, the rest on documents of up to 2,048 bytes;
one step: one-chunk documents), then scores the passkey grid
(`--grid`, default documents of 1,024 and 2,048 tokens, needle depths 0
and 50%, 4 documents each, the memory as trained) and prints per cell
`needle_share` (per answer token, the needle's share of what its query
retrieved, in the best head), `needle_in_top_k` and the digit accuracy.

`--random_retrieval`: the kNN layer retrieves with random queries instead of
its own (`memory.key_value.retrieve` wrapped in this process), both in
training and in scoring: what `needle_share` is when retrieval ignores the
question.

`--score=WORKDIR`: trains nothing; scores the run in WORKDIR (a
configs/passkey_memory.py:knn run, as train.py wrote it) on the same grid,
with its own queries or, with `--random_retrieval`, random ones. `--out`
then holds that run's cells. Run from the repository root (`-m`: it
imports train.py and eval.py).
"""

import argparse
import json
import os
import shutil
import time

import jax

from longformer_jax.command_line import experiment_config
from longformer_jax.memory import key_value

GRID = 'lengths=1024,2048;depths=0,50;documents=4;memories=trained'


def knn_passkey_config(steps: int, seed: int):
  """configs/passkey_memory.py:knn for `steps` steps (half of them the curriculum's)."""
  overrides = [('train.num_steps', steps), ('train.eval_every', 0),
               ('train.checkpoint_every', steps), ('train.log_every', 50),
               ('train.async_checkpointing', False), ('seed', seed)]
  if steps > 1:
    overrides.append(('data.passkey_curriculum_steps', steps // 2))
  else:             # one step leaves no step for the curriculum's second stage
    overrides += [('data.passkey_curriculum_steps', 0), ('data.passkey_max_length', 127)]
  return experiment_config('configs/passkey_memory.py:knn', overrides)


def use_random_queries() -> None:
  """Makes every kNN retrieval of this process use random queries `[b, c, h, d]`."""
  retrieve = key_value.retrieve

  def random_retrieve(memory, queries, *args, **kwargs):
    noise = jax.random.normal(jax.random.PRNGKey(0), queries.shape, queries.dtype)
    return retrieve(memory, noise, *args, **kwargs)
  key_value.retrieve = random_retrieve


def score(config, workdir: str, grid: str) -> list[dict]:
  """The passkey grid's cells of the run in `workdir` (eval.py's `evaluate_run`)."""
  import eval as eval_script  # pylint: disable=g-import-not-at-top
  config.eval.passkey_grid = grid
  return eval_script.evaluate_run(config, workdir)['cells']


def describe_cells(cells: list[dict]) -> str:
  """`length/depth: needle_share, needle_in_top_k, digit accuracy` per cell."""
  return '; '.join(f"{c['length']}/{c['depth']}: {c['needle_share']:.3f}, "
                   f"{c['needle_in_top_k']:.2f}, {c['digit_accuracy']:.2f}" for c in cells)


def main():
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--steps', default='1,300')
  parser.add_argument('--seeds', default='0,1')
  parser.add_argument('--grid', default=GRID)
  parser.add_argument('--random_retrieval', action='store_true')
  parser.add_argument('--root', default='', help='run directories go under it (replaced)')
  parser.add_argument('--score', default='', help='score this run instead of training')
  parser.add_argument('--out', default='')
  args = parser.parse_args()
  if bool(args.root) == bool(args.score):
    parser.error('give one of --root (train and score) and --score (score a run)')
  if args.random_retrieval:
    use_random_queries()
  retrieval = 'random' if args.random_retrieval else 'model'
  if args.score:
    cells = score(experiment_config('configs/passkey_memory.py:knn', []), args.score, args.grid)
    print(f'{args.score} ({retrieval} queries): {describe_cells(cells)}')
    if args.out:
      with open(args.out, 'w') as f:
        json.dump(dict(workdir=args.score, retrieval=retrieval, cells=cells), f, indent=1)
    return
  from train import train  # pylint: disable=g-import-not-at-top
  results = []
  print('| steps | seed | retrieval | train s | cell (length/depth): needle_share, '
        'needle_in_top_k, digit accuracy | mean needle_share |')
  print('|---:|---:|---|---:|---|---:|')
  for steps in [int(s) for s in args.steps.split(',')]:
    for seed in [int(s) for s in args.seeds.split(',')]:
      workdir = os.path.join(args.root, f'{steps}_{seed}')
      shutil.rmtree(workdir, ignore_errors=True)
      config = knn_passkey_config(steps, seed)
      began = time.time()
      train(config, workdir)
      seconds = time.time() - began
      cells = score(config, workdir, args.grid)
      mean = sum(c['needle_share'] for c in cells) / len(cells)
      print(f'| {steps} | {seed} | {retrieval} | {seconds:.0f} | {describe_cells(cells)} '
            f'| {mean:.3f} |', flush=True)
      results.append(dict(steps=steps, seed=seed, retrieval=retrieval, train_seconds=seconds,
                          cells=cells))
  if args.out:
    with open(args.out, 'w') as f:
      json.dump(results, f, indent=1)


if __name__ == '__main__':
  main()
