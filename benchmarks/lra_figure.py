r"""LRA's Figure 3 here: mean accuracy against training speed, memory as the bubble size.

  python -m benchmarks.lra_figure --scale=mini [--length=4096] [--out=docs/lra_mini.png]

One point per attention variant: y is its accuracy averaged over the tasks every plotted
variant was run on (each task's seeds averaged first; benchmarks/results/lra/accuracy.json;
a task some variant lacks would move only the variants that have it), x its training
steps per second on the Text task at `--length` tokens relative to vanilla's, and the
bubble's area its planned peak memory at that length relative to vanilla's
(benchmarks/results/lra/cost.json). A variant missing from either file is left out and
named on the console.
"""

import argparse
import collections
import math
import statistics
import sys

import matplotlib
matplotlib.use('Agg')
import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top

from benchmarks.lra_results import is_own_config, read_rows

BASELINES = ('majority', 'first_token_rule', 'pixel_statistics', 'first_256_bytes',
             'length_only', 'known_cut_groups', 'connected_components', 'cnn_control',
             'cnn_control_marker_side')


def mean_accuracy(rows: list[dict], scale: str, variants) -> tuple[dict, list[str]]:
  """`({variant: mean over the shared tasks of the mean over seeds}, the shared tasks)` of
  the model rows of `variants`: the tasks every one of them has a row of."""
  by_task = collections.defaultdict(lambda: collections.defaultdict(list))
  for row in rows:
    if row['scale'] == scale and row['variant'] in variants and is_own_config(row):
      by_task[row['variant']][row['task']].append(row['accuracy'])
  shared = sorted(set.intersection(*(set(tasks) for tasks in by_task.values()))
                  if by_task else ())
  return ({variant: statistics.mean(statistics.mean(tasks[t]) for t in shared)
           for variant, tasks in by_task.items()}, shared)


def label_offsets(points: dict, x_gap: float = 0.12, y_gap: float = 0.035
                  ) -> tuple[dict, float]:
  """`({name: k}, height)`: each point's label is drawn k label heights (`height`, in y's
  units) under its point so that no two labels overlap. `points` is `{name: (x, y)}` with x
  on the log axis; two labels collide when their x are within `x_gap` decades and their
  drawn y within `height`, `y_gap` of the y range. Labels are placed from the top down,
  each lowered until it is clear of those placed."""
  ys = [y for _, y in points.values()]
  height = y_gap * ((max(ys) - min(ys)) or 1.0)
  placed, offsets = [], {}
  for name, (x, y) in sorted(points.items(), key=lambda item: -item[1][1]):
    decade, k = math.log10(x), 0
    while any(abs(decade - px) < x_gap and abs(y - k * height - py) < height
              for px, py in placed):
      k += 1
    placed.append((decade, y - k * height))
    offsets[name] = k
  return offsets, height


def labels_bottom(points: dict, lowered: dict, height: float) -> float:
  """The lowest y a label reaches (`lowered`, `height`: from `label_offsets`), less half a
  label height: the y axis must reach it, or a label lowered past the lowest point is cut."""
  return min(y - lowered[name] * height for name, (_, y) in points.items()) - height / 2


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--scale', default='mini')
  parser.add_argument('--length', type=int, default=4096)
  parser.add_argument('--accuracy', default='benchmarks/results/lra/accuracy.json')
  parser.add_argument('--cost', default='benchmarks/results/lra/cost.json')
  parser.add_argument('--out', default='docs/lra_mini.png')
  args = parser.parse_args(argv)
  rows = read_rows(args.accuracy)
  cost = {row['variant']: row for row in read_rows(args.cost)
          if row['scale'] == args.scale and row['length'] == args.length
          and 'relative_steps_per_s' in row}
  models = {row['variant'] for row in rows if row['scale'] == args.scale
            and row['variant'] not in BASELINES and is_own_config(row)}
  for variant in sorted(models - set(cost)):
    print(f'{variant}: no cost row at {args.length} tokens; left out')
  accuracy, tasks = mean_accuracy(rows, args.scale, models & set(cost))
  figure, axes = plt.subplots(figsize=(7, 5))
  points = {variant: (cost[variant]['relative_steps_per_s'], score)
            for variant, score in accuracy.items()}
  lowered, height = label_offsets(points)
  for variant, (speed, score) in sorted(points.items()):
    axes.scatter(speed, score, s=600 * cost[variant]['relative_peak'], alpha=0.4)
    # Beside the bubble, at the height label_offsets placed it (the y it checked for overlap).
    axes.annotate(variant, (speed, score - lowered[variant] * height), xytext=(6, 0),
                  textcoords='offset points', fontsize=8, ha='left', va='center')
  axes.set_ylim(bottom=min(axes.get_ylim()[0], labels_bottom(points, lowered, height)))
  axes.set_xlabel(f'training steps per second relative to vanilla (Text, {args.length} tokens)')
  axes.set_ylabel(f"test accuracy, mean over {', '.join(tasks)}")
  axes.set_xscale('log')
  axes.set_title(f'LRA {args.scale}: accuracy, speed and memory (bubble area: peak '
                 f'memory / vanilla\'s)', fontsize=9)
  figure.tight_layout()
  figure.savefig(args.out, dpi=100)
  print(f'wrote {args.out}')
  return 0


if __name__ == '__main__':
  sys.exit(main())
