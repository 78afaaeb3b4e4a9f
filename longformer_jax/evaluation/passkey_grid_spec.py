"""The passkey grid's specification (`eval.passkey_grid`): its settings parsed and checked.

`parse_grid(spec, default_chunk)` turns the flag's 'key=value;...' string into a
`PasskeyGrid` of lengths, depths, documents and `GridMemory`s, each a memory-sweep point
(evaluation/memory_sweep.py) or the run's own memory. The settings are described in
evaluation/passkey_grid.py, which scores the grid.
"""

import dataclasses

from longformer_jax.config.errors import ConfigError, require
from longformer_jax.config.section import closest_name
from longformer_jax.data import attendre_qa
from longformer_jax.evaluation import memory_sweep, trained_memory
from longformer_jax.memory import policies

GRID_KEY = 'eval.passkey_grid'
GRID_SETTINGS = ('lengths', 'max_length', 'depths', 'documents', 'seed', 'memories',
                 'memory_size', 'chunk', 'kind', 'q_memory', 'q_causal')
HALF = 'half'                    # q_memory=half: each Attendre memory's Q memory is SIZE // 2
DOCUMENT_KINDS = ('passkey', 'attendre_qa')
FIRST_LENGTH = 256
# Memory name -> (sweep variant, policy); 'attendre_<policy>' names are added below.
MEMORY_KINDS = {'none': ('vanilla', 'fifo'), 'xl': ('vanilla', 'fifo'),
                'sinks': ('streaming_sinks', 'sink'), 'knn': ('memorizing', 'fifo')}
MEMORY_KINDS.update({f'attendre_{p}': ('attendre', p) for p in policies.POLICY_CHOICES})
TRAINED = 'trained'              # the run's own memory (evaluation/trained_memory.py)


@dataclasses.dataclass(frozen=True)
class GridMemory:
  """One memory of the grid: its label and the memory-sweep point that builds it, or (`point`
  None) the run's own memory, resized to `trained_size` unless 0."""
  label: str                     # 'none', 'xl:256', 'attendre_lra_max:256+q128', 'trained:4096'
  point: memory_sweep.SweepPoint | None
  trained_size: int = 0
  q_causal: bool = False         # a Q memory under the trained causal mask (the control)

  def describe(self, trained_model=None) -> dict:
    if self.point is None:
      described = dict(memory=self.label, variant=TRAINED)
      if trained_model is not None:
        described.update(size_key=trained_memory.size_key(trained_model),
                         memory_size=self.trained_size or trained_memory.trained_size(
                             trained_model))
        q_memory = trained_memory.trained_q_memory(trained_model)
        if q_memory:       # trained with a Q memory: its size, and whether it kept the mask
          described.update(q_memory_size=q_memory, q_causal=bool(trained_model.causal))
      return described
    described = dict(memory=self.label, **self.point.describe())
    if self.q_causal:
      described['q_causal'] = True
    return described


@dataclasses.dataclass(frozen=True)
class PasskeyGrid:
  lengths: tuple
  depths: tuple                  # percent
  documents: int
  seed: int
  chunk: int
  memories: tuple                # GridMemory
  kind: str = 'passkey'          # the documents: or 'attendre_qa' (data/attendre_qa.py)


def _ints(settings: dict, key: str, default: list) -> list:
  items = settings.pop(key, None)
  if items is None:
    return default
  try:
    return [int(item) for item in items]
  except ValueError:
    raise ConfigError(GRID_KEY, f'{key} must be integers, got {items}') from None


def _q_memory(settings: dict) -> int | str:
  """`q_memory`: 'half' or an integer >= 0 (default 0)."""
  value = settings.pop('q_memory', ['0'])[0]
  require(value == HALF or value.isdigit(), GRID_KEY,
          f"q_memory must be '{HALF}' or an integer >= 0, got {value!r}")
  return value if value == HALF else int(value)


def _q_causal(settings: dict) -> bool:
  """`q_causal`: 1 / true keeps the trained causal mask for a Q memory (default 0)."""
  value = settings.pop('q_causal', ['0'])[0].lower()
  require(value in ('0', '1', 'true', 'false'), GRID_KEY,
          f'q_causal must be 0 or 1, got {value!r}')
  return value in ('1', 'true')


def _memory(item: str, size: int, chunk: int, extras: dict,
            q_memory: int | str = 0, q_causal: bool = False) -> GridMemory:
  name, _, given = item.partition(':')
  if name == TRAINED:
    require(not given or given.isdigit() and int(given) > 0, GRID_KEY,
            f'memory {item!r}: the size after ":" must be an integer > 0')
    return GridMemory(item, None, int(given or 0))
  names = tuple(MEMORY_KINDS) + (TRAINED,)
  require(name in MEMORY_KINDS, GRID_KEY, f'unknown memory {name!r}; choose from '
          f'{", ".join(names)}{closest_name(name, names)}')
  if given:
    require(given.isdigit(), GRID_KEY, f'memory {item!r}: the size after ":" must be an integer')
    size = int(given)
  variant, policy = MEMORY_KINDS[name]
  size = 0 if name == 'none' else size
  require(name == 'none' or size > 0, GRID_KEY, f'memory {item!r} needs a size > 0')
  extra = tuple((key, value if memory_sweep.reads(variant, policy, key) else memory_sweep.NOT_READ)
                for key, value in sorted(extras.items()))
  queries = 0 if variant != 'attendre' else size // 2 if q_memory == HALF else q_memory
  causal = bool(queries) and q_causal
  label = name if name == 'none' else f'{name}:{size}' + (f'+q{queries}' if queries else '')
  return GridMemory(label + ('causal' if causal else ''),
                    memory_sweep.SweepPoint(variant, policy, size, queries, chunk, extra),
                    q_causal=causal)


def parse_grid(spec: str, default_chunk: int) -> PasskeyGrid:
  """The grid of `spec` (module docstring); ConfigError naming eval.passkey_grid."""
  try:
    settings = memory_sweep.parse_settings(spec)
  except ConfigError as error:
    raise ConfigError(GRID_KEY, error.message) from None
  for key in ('documents', 'seed', 'memory_size', 'chunk', 'max_length', 'kind', 'q_memory',
              'q_causal'):
    require(len(settings.get(key, [''])) == 1, GRID_KEY, f'{key} takes one value')
  require(not ('lengths' in settings and 'max_length' in settings), GRID_KEY,
          'give lengths or max_length, not both')
  max_length = _ints(settings, 'max_length', [4096])[0]
  doubling = [FIRST_LENGTH << k for k in range(32) if FIRST_LENGTH << k <= max_length]
  lengths = _ints(settings, 'lengths', doubling or [max_length])
  depths = _ints(settings, 'depths', [0, 25, 50, 75, 100])
  documents = _ints(settings, 'documents', [4])[0]
  seed = _ints(settings, 'seed', [0])[0]
  size = _ints(settings, 'memory_size', [256])[0]
  chunk = _ints(settings, 'chunk', [default_chunk])[0]
  names = settings.pop('memories', ['none'])
  kind = settings.pop('kind', ['passkey'])[0]
  q_memory = _q_memory(settings)
  q_causal = _q_causal(settings)
  require(kind in DOCUMENT_KINDS, GRID_KEY, f'kind {kind!r}: choose from '
          f'{", ".join(DOCUMENT_KINDS)}{closest_name(kind, DOCUMENT_KINDS)}')
  if kind == 'attendre_qa':
    require(min(lengths) >= attendre_qa.MIN_CONTEXT, GRID_KEY, f'kind attendre_qa: lengths are '
            f'context bytes, at least {attendre_qa.MIN_CONTEXT}, got {min(lengths)}')
  require(all(n > 0 for n in lengths), GRID_KEY, f'lengths must be > 0, got {lengths}')
  require(all(0 <= d <= 100 for d in depths), GRID_KEY,
          f'depths are percent, in [0, 100], got {depths}')
  require(documents > 0 and chunk > 0 and seed >= 0 and size >= 0, GRID_KEY,
          'documents and chunk must be > 0, seed and memory_size >= 0')
  extras = {key: memory_sweep.parse_value(values[0]) for key, values in settings.items()}
  for key, values in settings.items():
    require(len(values) == 1, GRID_KEY, f'{key} takes one value (one grid per memory setting)')
  memories = [_memory(item, size, chunk, extras, q_memory, q_causal) for item in names]
  kinds = {(m.point.variant, m.point.policy) for m in memories if m.point is not None}
  for key in extras:
    valid = sorted({k for variant, _ in kinds for k in memory_sweep.section_keys(variant)})
    require(any(memory_sweep.reads(v, p, key) for v, p in kinds), GRID_KEY,
            f'no memory of the grid reads {key!r} (grid settings: {", ".join(GRID_SETTINGS)}; '
            f'memory settings: {", ".join(valid) or "none"})'
            f'{closest_name(key, GRID_SETTINGS + tuple(valid))}')
  labels = [m.label for m in memories]
  require(len(set(labels)) == len(labels), GRID_KEY, f'a memory is given twice: {labels}')
  return PasskeyGrid(tuple(sorted(set(lengths))), tuple(sorted(set(depths))), documents, seed,
                     chunk, tuple(memories), kind)
