"""The memory contract, run over every eviction policy (docs/design.md, contract 3).

Every name of `memory/policies.POLICY_CHOICES` (the names a config may give)
is built with `policy_from_name`, alone and with the settings every policy
reads (a recent window, score admission, per-head rows). A stream of random
chunks (some entries padding, a row reset in between, random attention
weights folded into the scores by `update_scores`) is inserted into a
data-only memory by one jitted step per policy. After every step:

- `insert` returns exactly what it evicted: the valid kept entries plus the
  valid evicted ones are the valid old entries plus the valid new ones, as
  multisets of (position, document, data), and no valid entry is lost or
  duplicated;
- capacity is respected: the memory keeps its shape, exactly n entries come
  out for n put in, and the memory holds min(capacity, valid entries) valid
  ones (padding goes first, nothing valid is evicted while there is room);
- the step is pure: jitted and eager results are identical, and running it
  twice gives the same result (no hidden state).

The policies' semantics are checked against a pure-Python memory in
test_memory_policies.py; this file checks the interface every policy keeps,
so a policy is covered by adding its name to POLICY_CHOICES.
"""

import collections
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from longformer_jax.memory import data_only, entries, policies
from tests.support.fast_compile import FAST_COMPILE

ROWS, HEADS, CHUNK, STEPS = 2, 2, 4, 6

# Per-policy settings a policy needs to be itself (no sinks is FIFO).
TINY = {'sink': dict(num_sinks=2)}

# Settings every policy reads, tried on each: (settings, capacity). A capacity
# below the chunk length makes the chunk's own oldest entries go at once.
SETTINGS = [
    pytest.param({}, 6, id='plain'),
    pytest.param(dict(per_head=True, recent_window=2, admission='score',
                      init_std_multiplier=0.5), 3, id='per_head+window+score_admission'),
]

POLICIES = [pytest.param(name, id=f'policy:{name}') for name in policies.POLICY_CHOICES]


def make_policy(name: str, settings: dict) -> policies.EvictionPolicy:
  return policies.policy_from_name(name, **TINY.get(name, {}), **settings)


@functools.lru_cache(maxsize=None)
def step_fn(name: str, settings_key: tuple):
  """jit of one step: reset flagged rows, fold attention into scores, insert the chunk."""
  policy = make_policy(name, dict(settings_key))

  def step(memory, new, weights, queries, reset):
    """`queries`: the chunk's (positions, valid) per batch row, `[ROWS, CHUNK]`."""
    memory = data_only.clear_rows(memory, reset)
    memory = policies.update_scores(policy, memory, weights, *queries)
    return data_only.insert(memory, new, policy)
  return policy, jax.jit(step, compiler_options=FAST_COMPILE), step


def random_chunk(rng, step: int, rows: int):
  """CHUNK new entries per memory row at the stream's next positions (data: a unique tag),
  and the chunk's queries `(positions, valid)` per batch row."""
  positions = np.tile(step * CHUNK + np.arange(CHUNK, dtype=np.int32), (ROWS, 1))
  valid = rng.random((ROWS, CHUNK)) > 0.25
  per_row = lambda a: np.repeat(a, rows // ROWS, axis=0)       # rows b * heads + h
  tags = (step * 1000 + np.arange(rows * CHUNK)).reshape(rows, CHUNK).astype(np.float32)
  new = entries.entries_from_chunk(
      jnp.asarray(tags[..., None]), jnp.asarray(per_row(positions)),
      jnp.asarray(per_row(positions // 9)), jnp.asarray(per_row(valid)))
  return new, (jnp.asarray(positions), jnp.asarray(valid))


def valid_multiset(tree: entries.MemoryEntries, row: int) -> collections.Counter:
  """(position, document, tag) of the valid entries of one row."""
  keep = np.asarray(tree.valid[row])
  return collections.Counter(zip(np.asarray(tree.positions[row])[keep].tolist(),
                                 np.asarray(tree.segment_ids[row])[keep].tolist(),
                                 np.asarray(tree.data[row, :, 0])[keep].tolist()))


def assert_same(a, b, what: str):
  for x, y in zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b)):
    np.testing.assert_array_equal(np.asarray(x), np.asarray(y), err_msg=what)


def test_every_policy_name_builds():
  assert set(TINY) <= set(policies.POLICY_CHOICES)
  for name in policies.POLICY_CHOICES:
    for settings in SETTINGS:
      make_policy(name, settings.values[0])


@pytest.mark.parametrize('settings,capacity', SETTINGS)
@pytest.mark.parametrize('name', POLICIES)
def test_insert_returns_exactly_what_it_evicted(name, settings, capacity):
  policy, jitted, eager = step_fn(name, tuple(sorted(settings.items())))
  rows = ROWS * (HEADS if policy.per_head else 1)
  rng = np.random.default_rng(policies.POLICY_CHOICES.index(name))
  memory = data_only.create(ROWS, capacity, (1,), score_heads=HEADS if policy.per_head else None)
  for step in range(STEPS):
    new, queries = random_chunk(rng, step, rows)
    weights = jnp.asarray(rng.random((ROWS, HEADS, CHUNK, capacity)) * (rng.random(
        (ROWS, HEADS, CHUNK, capacity)) > 0.5), jnp.float32)
    reset = np.zeros(rows, bool)
    if step == 3:
      reset[:rows // ROWS] = True               # batch row 0 starts a new document
    reset = jnp.asarray(reset)
    kept, evicted = jitted(memory, new, weights, queries, reset)
    what = f'policy:{name} {settings} step {step}'
    # Pure: the same again, and the same without jit.
    result = (kept, evicted)
    assert_same(result, jitted(memory, new, weights, queries, reset), f'{what}: not repeatable')
    if step == 3 and not settings:
      assert_same(result, eager(memory, new, weights, queries, reset), f'{what}: jit != eager')
    # Capacity: shapes kept, n out for n in.
    assert kept.positions.shape == memory.positions.shape == (rows, capacity), what
    assert evicted.positions.shape == new.positions.shape == (rows, CHUNK), what
    assert jax.tree_util.tree_structure(kept) == jax.tree_util.tree_structure(memory), what
    for r in range(rows):
      old = valid_multiset(memory, r) if not reset[r] else collections.Counter()
      incoming = valid_multiset(new, r)
      out, stayed = valid_multiset(evicted, r), valid_multiset(kept, r)
      assert stayed + out == old + incoming, f'{what}, row {r}: kept + evicted != old + new'
      assert sum(stayed.values()) == min(capacity, sum((old + incoming).values())), \
          f'{what}, row {r}: {sum(stayed.values())} valid kept of {sum((old + incoming).values())}'
      assert max(stayed.values(), default=1) == 1, f'{what}, row {r}: an entry kept twice'
    memory = kept
