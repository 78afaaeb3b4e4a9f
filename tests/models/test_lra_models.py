"""The LRA's model pieces against references written here: mean pooling, the two-tower pair
classifier (models/dual_encoder.py), and the example arrays with and without [CLS]."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from longformer_jax.data.classification_tasks import example_arrays
from longformer_jax.data.retrieval_tasks import pair_arrays
from longformer_jax.models.dual_encoder import PairClassifier
from longformer_jax.models.encoder import Encoder, embed_tokens, encoder_context, pool_states
from longformer_jax.models.resolved_model import encoder_model_config
from longformer_jax.tasks.retrieval import pair_context
from tests.support.tiny_models import tiny_config


def test_mean_pooling_averages_the_valid_states_only():
  h = np.random.default_rng(0).normal(size=(3, 5, 4)).astype(np.float32)
  valid = np.array([[1, 1, 0, 0, 0], [1, 1, 1, 1, 1], [0, 0, 0, 0, 0]], bool)
  pooled = np.asarray(pool_states('mean', jnp.asarray(h), jnp.asarray(valid)))
  np.testing.assert_allclose(pooled[0], h[0, :2].mean(0), rtol=1e-6)
  np.testing.assert_allclose(pooled[1], h[1].mean(0), rtol=1e-6)
  np.testing.assert_array_equal(pooled[2], 0.0)
  np.testing.assert_array_equal(pool_states('cls', jnp.asarray(h), jnp.asarray(valid)), h[:, 0])


def test_example_arrays_with_and_without_cls():
  tokens = [np.array([5, 6, 7]), np.array([8])]
  with_cls = example_arrays(tokens, 4, cls_id=1, pad_id=0)
  np.testing.assert_array_equal(with_cls['inputs'], [[1, 5, 6, 7], [1, 8, 0, 0]])
  np.testing.assert_array_equal(with_cls['global_flags'][:, 0], True)
  assert with_cls['global_flags'][:, 1:].sum() == 0
  bare = example_arrays(tokens, 4, cls_id=1, pad_id=0, cls_token=False)
  np.testing.assert_array_equal(bare['inputs'], [[5, 6, 7, 0], [8, 0, 0, 0]])
  np.testing.assert_array_equal(bare['input_mask'], [[1, 1, 1, 0], [1, 0, 0, 0]])
  assert bare['global_flags'].sum() == 0
  local = example_arrays(tokens, 4, cls_id=1, pad_id=0, cls_global=False)
  assert local['global_flags'].sum() == 0 and local['inputs'][0, 0] == 1


def dense(params, x):
  return x @ np.asarray(params['kernel']) + np.asarray(params['bias'])


def test_pair_classifier_is_one_encoder_applied_to_each_document():
  config = tiny_config(attention='vanilla', causal=False)
  model_config = encoder_model_config(dict(config.model.to_dict(), num_classes=2, pooling='mean'),
                                      64)
  model = PairClassifier(model_config)
  rng = np.random.default_rng(1)
  first = [rng.integers(3, 60, n) for n in (7, 5)]
  second = [rng.integers(3, 60, n) for n in (3, 8)]
  arrays = pair_arrays(first, second, [1, 0], 9, cls_id=1, pad_id=0)
  assert arrays['inputs'].shape == (2, 2, 9)
  ctx = pair_context(arrays['input_mask'], arrays['global_flags'], True)
  params = nn.unbox(model.init(jax.random.PRNGKey(0), arrays['inputs'], ctx)['params'])
  logits, _ = model.apply({'params': params}, arrays['inputs'], ctx)
  # The reference: each document encoded alone by the same parameters, pooled, then the
  # interaction [x1, x2, x1 * x2, x1 - x2], a GELU layer and the classifier, in numpy.

  class Tower(PairClassifier):
    @nn.compact
    def __call__(self, tokens, ctx):
      x, _ = embed_tokens(self.config, tokens, ctx, jnp.float32)
      return Encoder(self.config, jnp.float32, name='encoder')(x, ctx)[0]

  tower = Tower(model_config)
  for row in range(2):
    vectors = []
    for document in range(2):
      tokens = arrays['inputs'][row, document][None]
      mask = arrays['input_mask'][row, document][None]
      h = tower.apply({'params': params}, tokens,
                      encoder_context(mask, arrays['global_flags'][row, document][None], True))
      mean = np.asarray(h)[0][mask[0]].mean(0)
      vectors.append(np.tanh(dense(params['pooler'], mean)))
    x1, x2 = vectors
    hidden = np.asarray(jax.nn.gelu(dense(params['interaction'],
                                          np.concatenate([x1, x2, x1 * x2, x1 - x2]))))
    np.testing.assert_allclose(logits[row], dense(params['classifier'], hidden), rtol=1e-4,
                               atol=1e-5)
  # One encoder's parameters, not two.
  assert set(params) == {'embedding', 'encoder', 'pooler', 'interaction', 'classifier'}
