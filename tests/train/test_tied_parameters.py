"""train/tied_parameters.py: copies of one table in every layer stay equal under AdamW.

Reference: a single shared table's gradient is the sum of what each layer's copy gets
(the chain rule over the layers that read it), computed here by hand on a toy model.
"""

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax

from longformer_jax.train.optimizer import make_optimizer
from longformer_jax.train.optimizer_config import OptimizerConfig
from longformer_jax.train.tied_parameters import tied_groups


def params():
  table = jnp.arange(6.0).reshape(3, 2)
  layer = lambda: {'bias': {'relative_attention_bias': {'embedding': table}},
                   'kernel': jnp.ones((2, 2))}
  return {'encoder': {'blocks': {f'layer_{i}': layer() for i in range(3)}},
          'decoder_0': layer(), 'decoder_1': layer()}


def loss(tree, x):
  """Each layer reads its own copy, weighing it differently: the copies' gradients differ
  in sign and not in proportion (Adam would move proportional gradients alike)."""
  total = 0.0
  for i in range(3):
    layer = tree['encoder']['blocks'][f'layer_{i}']
    table = layer['bias']['relative_attention_bias']['embedding']
    total += (i - 1) * jnp.sum(table * x) + jnp.sum(table ** 2)
    total += jnp.sum(layer['kernel'] ** 2)
  for i in range(2):
    layer = tree[f'decoder_{i}']
    table = layer['bias']['relative_attention_bias']['embedding']
    total += (2 * i - 1) * jnp.sum(table * x) + jnp.sum(table ** 2)
  return total


def optimizer(tied: str):
  config = ml_collections.ConfigDict(dict(OptimizerConfig().to_dict(), tied_parameters=tied,
                                          warmup_steps=0))
  return make_optimizer(config, num_steps=10)


def copies(tree):
  enc = [tree['encoder']['blocks'][f'layer_{i}']['bias']['relative_attention_bias']['embedding']
         for i in range(3)]
  dec = [tree[f'decoder_{i}']['bias']['relative_attention_bias']['embedding'] for i in range(2)]
  return enc, dec


def test_groups_are_one_per_side_and_leave_the_rest_alone():
  leaves = jax.tree_util.tree_leaves(params())
  groups = tied_groups(params(), 'relative_attention_bias')
  assert sorted(len(g) for g in groups) == [2, 3]
  assert all(leaves[i].shape == (3, 2) for g in groups for i in g)


def test_tied_copies_stay_equal_and_move_as_one_shared_table():
  x = jnp.array([[1.0, -2.0], [0.5, 3.0], [-1.0, 1.0]])
  tree, opt = params(), optimizer('relative_attention_bias')
  state = opt.init(tree)
  for _ in range(4):
    grads = jax.grad(loss)(tree, x)
    updates, state = opt.update(grads, state, tree)
    tree = optax.apply_updates(tree, updates)
  enc, dec = copies(tree)
  for group in (enc, dec):
    for other in group[1:]:
      np.testing.assert_array_equal(other, group[0])
  assert not np.allclose(enc[0], params()['encoder']['blocks']['layer_0']['bias'][
      'relative_attention_bias']['embedding'])                       # it did train

  # The reference: one shared table per side, read by every layer (its gradient is the
  # sum of the copies'), under the same AdamW without the tie.
  def shared_loss(shared, x):
    tree = params()
    for i in range(3):
      tree['encoder']['blocks'][f'layer_{i}']['bias']['relative_attention_bias'][
          'embedding'] = shared['enc']
      tree['encoder']['blocks'][f'layer_{i}']['kernel'] = shared[f'kernel_{i}']
    for i in range(2):
      tree[f'decoder_{i}']['bias']['relative_attention_bias']['embedding'] = shared['dec']
    return loss(tree, x)

  table = jnp.arange(6.0).reshape(3, 2)
  shared = {'enc': table, 'dec': table, **{f'kernel_{i}': jnp.ones((2, 2)) for i in range(3)}}
  # Clipping sees each tied gradient once per copy; with the tie the global norm counts the
  # shared gradient 3 (2) times. Large norms clip differently, so compare unclipped.
  reference = make_optimizer(ml_collections.ConfigDict(dict(
      OptimizerConfig().to_dict(), warmup_steps=0, grad_clip_norm=1e9)), num_steps=10)
  tied = make_optimizer(ml_collections.ConfigDict(dict(
      OptimizerConfig().to_dict(), warmup_steps=0, grad_clip_norm=1e9,
      tied_parameters='relative_attention_bias')), num_steps=10)
  ref_state, tree, tied_state = reference.init(shared), params(), tied.init(params())
  for _ in range(4):
    updates, ref_state = reference.update(jax.grad(shared_loss)(shared, x), ref_state, shared)
    shared = optax.apply_updates(shared, updates)
    updates, tied_state = tied.update(jax.grad(loss)(tree, x), tied_state, tree)
    tree = optax.apply_updates(tree, updates)
  enc, dec = copies(tree)
  np.testing.assert_allclose(enc[2], shared['enc'], rtol=1e-6)
  np.testing.assert_allclose(dec[1], shared['dec'], rtol=1e-6)


def test_without_the_tie_the_copies_drift_apart():
  x = jnp.array([[1.0, -2.0], [0.5, 3.0], [-1.0, 1.0]])
  tree, opt = params(), optimizer('')
  state = opt.init(tree)
  grads = jax.grad(loss)(tree, x)
  updates, state = opt.update(grads, state, tree)
  enc, dec = copies(optax.apply_updates(tree, updates))
  assert not np.allclose(enc[0], enc[2]) and not np.allclose(dec[0], dec[1])
