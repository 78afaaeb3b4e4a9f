"""bfloat16 compute keeps float32 parameters, float32 logits and a close loss."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from longformer_jax.models.decoder_lm import DecoderLM
from longformer_jax.train.initialization import init_params
from longformer_jax.train.lm_objective import lm_sums
from tests.support.tiny_models import stream_batch, tiny_model_config


def test_bfloat16_compute_is_close_to_float32():
  batch = stream_batch(2, 16, seed=2, doc_len=6)
  losses = {}
  f32 = tiny_model_config(dtype='float32')
  params = nn.meta.unbox(init_params(DecoderLM(f32), jax.random.PRNGKey(0), 2, 8))
  for dtype in ('float32', 'bfloat16'):
    config = tiny_model_config(dtype=dtype)
    model = DecoderLM(config)
    memory = DecoderLM.init_state(config, 2)
    assert jax.tree_util.tree_leaves(memory)[0].dtype == jnp.dtype(dtype)
    _, sums = jax.jit(lambda p, m, b: lm_sums(model, p, m, b, 8))(params, memory, batch)
    losses[dtype] = float(sums['loss_sum'] / sums['tokens'])
    assert np.isfinite(losses[dtype])
  assert abs(losses['bfloat16'] - losses['float32']) < 0.05 * losses['float32']
  assert all(leaf.dtype == jnp.float32 for leaf in jax.tree_util.tree_leaves(params))
