"""Evaluation-time memory sweeps: one trained model, many memories.

A model trained without memory (the Attendre paper's setting: vanilla RoPE
attention, short chunks, `mem_len = 0`) is evaluated with a memory variant,
size and eviction policy chosen at evaluation time. The eval-time layers
reuse vanilla's parameter names (`query`, `key`, `value`, `out`), so the
checkpoint loads unchanged. `eval.memory_sweep` is one string:

  'variant=attendre;policy=fifo,sink,lra_max,lfa;memory_size=128,256,512;q_memory_size=0;chunk=128'

`;` separates settings, `,` separates the values of one setting, and the
sweep evaluates every combination (the cartesian product). Settings:

- `variant`: attendre (the K/V memory with any policy), memorizing (kNN
  memory, FIFO, `gate='joint'` unless given: no extra parameter),
  streaming_sinks (StreamingLLM), vanilla (a FIFO cache of hidden states).
- `policy`: an eviction policy name of memory/policies.py (fifo, lru, lfu,
  lra, lra_last, lra_max, lra_sum, lfa, sink); 'sink' keeps `num_sinks` (4
  unless given) first tokens. memorizing and vanilla are FIFO;
  streaming_sinks is 'sink'.
- `memory_size` (M): `model.attendre.memory_size`; `model.memorizing.memory_size`;
  vanilla `model.mem_len`; streaming_sinks `model.streaming_sinks.window =
  chunk + M - num_sinks` (the last query of a chunk then sees M + chunk
  keys, as with attendre in its default order=attend_first; with
  order=insert_first an attendre query sees at most M keys).
- `q_memory_size` (N): attendre only. A decoder LM must use 0: delayed
  queries would see (and, bidirectional, leak) the tokens they predict, and
  their outputs would be N positions late; the sweep refuses N > 0.
- `chunk`: the evaluation chunk length (default `eval.chunk_len`, else the
  training one).
- any other key is a setting of the variant's section, `model.<variant>.<key>`
  (attention/attendre.py, memorizing.py, streaming_sinks.py), set on every
  layer, e.g. `rope_max_distance=63` (LM-Infinite cap), `top_k=32`,
  `lfa_gamma=0.9`, `init_std_multiplier=1`, `num_sinks=4`, `recent_window=48`,
  `admission=score` (memory/policies.py); values are read as int, then
  float, then bool ('true'/'false'), then str. A key applies to the points
  whose variant reads it (and, for the settings of some policies only, such
  as `lfa_gamma` or `admission`, whose policy reads it); the other points'
  rows show '-' for it. A key no point reads is an error naming the closest
  valid key.
- The trained model's sections of other attention variants go back to their
  defaults, and its layer schedule keeps only what the sweep does not set.

Results: one row per point with `variant`, `policy`, `memory_size`,
`q_memory_size`, `chunk`, the extra settings, `bits_per_byte`, `loss`,
`bits_per_token`, `perplexity`, `tokens`, `bytes`; with `eval.far_distance`
> 0 also `far_distance`, `far_bits_per_byte`, `far_bits_per_token`,
`far_tokens`, `far_bytes` (the far recurrences alone:
longformer_jax/data/far_recurrences.py). `write_sweep` writes them as JSON, a
Markdown table, and a plot of bits per byte against memory size with one
line per (variant, policy, other settings); and `memory_sweep_far.png`, the
same for the far recurrences.
"""

import dataclasses
import itertools
import json
import os

from longformer_jax.attention.registry import ATTENTION_VARIANTS
from longformer_jax.config.section import closest_name
from longformer_jax.config.errors import ConfigError, require
from longformer_jax.config.migration import renamed_field
from longformer_jax.evaluation.line_plots import save_line_plot
from longformer_jax.memory import policies
from longformer_jax.models.model_config import section_classes

SWEEP_KEY = 'eval.memory_sweep'
VARIANTS = ('attendre', 'memorizing', 'streaming_sinks', 'vanilla')
FIFO_ONLY = ('memorizing', 'vanilla')
DEFAULT_SINKS = 4
_BOOLS = {'true': True, 'false': False}
# Keys of the sweep itself (not section settings).
SWEEP_SETTINGS = ('variant', 'policy', 'memory_size', 'q_memory_size', 'chunk')
# Section keys each variant's points set from the sweep's own settings.
SET_BY_SWEEP = {'attendre': ('memory_size', 'q_memory_size', 'policy'),
                'memorizing': ('memory_size',), 'streaming_sinks': ('window',), 'vanilla': ()}
NOT_READ = '-'           # the value of an extra key at a point that does not read it


@dataclasses.dataclass(frozen=True)
class SweepPoint:
  """One evaluation of the sweep."""
  variant: str
  policy: str
  memory_size: int
  q_memory_size: int
  chunk: int
  extra: tuple = ()        # ((section key, value or NOT_READ), ...) set on every layer

  def describe(self) -> dict:
    return dict(variant=self.variant, policy=self.policy, memory_size=self.memory_size,
                q_memory_size=self.q_memory_size, chunk=self.chunk, **dict(self.extra))


def parse_value(text: str):
  """'128' -> 128, '0.9' -> 0.9, 'true' -> True, else the string."""
  for convert in (int, float):
    try:
      return convert(text)
    except ValueError:
      pass
  return _BOOLS.get(text.lower(), text)


def parse_settings(spec: str) -> dict:
  """'a=1,2;b=x' -> {'a': ['1', '2'], 'b': ['x']} (ConfigError naming eval.memory_sweep)."""
  settings = {}
  for part in (p.strip() for p in spec.split(';')):
    if not part:
      continue
    require('=' in part, SWEEP_KEY, f"expected 'key=value[,value...]', got {part!r}")
    key, values = (s.strip() for s in part.split('=', 1))
    items = [v.strip() for v in values.split(',') if v.strip()]
    require(key and items, SWEEP_KEY, f'{part!r} needs a key and at least one value')
    require(key not in settings, SWEEP_KEY, f'{key!r} is given twice')
    settings[key] = items
  return settings


def _ints(settings: dict, key: str, default: list[int]) -> list[int]:
  items = settings.pop(key, None)
  if items is None:
    return default
  try:
    values = [int(item) for item in items]
  except ValueError:
    raise ConfigError(SWEEP_KEY, f'{key} must be integers, got {items}') from None
  require(all(v >= 0 for v in values), SWEEP_KEY, f'{key} must be >= 0, got {values}')
  return values


def section_keys(variant: str) -> tuple:
  """The keys of `model.<variant>` a sweep may set (those it does not set itself)."""
  names = section_classes()[variant].field_names()
  return tuple(name for name in names if name not in SET_BY_SWEEP[variant])


def reads(variant: str, policy: str, key: str) -> bool:
  """Whether a point of `variant` and `policy` reads the extra key `key`."""
  if key not in section_keys(variant):
    return False
  return variant != 'attendre' or policies.reads_setting(policy, key)


def _check_extra_key(key: str, pairs: list) -> None:
  """ConfigError unless some (variant, policy) of the sweep reads `key`."""
  variants = sorted({variant for variant, _ in pairs})
  valid = sorted({name for variant in variants for name in section_keys(variant)})
  if key in valid:
    if not any(reads(variant, policy, key) for variant, policy in pairs):
      readers = ' | '.join(policies.POLICY_SETTINGS[key])
      raise ConfigError(SWEEP_KEY, f'{key!r} is read only by policy {readers}; '
                        'no point of the sweep has one')
    return
  set_by = [v for v in variants if key in SET_BY_SWEEP[v]]
  if set_by:
    raise ConfigError(SWEEP_KEY, f'{key!r} of {set_by[0]} is set by the sweep from memory_size '
                      'and chunk')
  renamed = renamed_field(key, variants)
  if renamed:
    raise ConfigError(SWEEP_KEY, f'unknown key {key!r}; it is now {renamed!r}')
  raise ConfigError(SWEEP_KEY, f'unknown key {key!r} (variant {", ".join(variants)}: one of '
                    f'{", ".join(SWEEP_SETTINGS + tuple(valid))})'
                    f'{closest_name(key, SWEEP_SETTINGS + tuple(valid))}')


def parse_sweep(spec: str, default_chunk: int) -> list[SweepPoint]:
  """Every point of the sweep `spec` (module docstring), in a stable order."""
  settings = parse_settings(spec)
  variants = settings.pop('variant', ['attendre'])
  for variant in variants:
    require(variant in VARIANTS, SWEEP_KEY, f'unknown variant {variant!r}; choose from {VARIANTS}')
  policy_names = settings.pop('policy', ['fifo'])
  for policy in policy_names:
    require(policy in policies.POLICY_CHOICES, SWEEP_KEY,
            f'unknown policy {policy!r}; choose from {policies.POLICY_CHOICES}'
            f'{closest_name(policy, policies.POLICY_CHOICES)}')
  memory_sizes = _ints(settings, 'memory_size', [128])
  q_sizes = _ints(settings, 'q_memory_size', [0])
  chunks = _ints(settings, 'chunk', [default_chunk])
  require(all(c > 0 for c in chunks), SWEEP_KEY, f'chunk must be > 0, got {chunks}')
  require(all(n == 0 for n in q_sizes), SWEEP_KEY,
          'q_memory_size must be 0 for language-model evaluation: delayed queries would see '
          'the tokens they predict (Attendre is bidirectional) and answer N positions late')
  for variant, policy in itertools.product(variants, policy_names):
    if variant in FIFO_ONLY:
      require(policy == 'fifo', SWEEP_KEY, f'{variant} memory is FIFO; got policy {policy!r}')
    if variant == 'streaming_sinks':
      require(policy == 'sink', SWEEP_KEY, f"streaming_sinks is policy 'sink'; got {policy!r}")
  extra_keys = sorted(settings)
  for key in extra_keys:
    _check_extra_key(key, list(itertools.product(variants, policy_names)))
  extra_values = [[parse_value(v) for v in settings[k]] for k in extra_keys]
  points = []
  for variant, policy, size, q_size, chunk, *extra in itertools.product(
      variants, policy_names, memory_sizes, q_sizes, chunks, *extra_values):
    extra = tuple((key, value if reads(variant, policy, key) else NOT_READ)
                  for key, value in zip(extra_keys, extra))
    point = SweepPoint(variant, policy, size, q_size, chunk, extra)
    if point not in points:       # keys a point does not read make no new point
      points.append(point)
  return points


def _plain(values) -> dict:
  """A plain dict of a (Frozen)ConfigDict or mapping."""
  return values.to_dict() if hasattr(values, 'to_dict') else dict(values)


def _section_override(point: SweepPoint, trained_model, settings: dict) -> dict:
  """`model.<variant>` of the point: the trained model's section with the sweep's keys set.

  `settings` holds the keys the sweep sets; the policy settings the point's
  policy does not read go back to their defaults (they would be errors).
  """
  defaults = section_classes()[point.variant]()
  section = _plain(trained_model[point.variant])
  section.update(settings)
  if point.variant == 'attendre':
    for name in policies.POLICY_SETTINGS:
      if not policies.reads_setting(point.policy, name):
        section[name] = getattr(defaults, name)
  return section


def model_overrides(point: SweepPoint, trained_model) -> dict:
  """Top-level model keys for `lm_model_config(trained_model, vocab, **overrides)`.

  `attention`, `mem_len`, whole sections (`attendre={...}`: the trained
  model's section with the sweep's keys merged in; the sections of other
  attention variants at their defaults where they differ) and the layer
  schedule: the trained model's, less the keys the sweep sets and the
  sections of attention variants the point does not use.
  """
  extra = {key: value for key, value in point.extra if reads(point.variant, point.policy, key)}
  size = point.memory_size
  if point.variant == 'attendre':
    settings = dict(memory_size=size, q_memory_size=point.q_memory_size, policy=point.policy)
    if point.policy == 'sink':
      settings['num_sinks'] = DEFAULT_SINKS
    mem_len = 0
  elif point.variant == 'memorizing':
    settings, mem_len = dict(memory_size=size, gate='joint'), 0
  elif point.variant == 'streaming_sinks':
    settings, mem_len = dict(num_sinks=DEFAULT_SINKS), 0
  else:
    settings, mem_len = {}, size
  settings.update(extra)
  if point.variant == 'streaming_sinks':
    settings['window'] = max(1, point.chunk + size - settings['num_sinks'])
  overrides = dict(attention=point.variant, mem_len=mem_len)
  for name, cls in section_classes().items():
    if name in ATTENTION_VARIANTS and name != point.variant:
      if _plain(trained_model[name]) != cls().to_dict():
        overrides[name] = cls().to_dict()
  if settings:
    overrides[point.variant] = _section_override(point, trained_model, settings)
  schedule = {}
  for key, value in _plain(trained_model.layer_schedule).items():
    if key in section_classes():
      if key in ATTENTION_VARIANTS and key != point.variant:
        continue
      kept = {k: v for k, v in _plain(value).items()
              if not (key == point.variant and k in settings)}
      if kept:
        schedule[key] = kept
    elif key not in overrides:
      schedule[key] = value
  overrides['layer_schedule'] = schedule
  return overrides


def cache_key(point: SweepPoint) -> tuple:
  """Points with equal keys evaluate the same model: an empty memory has no policy."""
  policy = 'fifo' if point.memory_size == 0 and point.variant == 'attendre' else point.policy
  return (point.variant, policy, point.memory_size, point.q_memory_size, point.chunk, point.extra)


def run_sweep(points: list[SweepPoint], evaluate_point) -> list[dict]:
  """Rows of `point.describe()` plus `evaluate_point(point)`'s metrics, each model once."""
  done, rows = {}, []
  for point in points:
    key = cache_key(point)
    if key not in done:
      done[key] = evaluate_point(point)
    rows.append(dict(point.describe(), **done[key]))
  return rows


# Metric columns of a row: (key, Markdown header, format); the far ones only
# with `eval.far_distance` > 0.
METRIC_COLUMNS = (('bits_per_byte', 'bits/byte', '{:.4f}'),
                  ('bits_per_token', 'bits/token', '{:.4f}'),
                  ('loss', 'loss (nats)', '{:.4f}'), ('tokens', 'tokens', '{:.0f}'),
                  ('far_bits_per_byte', 'far bits/byte', '{:.4f}'),
                  ('far_tokens', 'far tokens', '{:.0f}'))
METRICS = {'bits_per_byte', 'bits_per_token', 'loss', 'perplexity', 'tokens', 'bytes',
           'far_bits_per_byte', 'far_bits_per_token', 'far_tokens', 'far_bytes'}


def line_label(row: dict) -> str:
  """The plot line of a row: everything but the memory size and the metrics."""
  fixed = ('variant', 'policy')
  label = [row['variant'], row['policy']]
  label += [f'{k}={v}' for k, v in row.items()
            if k not in METRICS and k not in fixed and k not in ('memory_size', 'far_distance')
            and not (k == 'q_memory_size' and v == 0)]
  return ' '.join(str(part) for part in label)


def markdown_table(rows: list[dict]) -> str:
  """Rows as a Markdown table: one column per setting, then the metrics."""
  settings = [k for k in rows[0] if k not in METRICS]
  metrics = [(key, name, form) for key, name, form in METRIC_COLUMNS if key in rows[0]]
  header = settings + [name for _, name, _ in metrics]
  lines = ['| ' + ' | '.join(header) + ' |',
           '|' + '---|' * len(settings) + '---:|' * len(metrics)]
  for r in rows:
    cells = [str(r[k]) for k in settings] + [form.format(r[key]) for key, _, form in metrics]
    lines.append('| ' + ' | '.join(cells) + ' |')
  return '\n'.join(lines)


def plot_sweep(rows: list[dict], path: str, title: str, metric: str = 'bits_per_byte') -> None:
  """`metric` (bits per byte) against memory size, one line per `line_label`."""
  lines = {}
  for r in rows:
    lines.setdefault(line_label(r), []).append((r['memory_size'], r[metric]))
  series = [([x for x, _ in sorted(points)], [y for _, y in sorted(points)], label)
            for label, points in lines.items()]
  sizes = sorted({r['memory_size'] for r in rows})
  save_line_plot(series, path, xlabel='memory size (entries)',
                 ylabel=metric.replace('_', ' ').replace('far ', 'far recurrences: '),
                 title=title, log2_x=len(sizes) > 1 and sizes[0] > 0, size=(6, 4))


def write_sweep(rows: list[dict], out_dir: str, title: str, header: dict) -> dict:
  """Writes memory_sweep.json (rows), memory_sweep.md and memory_sweep.png (and, with
  far metrics, memory_sweep_far.png); returns the paths."""
  os.makedirs(out_dir, exist_ok=True)
  paths = {name: os.path.join(out_dir, f'memory_sweep.{name}') for name in ('json', 'md', 'png')}
  with open(paths['json'], 'w') as f:
    json.dump(rows, f, indent=2)
  described = ', '.join(f'{k} {v}' for k, v in header.items())
  with open(paths['md'], 'w') as f:
    f.write(f'# Memory sweep: {title}\n\n{described}\n\n{markdown_table(rows)}\n')
  plot_sweep(rows, paths['png'], title)
  if 'far_bits_per_byte' in rows[0]:
    paths['far_png'] = os.path.join(out_dir, 'memory_sweep_far.png')
    plot_sweep(rows, paths['far_png'], f"{title}, far > {rows[0]['far_distance']}",
               metric='far_bits_per_byte')
  return paths
