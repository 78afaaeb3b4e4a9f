r"""The shortcut rows of the LRA table: what each task's score means beside the simplest rules.

  python -m benchmarks.lra_shortcuts --scale=mini [--train_examples=20000]
  python -m benchmarks.lra_shortcuts --scale=mini --tasks=retrieval \
      --setting=data.lra_retrieval.num_links=2

Fits each baseline of longformer_jax/evaluation/lra_baselines.py on the first
`--train_examples` generated training examples of `configs/lra.py:TASK,vanilla,SCALE`'s data
and scores it on the same 2,000 generated test examples the models are tested on:

  listops      majority, first_token_rule
  pathfinder   majority, pixel_statistics
  text         majority, length_only, and known_cut_groups (a reference told each
               document's seam, not a shortcut: see lra_baselines)
  retrieval    majority, length_only

(`first_256_bytes`, the trained model that reads only the first 256 bytes, comes from
benchmarks/lra_table.py.) Rows go into benchmarks/results/lra/accuracy.json with seed 0.
`--setting data.SECTION.KEY=VALUE` (repeatable) scores the shortcuts on the data of a fair
try of the same settings (benchmarks/lra_table.py): its rows carry the same `settings` field,
so a try's model row and its shortcut rows sit side by side. Only `data.` keys are taken:
the shortcuts read nothing else.
"""

import argparse
import sys

import numpy as np

from benchmarks.lra_results import ACCURACY_KEY, merge_rows
from benchmarks.lra_table import parse_settings
from configs import lra
from longformer_jax.config.errors import ConfigError
from longformer_jax.config.overrides import with_overrides
from longformer_jax.data.lra import document_matching, listops, pathfinder, text_classification
from longformer_jax.evaluation import lra_baselines


def task_config(task: str, scale: str, settings: tuple = ()) -> dict:
  """`configs/lra.py:TASK,vanilla,SCALE` with `settings` (`'data.SECTION.KEY=VALUE'`)."""
  return with_overrides(lra.get_config(f'{task},vanilla,{scale}'),
                        [setting.split('=', 1) for setting in settings])


def pathfinder_data(scale: str, split: str, count: int,
                    settings: tuple = ()) -> pathfinder.PathfinderSplit:
  """The generated Pathfinder split with its record (markers, paths), as the runs draw it."""
  return pathfinder.pathfinder_split(pathfinder_section(scale, settings), split, count)


def pathfinder_section(scale: str, settings: tuple = ()) -> pathfinder.PathfinderConfig:
  """The generator's settings of `configs/lra.py:pathfinder,vanilla,SCALE` with `settings`."""
  data = task_config('pathfinder', scale, settings)['data']
  return pathfinder.PathfinderConfig.build(data.get('pathfinder'), 'data.pathfinder')


def task_data(task: str, scale: str, split: str, count: int, settings: tuple = ()):
  """`(examples, labels)` of `split` as configs/lra.py's runs of `task` generate them, with
  `settings` (`'data.SECTION.KEY=VALUE'`) applied."""
  if task == 'pathfinder':
    images = pathfinder_data(scale, split, count, settings)
    return images.images, images.labels
  data = task_config(task, scale, settings)['data']
  if task == 'listops':
    section = listops.ListOpsConfig.build(data.get('listops'), 'data.listops')
    trees = listops.listops_split(section, split, count)
    return trees, np.array([t.label for t in trees])
  if task == 'text':
    section = text_classification.TextConfig.build(data.get('lra_text'), 'data.lra_text')
    documents = text_classification.text_split(section, split, count)
    return documents, np.array([d.label for d in documents])
  section = document_matching.RetrievalConfig.build(data.get('lra_retrieval'),
                                                    'data.lra_retrieval')
  pairs = document_matching.retrieval_split(section, split, count)
  return pairs, np.array([p.label for p in pairs])


def lengths(task: str, examples) -> np.ndarray:
  if task == 'text':
    return np.array([[len(d.data)] for d in examples])
  return np.array([[len(p.first), len(p.second)] for p in examples])


def shortcut_rows(task: str, scale: str, train_count: int, test_count: int,
                  settings: tuple = ()) -> list[dict]:
  """The baseline rows of `task` (on the data of `settings`, checked `data.` overrides)."""
  train, train_y = task_data(task, scale, 'train', train_count, settings)
  test, test_y = task_data(task, scale, 'test', test_count, settings)
  classes = 10 if task == 'listops' else 2
  scores = {'majority': lra_baselines.majority(train_y, test_y)}
  if task == 'listops':
    scores['first_token_rule'], _ = lra_baselines.first_token_rule(
        [t.symbols[0] for t in train], train_y, [t.symbols[0] for t in test], test_y)
  elif task == 'pathfinder':
    predicted = lra_baselines.softmax_regression(
        lra_baselines.pixel_statistics_features(train), train_y,
        lra_baselines.pixel_statistics_features(test), classes)
    scores['pixel_statistics'] = lra_baselines.accuracy(predicted, test_y)
  else:
    predicted = lra_baselines.softmax_regression(
        lra_baselines.length_features(lengths(task, train)), train_y,
        lra_baselines.length_features(lengths(task, test)), classes)
    scores['length_only'] = lra_baselines.accuracy(predicted, test_y)
  if task == 'text':
    def halves(documents):
      return [(d.data[:d.cut], d.data[d.cut:]) for d in documents]
    groups = [[int(g == 'test') for g in d.groups] for d in train]
    scores['known_cut_groups'] = lra_baselines.known_cut_groups(
        halves(train), groups, halves(test), test_y)
  command = (f'python -m benchmarks.lra_shortcuts --scale={scale} '
             f'--train_examples={train_count}')
  try_fields = {}
  if settings:
    command += f' --tasks={task}' + ''.join(f' --setting={s}' for s in settings)
    try_fields = {'settings': ' '.join(settings)}
  return [{'task': task, 'variant': name, 'scale': scale, 'seed': 0,
           'accuracy': round(score, 4), 'train_examples': len(train_y),
           'test_examples': len(test_y), 'command': command, **try_fields}
          for name, score in scores.items()]


def data_settings(settings: list[str]) -> tuple:
  """`--setting` values checked (KEY=VALUE, `data.` keys only) and sorted as lra_table
  sorts a fair try's, so both name the same try alike."""
  checked = parse_settings(settings)
  for setting in checked:
    if not setting.startswith('data.'):
      raise ValueError(f'--setting {setting!r}: the shortcuts read only the data; '
                       'expected data.SECTION.KEY=VALUE')
  return tuple(checked)


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--scale', default='mini', choices=lra.SCALES)
  parser.add_argument('--tasks', default=','.join(lra.TASKS))
  parser.add_argument('--train_examples', type=int, default=20_000)
  parser.add_argument('--test_examples', type=int, default=2_000)
  parser.add_argument('--results', default='benchmarks/results/lra/accuracy.json')
  parser.add_argument('--setting', action='append', default=[],
                      help='data.SECTION.KEY=VALUE: the data of a fair try (repeatable)')
  args = parser.parse_args(argv)
  try:
    settings = data_settings(args.setting)
  except ValueError as error:
    print(f'error: {error}', file=sys.stderr)
    return 2
  for task in [t.strip() for t in args.tasks.split(',') if t.strip()]:
    try:
      rows = shortcut_rows(task, args.scale, args.train_examples, args.test_examples,
                           settings)
    except ConfigError as error:
      print(f'error: {error}', file=sys.stderr)
      return 2
    merge_rows(args.results, rows, ACCURACY_KEY)
    for row in rows:
      print(f"{row['task']:11s} {row['variant']:17s} {row['accuracy']:.4f}", flush=True)
  return 0


if __name__ == '__main__':
  sys.exit(main())
