"""benchmarks/profile_breakdown.py: a real profile of a small jitted program, its ops sorted
into kinds from the program's own HLO; the kinds checked against what the program does."""

import re

import jax
import jax.numpy as jnp
import pytest

from benchmarks import profile_breakdown
from longformer_jax.train.profiling import StepProfiler


def program(x, w):
  """A projection, an attention-scoped score and softmax, a transpose copy, an all-reduce-free
  elementwise tail: one op of each kind the tool names (collectives need a mesh)."""
  with jax.named_scope('layer/attention/query'):
    q = x @ w                                                    # a projection: matmul
  with jax.named_scope('layer/attention/scores'):
    weights = jax.nn.softmax(q @ q.T, axis=-1)                   # attention
  y = (weights @ x).T                                            # matmul, then a copy
  return jnp.tanh(y).sum()


@pytest.fixture(scope='module')
def traced(tmp_path_factory):
  folder = tmp_path_factory.mktemp('breakdown')
  step = jax.jit(program)
  x, w = jnp.ones((256, 128)), jnp.ones((128, 128)) / 128
  compiled_text = step.lower(x, w).compile().as_text()
  profiler = StepProfiler(str(folder / 'trace'), (2, 3), name='train')
  for number in range(1, 4):
    profiler.before(number)
    with profiler.annotation(number):
      out = step(x, w)
    profiler.after(number, out)
  profiler.close()
  module = re.match(r'HloModule ([\w\-]+)', compiled_text).group(1)       # jit_program
  events = profile_breakdown.op_events(str(folder / 'trace'), module)
  return profile_breakdown.parse_hlo(compiled_text), events


def test_every_traced_op_is_in_the_hlo_and_sorted_by_what_it_computes(traced):
  table, events = traced
  assert events, 'no op events of the module in the trace'
  assert all(name in table for name, _, _ in events)
  kinds = {name: profile_breakdown.kind_of(*table[name]) for name, _, _ in events}
  by_scope = {}
  for name in kinds:
    by_scope.setdefault(kinds[name], []).append(table[name][1])
  assert any('attention/scores' in op for op in by_scope.get('attention', [])), by_scope
  assert not any('attention/query' in op for op in by_scope.get('attention', [])), by_scope
  assert 'matmul' in by_scope, by_scope


def test_breakdown_shares_add_up(traced):
  table, events = traced
  result = profile_breakdown.breakdown(events, table, steps=2)
  assert sum(row['share'] for row in result['kinds'].values()) == pytest.approx(1.0)
  assert result['unmatched_share'] == 0.0
  assert result['wall_ms_per_step'] > 0


def test_the_kind_rules():
  kind = profile_breakdown.kind_of
  assert kind('all-reduce-start', '', set(), 'all-reduce-start') == 'collective'
  assert kind('fusion', 'jit(f)/m/attention/attention.attention_logits/dot_general', {'dot'},
              'dot') == 'attention'
  assert kind('fusion', 'jit(f)/m/attention/out/dot_general', {'dot'}, 'dot') == 'matmul'
  assert kind('fusion', 'jit(f)/m/attention_norm/mul', {'multiply'}, 'multiply') == 'other'
  assert kind('fusion', 'jit(f)/m/mlp/x', {'transpose', 'parameter'}, 'transpose') == 'copy'
  assert kind('dot', 'jit(f)/m/mlp/dot_general', set(), 'dot') == 'matmul'


def test_a_tuple_typed_instruction_parses():
  line = '  %while.3 = (f32[2]{0}, s32[]) while(%tuple.1), condition=%c, body=%b'
  assert profile_breakdown.instruction(line) == ('while.3', 'while')
  assert profile_breakdown.instruction('  ROOT %add.1 = f32[2]{0} add(%a, %b)') == ('add.1',
                                                                                   'add')
