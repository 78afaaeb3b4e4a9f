"""Longformer attention inside the decoder LM: per-layer windows and the window cache."""

import jax
import numpy as np

from longformer_jax.models.decoder_lm import DecoderLM
from tests.support.tiny_models import context_of, stream_batch, tiny_model_config


def test_lm_with_per_layer_windows_streams_with_cache():
  config = tiny_model_config(attention='longformer',
                             longformer={'window': 3, 'head_dilations': '1,2', 'block_size': 4},
                             layer_schedule={'longformer': {'window': '3,5'}})
  model = DecoderLM(config)
  batch = stream_batch(2, 16, doc_len=11)
  states = DecoderLM.init_state(config, 2)
  # Layer i caches window_i * max(dilation) hidden states.
  assert [s.values.shape[1] for s in states] == [6, 10]
  first = {k: v[:, :8] for k, v in batch.items()}
  params = jax.jit(model.init)(jax.random.PRNGKey(0), first['inputs'], states, context_of(first))
  apply = jax.jit(model.apply)
  whole, _, _ = apply(params, batch['inputs'], states, context_of(batch))
  logits, states, _ = apply(params, first['inputs'], states, context_of(first))
  second = {k: v[:, 8:] for k, v in batch.items()}
  more, states, _ = apply(params, second['inputs'], states, context_of(second))
  assert np.isfinite(np.asarray(whole)).all()
  # Two chunks with the cache give the same logits as one pass over both.
  np.testing.assert_allclose(np.concatenate([logits, more], axis=1), np.asarray(whole),
                             rtol=1e-4, atol=1e-4)
