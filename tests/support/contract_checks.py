"""The call contract's harness and checks (docs/design.md, contract 1): one jitted two-chunk
runner per module, built from a tiny config, and the checks run on it.

Shared by tests/attention/test_contract_attention.py (every attention variant),
tests/models/test_contract_stacks.py (every block and stack) and the adversarial tests."""

import functools

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from longformer_jax.attention.context import AttentionContext
from longformer_jax.attention.registry import ATTENTION_VARIANTS, attention_layer, section_of
from longformer_jax.attention.shared_settings import SharedSettings
from tests.support.fast_compile import FAST_COMPILE
from tests.support.tiny_models import tiny_model_config

B, C, K = 2, 8, 2           # batch rows, chunk length, chunks per scan
D = 32                      # tiny_model_config's d_model

# Per-variant settings (its config section) that make a tiny instance valid and
# let the 16 tokens of two chunks reach its memory. Nothing else is per variant.
TINY = {
    'adaptive_span': {'ramp': 4.0, 'block': 8, 'init': 0.5},
    'attendre': {'memory_size': 12, 'policy': 'lra_max', 'top_k': 4},
    'bigbird': {'block': 2, 'random_blocks': 1, 'max_global_tokens': 2},
    'compressive': {'compressed_mem_len': 8, 'rate': 2},
    'expire_span': {'ramp': 4, 'max_span': 16},
    'longformer': {'window': 3, 'global_tokens': 2},
    'lsh': {'chunk_len': 4, 'num_buckets': 4},
    'memorizing': {'memory_size': 16, 'top_k': 4},
    'performer': {'block_len': 4, 'num_features': 16},
    'routing': {'num_clusters': 2, 'window': 3, 'local_window': 3, 'local_heads': 1},
    'sparse_transformer': {'stride': 4},
    'streaming_sinks': {'num_sinks': 2, 'window': 5},
}


VARIANTS = [pytest.param(name, id=f'attention:{name}') for name in sorted(ATTENTION_VARIANTS)]


def context(positions, segment_ids=None, reset=None, valid=None, seed=0) -> AttentionContext:
  """A stacked `[K, B, ...]` context; global flags on about a quarter of the tokens."""
  positions = np.asarray(positions, np.int32)
  flags = np.random.default_rng(seed).random(positions.shape) < 0.25
  return AttentionContext(
      positions=jnp.asarray(positions),
      segment_ids=jnp.asarray(np.zeros_like(positions) if segment_ids is None else segment_ids,
                              jnp.int32),
      reset=jnp.asarray(np.zeros(positions.shape[:2], bool) if reset is None else reset),
      valid=jnp.asarray(np.ones(positions.shape, bool) if valid is None else valid),
      global_flags=jnp.asarray(flags), deterministic=True)


def stream_positions(first_chunk: int) -> np.ndarray:
  """`[K, B, C]` positions of K consecutive chunks starting at chunk `first_chunk`."""
  start = first_chunk * C + np.arange(K)[:, None, None] * C
  return np.broadcast_to(start + np.arange(C)[None, None, :], (K, B, C)).copy()


def random_inputs(seed: int, dtype=jnp.float32) -> jax.Array:
  return jax.random.normal(jax.random.PRNGKey(seed), (K, B, C, D)).astype(dtype)


def aux_losses(aux) -> jax.Array:
  """The sum of every aux value whose name ends in `_loss` (a dict, or a tuple of dicts)."""
  total = jnp.zeros((), jnp.float32)
  for per_layer in (aux if isinstance(aux, (tuple, list)) else (aux,)):
    for key, value in per_layer.items():
      if key.endswith('_loss'):
        total = total + jnp.sum(value)
  return total


def scan_runner(apply, with_grads: bool):
  """jit of `(params, state, xs [K, B, C, D], ctx [K, ...])` over the K chunks.

  `apply(params, x, state, ctx) -> (y, state, aux)` for one chunk. Returns
  `(ys, state, auxes)` (auxes stacked over chunks), and with `with_grads`
  `((ys, state, auxes), (grad_params, grad_xs))` of a fixed projection of the
  outputs plus the aux losses.
  """
  weights = jax.random.normal(jax.random.PRNGKey(99), (K, B, C, D))

  def run(params, state, xs, ctxs):
    def body(carry, chunk):
      x, ctx = chunk
      y, carry, aux = apply(params, x, carry, ctx)
      return carry, (y, aux)
    state, (ys, auxes) = jax.lax.scan(body, state, (xs, ctxs))
    return ys, state, auxes

  if not with_grads:
    return jax.jit(run, compiler_options=FAST_COMPILE)

  def loss(params, xs, state, ctxs):
    ys, state, auxes = run(params, state, xs, ctxs)
    value = jnp.sum(ys.astype(jnp.float32) * weights) + aux_losses(auxes)
    return value, (ys, state, auxes)

  grad_fn = jax.value_and_grad(loss, argnums=(0, 1), has_aux=True)

  def run_with_grads(params, state, xs, ctxs):
    (_, outputs), grads = grad_fn(params, xs, state, ctxs)
    return outputs, grads
  return jax.jit(run_with_grads, compiler_options=FAST_COMPILE)


def shapes_and_dtypes(tree):
  return jax.tree_util.tree_structure(tree), [(np.shape(a), jnp.result_type(a))
                                              for a in jax.tree_util.tree_leaves(tree)]


def assert_like(tree, reference, what: str):
  got, want = shapes_and_dtypes(tree), shapes_and_dtypes(reference)
  assert got[0] == want[0], f'{what}: structure {got[0]} != {want[0]}'
  assert got[1] == want[1], f'{what}: shapes/dtypes {got[1]} != {want[1]}'


def row(tree, index: int):
  """Row `index` of every `[K, B, ...]` leaf (outputs) -> numpy."""
  return jax.tree_util.tree_map(lambda a: np.asarray(a[:, index], np.float32), tree)


def mix_rows(state_0, state_1):
  """A state whose row 0 is `state_0`'s and whose other rows are `state_1`'s (leaves `[B, ...]`)."""
  def mix(a, b):
    if np.ndim(a) == 0:
      return a
    rows = a.shape[0]
    pick = (np.arange(rows) < rows // B).reshape((rows,) + (1,) * (np.ndim(a) - 1))
    return jnp.where(pick, a, b)
  return jax.tree_util.tree_map(mix, state_0, state_1)


def assert_finite(tree, what: str):
  for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]:
    assert np.isfinite(np.asarray(leaf, np.float32)).all(), \
        f'{what}: non-finite at {jax.tree_util.keystr(path)}'


def check_aux(auxes, what: str):
  """Stacked `[K]` aux leaves: float32 scalars per chunk, string keys."""
  for per_layer in (auxes if isinstance(auxes, (tuple, list)) else (auxes,)):
    assert isinstance(per_layer, dict), f'{what}: aux is {type(per_layer)}, not a dict'
    for key, value in per_layer.items():
      assert isinstance(key, str)
      assert value.shape == (K,) and value.dtype == jnp.float32, \
          f'{what}: aux {key!r} is {value.dtype}{value.shape[1:]} per chunk, not a float32 scalar'


def tiny_attention_config(name: str):
  return tiny_model_config(attention=name, **({name: TINY[name]} if name in TINY else {}))


def build_harness(make_module, init_state, adapt=lambda out: out) -> dict:
  """Parameters, jitted runners and the memories of two warm-up streams of a module.

  `make_module(dtype)` builds the module, `init_state(dtype)` its empty state;
  `adapt` turns the module's output into `(y, state, aux)`.
  """
  modules = {dtype: make_module(dtype) for dtype in (jnp.float32, jnp.bfloat16)}
  warm_ctx = context(stream_positions(0), seed=1)
  variables = nn.meta.unbox(jax.jit(modules[jnp.float32].init, compiler_options=FAST_COMPILE)(
      jax.random.PRNGKey(0), random_inputs(0)[0], init_state(jnp.float32),
      jax.tree_util.tree_map(lambda a: a[0], warm_ctx)))
  params = variables.pop('params')
  # Other collections (non-gradient model state, e.g. Routing's centroids) are read as initialised.
  apply = lambda dtype: (lambda p, x, s, ctx: adapt(
      modules[dtype].apply({'params': p, **variables}, x, s, ctx)))
  run = scan_runner(apply(jnp.float32), with_grads=True)
  h = dict(params=params, run=run, init=init_state,
           run_bf16=scan_runner(apply(jnp.bfloat16), with_grads=False))
  # Memory of a warm stream, and of another stream (other tokens, some padding).
  padded = np.ones((K, B, C), bool)
  padded[:, :, 2::3] = False
  h['warm'] = run(params, init_state(jnp.float32), random_inputs(1), warm_ctx)[0][1]
  h['other'] = run(params, init_state(jnp.float32), random_inputs(2),
                   context(stream_positions(0), valid=padded, seed=2))[0][1]
  return h


@functools.lru_cache(maxsize=None)
def harness(name: str) -> dict:
  config = tiny_attention_config(name)
  cls = ATTENTION_VARIANTS[name]
  section, shared = section_of(cls, config), SharedSettings.of(config)
  return build_harness(lambda dtype: attention_layer(config, dtype, name='attention'),
                       lambda dtype: cls.init_state(section, shared, B, dtype))


def reset_context(valid=None, new_segment: bool = False) -> AttentionContext:
  """Chunks 2-3 of the stream; row 0 starts a new document at the first.

  The document keeps segment id 0 unless `new_segment`, so that only the
  reset flag separates it from its memory. (A stack that delays its output
  passes the document start on to its next layer mid-chunk, where only a new
  segment id can mark it, as the data always does: it needs `new_segment`.)
  """
  reset = np.zeros((K, B), bool)
  reset[0, 0] = True
  segments = np.zeros((K, B, C), np.int32)
  segments[:, 0] = int(new_segment)
  return context(stream_positions(2), segments, reset=reset, valid=valid, seed=3)


def check_state_shapes(h, what: str):
  """States after 2 and 4 chunks are shaped like `init_state`; outputs like the input."""
  initial = h['init'](jnp.float32)
  for label in ('warm', 'other'):
    assert_like(h[label], initial, f'{what}: state after 2 chunks ({label})')
  (ys, state, auxes), _ = h['run'](h['params'], h['warm'], random_inputs(3), reset_context())
  assert_like(state, initial, f'{what}: state after 4 chunks')
  assert ys.shape == (K, B, C, D) and ys.dtype == jnp.float32
  check_aux(auxes, what)


def check_reset_and_rows(h, what: str, delay: int = 0):
  """Row 0 (reset) ignores what its memory held; row 1 does not influence row 0.

  With a `delay` (outputs belong to the positions `delay` before the input's),
  only the outputs of the new document's positions are compared.
  """
  xs, ctx = random_inputs(3), reset_context(new_segment=delay > 0)
  run = lambda state, xs=xs: h['run'](h['params'], state, xs, ctx)[0][0]
  new_document = lambda ys: row(ys, 0).reshape(K * C, D)[delay:]
  base = run(h['warm'])
  for label, state in (('another stream', h['other']), ('empty', h['init'](jnp.float32))):
    np.testing.assert_allclose(new_document(base), new_document(run(state)), rtol=1e-5,
                               atol=1e-6, err_msg=f'{what}: reset row 0 depends on its memory '
                               f'({label})')
  if jax.tree_util.tree_leaves(h['warm']):
    # Row 1 has no reset: its memory matters (else the check above proves nothing).
    assert not np.allclose(row(base, 1), row(run(h['other']), 1), atol=1e-4), \
        f'{what}: outputs do not depend on the memory at all'
  # Row 1 with other tokens and another memory: row 0 unchanged.
  changed = run(mix_rows(h['warm'], h['other']), xs.at[:, 1].set(random_inputs(4)[:, 1]))
  np.testing.assert_allclose(row(base, 0), row(changed, 0), rtol=1e-5, atol=1e-6,
                             err_msg=f'{what}: row 1 changes row 0')
  assert not np.allclose(row(base, 1), row(changed, 1), atol=1e-4)


def check_document_inside_chunk(h, what: str, delay: int = 0):
  """A document starting inside a chunk (new segment id, no reset) ignores what came before:
  row 0's outputs from the boundary on do not depend on its memory or earlier tokens."""
  start = 3                                    # slot of the boundary in the first chunk
  segments = np.zeros((K, B, C), np.int32)
  segments[0, 0, start:] = segments[1, 0] = 1
  ctx = context(stream_positions(2), segments, seed=4)
  xs = random_inputs(5)
  other_xs = xs.at[0, 0, :start].set(random_inputs(6)[0, 0, :start])
  new_document = lambda ys: row(ys, 0).reshape(K * C, D)[start + delay:]
  base = h['run'](h['params'], h['warm'], xs, ctx)[0][0]
  changed = h['run'](h['params'], h['other'], other_xs, ctx)[0][0]
  np.testing.assert_allclose(new_document(base), new_document(changed), rtol=1e-5, atol=1e-6,
                             err_msg=f'{what}: a document sees the one before it')


def check_gradients(h, what: str):
  """Aux values are float32 scalars; gradients wrt params and input are finite and reach x."""
  valid = np.ones((K, B, C), bool)
  valid[1, 1, 5:] = False                      # padding at the end of row 1
  (_, _, auxes), (grad_params, grad_xs) = h['run'](h['params'], h['warm'], random_inputs(3),
                                                   reset_context(valid))
  check_aux(auxes, what)
  assert_finite(auxes, f'{what}: aux')
  assert_finite(grad_params, f'{what}: gradient wrt params')
  assert_finite(grad_xs, f'{what}: gradient wrt input')
  assert np.abs(np.asarray(grad_xs[:, :, :5])).sum() > 0, f'{what}: no gradient reaches x'


def check_bfloat16(h, what: str):
  """bfloat16 input, state and compute: finite bfloat16 outputs, state dtypes kept."""
  initial = h['init'](jnp.bfloat16)
  ys, state, auxes = h['run_bf16'](h['params'], initial, random_inputs(1, jnp.bfloat16),
                                   context(stream_positions(0), seed=1))
  ys2, state2, _ = h['run_bf16'](h['params'], state, random_inputs(3, jnp.bfloat16),
                                 reset_context())
  for out in (ys, ys2):
    assert out.dtype == jnp.bfloat16, f'{what}: bfloat16 input gives {out.dtype} output'
    assert_finite(out, f'{what}: bfloat16 output')
  assert_like(state2, initial, f'{what}: bfloat16 state')
  check_aux(auxes, what)
