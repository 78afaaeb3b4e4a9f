"""The analytic FLOP count agrees with XLA's own count of the compiled forward pass."""

import jax
import pytest

from longformer_jax.models.decoder_lm import DecoderLM
from longformer_jax.models.flop_count import forward_flops_per_token
from longformer_jax.train.initialization import init_params
from longformer_jax.train.lm_objective import chunk_context
from tests.support.tiny_models import stream_batch, tiny_model_config


@pytest.mark.parametrize('attention', ['vanilla', 'xl'])
def test_forward_flops_match_xla_cost_analysis(attention):
  config = tiny_model_config(attention=attention, d_model=64, num_heads=4, head_dim=16,
                             d_ff=256, mem_len=32)
  model = DecoderLM(config)
  batch, chunk = 2, 32
  params = init_params(model, jax.random.PRNGKey(0), batch, chunk)
  data = stream_batch(batch, chunk)
  memory = DecoderLM.init_state(config, batch)

  def forward(p):
    return model.apply({'params': p}, data['inputs'], memory, chunk_context(data, True))[0]

  cost = jax.jit(forward).lower(params).compile().cost_analysis()
  cost = cost[0] if isinstance(cost, list) else cost
  xla_flops = cost['flops']
  ours = forward_flops_per_token(config, chunk, batch) * batch * chunk
  # XLA also counts elementwise work (softmax, norms, GELU); matmuls dominate.
  assert 0.8 < ours / xla_flops <= 1.0, (ours, xla_flops)
