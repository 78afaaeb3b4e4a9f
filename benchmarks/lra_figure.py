r"""LRA's Figure 3 here: mean accuracy against training speed, memory as the bubble size.

  python -m benchmarks.lra_figure --scale=mini [--length=4096] [--out=docs/lra_mini.png]

One point per attention variant: y is its accuracy averaged over the tasks it was run on
(each task's seeds averaged first; benchmarks/results/lra/accuracy.json), x its training
steps per second on the Text task at `--length` tokens relative to vanilla's, and the
bubble's area its planned peak memory at that length relative to vanilla's
(benchmarks/results/lra/cost.json). A variant missing from either file is left out and
named on the console.
"""

import argparse
import collections
import statistics
import sys

import matplotlib
matplotlib.use('Agg')
import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top

from benchmarks.lra_results import read_rows

BASELINES = ('majority', 'first_token_rule', 'pixel_statistics', 'first_256_bytes',
             'length_only')


def mean_accuracy(rows: list[dict], scale: str) -> dict:
  """`{variant: (mean over tasks of the mean over seeds, tasks)}` of the model rows."""
  by_task = collections.defaultdict(lambda: collections.defaultdict(list))
  for row in rows:
    if row['scale'] == scale and row['variant'] not in BASELINES:
      by_task[row['variant']][row['task']].append(row['accuracy'])
  return {variant: (statistics.mean(statistics.mean(v) for v in tasks.values()), sorted(tasks))
          for variant, tasks in by_task.items()}


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--scale', default='mini')
  parser.add_argument('--length', type=int, default=4096)
  parser.add_argument('--accuracy', default='benchmarks/results/lra/accuracy.json')
  parser.add_argument('--cost', default='benchmarks/results/lra/cost.json')
  parser.add_argument('--out', default='docs/lra_mini.png')
  args = parser.parse_args(argv)
  accuracy = mean_accuracy(read_rows(args.accuracy), args.scale)
  cost = {row['variant']: row for row in read_rows(args.cost)
          if row['scale'] == args.scale and row['length'] == args.length
          and 'relative_steps_per_s' in row}
  figure, axes = plt.subplots(figsize=(7, 5))
  for variant, (score, tasks) in sorted(accuracy.items()):
    if variant not in cost:
      print(f'{variant}: no cost row at {args.length} tokens; left out')
      continue
    row = cost[variant]
    axes.scatter(row['relative_steps_per_s'], score, s=600 * row['relative_peak'], alpha=0.4)
    axes.annotate(variant, (row['relative_steps_per_s'], score), fontsize=8,
                  ha='center', va='center')
  axes.set_xlabel(f'training steps per second relative to vanilla (Text, {args.length} tokens)')
  axes.set_ylabel('accuracy, mean over tasks')
  axes.set_xscale('log')
  axes.set_title(f'LRA {args.scale}: accuracy, speed and memory (bubble area: peak '
                 f'memory / vanilla\'s)', fontsize=9)
  figure.tight_layout()
  figure.savefig(args.out, dpi=100)
  print(f'wrote {args.out}')
  return 0


if __name__ == '__main__':
  sys.exit(main())
