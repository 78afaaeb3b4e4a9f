"""Bidirectional Image Transformer local attention (the encoders' form) against dense masks.

The rules, from docs/variants.md (image_local), with no causal mask and documents
and padding as always (a key is seen when it is in the query's document and valid):

- 1D: query blocks of l_q consecutive positions; a query sees its block and the
  l_m positions before it and the l_m positions after it;
- 2D: the stream is the image in plain raster order; a query block of bh x bw
  pixels sees the block extended by fh rows above and below and fw columns left
  and right, clipped at the image border, within its own image.

The references never use the fast path's slot tables or query order: the 1D
mask is written from the query's block index, the 2D one from (row, column) =
divmod(raster index, width), pair by pair in Python. Outputs (float64 softmax)
and gradients are held to them with a document boundary, padding and 1D lengths
that are not multiples of the query block; the encoder (`SequenceClassifier`)
builds, runs and is bidirectional and local; the config refuses what the
layouts cannot take, naming the key. The causal forms: test_image_local.py.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from longformer_jax.attention.image_local import attention as image_local
from longformer_jax.config.errors import ConfigError
from longformer_jax.experiment_config import resolve_config
from longformer_jax.models.encoder import SequenceClassifier, encoder_context
from longformer_jax.models.model_config import resolve_model
from longformer_jax.models.resolved_model import encoder_model_config
from tests.support.dense_mask_reference import dense_jax_attention, reference_layer
from tests.support.gradient_checks import assert_gradients_match
from tests.support.image_local_reference import B, D, H, HD, chunk_facts, context_for, section
from tests.support.tiny_models import VOCAB, shared_settings


def reference_1d_mask(segments, valid, query_len, memory_len) -> np.ndarray:
  """`[batch, heads, n, n]`: key j in [block start - l_m, block end + l_m), same document, valid."""
  b, n = segments.shape
  allowed = np.zeros((b, H, n, n), bool)
  for row in range(b):
    for i in range(n):
      block_start = (i // query_len) * query_len
      for j in range(n):
        in_memory = block_start - memory_len <= j < block_start + query_len + memory_len
        allowed[row, :, i, j] = (in_memory and valid[row, j]
                                 and segments[row, j] == segments[row, i])
  return allowed


def reference_2d_mask(segments, valid, height, width, bh, bw, fh, fw) -> np.ndarray:
  """`[batch, heads, n, n]`: key pixel within the query block grown by fh rows above and below
  and fw columns left and right, same image, same document, valid."""
  b, n = segments.shape
  image = height * width
  allowed = np.zeros((b, H, n, n), bool)
  for row in range(b):
    for s in range(n):
      qr, qc = divmod(s % image, width)
      top, left = (qr // bh) * bh, (qc // bw) * bw          # the query block's corner
      for t in range(n):
        kr, kc = divmod(t % image, width)
        in_memory = (t // image == s // image and top - fh <= kr < top + bh + fh
                     and left - fw <= kc < left + bw + fw)
        allowed[row, :, s, t] = (in_memory and valid[row, t]
                                 and segments[row, t] == segments[row, s])
  return allowed


def reference_mask(cfg, segments, valid):
  if cfg.layout == '1d':
    return reference_1d_mask(segments, valid, cfg.query_len, cfg.memory_len)
  return reference_2d_mask(segments, valid, cfg.image_height, cfg.image_width,
                           cfg.block_height, cfg.block_width, cfg.flange_height, cfg.flange_width)


# (section, n): 1D at a length that is not a multiple of the query block and at one
# that is, memory not a multiple of it; 2D one image of 2 x 2 blocks with one-pixel
# flanges, and two images of 2 x 3 blocks whose flanges leave the image (fh = 2: all rows).
CASES = [
    (section(layout='1d', query_len=3, memory_len=2), 20),
    (section(layout='1d', query_len=4, memory_len=5), 32),
    (section(layout='2d', image_height=6, image_width=8, block_height=2, block_width=2,
             flange_height=1, flange_width=1), 48),
    (section(layout='2d', image_height=4, image_width=6, block_height=2, block_width=3,
             flange_height=2, flange_width=1), 48),
]


@pytest.mark.parametrize('cfg,n', CASES)
def test_layer_matches_dense_reference(cfg, n):
  module = image_local.ImageLocalAttention(
      config=cfg, shared=shared_settings(num_heads=H, head_dim=HD, d_model=D, causal=False))
  positions, segments, valid = chunk_facts(n)
  ctx = context_for(positions, segments, valid)
  x = jax.random.normal(jax.random.PRNGKey(n), (B, n, D))
  params = module.init(jax.random.PRNGKey(0), x, {}, ctx)['params']
  y, state, aux = jax.jit(module.apply)({'params': params}, x, {}, ctx)
  assert state == {} and aux == {}
  allowed = reference_mask(cfg, segments, valid)
  assert allowed.sum() < allowed.size // 2        # the pattern is local, not everything
  assert np.triu(allowed[0, 0], 1).any()          # and it looks ahead
  expected = reference_layer(params, x, positions, allowed)
  np.testing.assert_allclose(np.asarray(y), expected, rtol=2e-4, atol=2e-5)


@pytest.mark.parametrize('cfg,n', [CASES[0], CASES[3]])
def test_gradients_match_dense_reference(cfg, n):
  positions, segments, valid = chunk_facts(n)
  allowed = reference_mask(cfg, segments, valid)
  q, k, v, cotangent = (jax.random.normal(jax.random.PRNGKey(i), (B, n, H, HD)) for i in range(4))
  slots, query_len = image_local.key_slots(n, cfg, causal=False)
  order = image_local.bidirectional_query_order(n, cfg, causal=False)

  def fast_loss(q, k, v):
    out = image_local.gathered_local_attention(
        q, k, v, jnp.asarray(positions), jnp.asarray(segments), jnp.asarray(valid), slots,
        query_len, causal=False, query_order=order)
    return jnp.sum(out * cotangent)

  dense_loss = lambda q, k, v: jnp.sum(dense_jax_attention(q, k, v, allowed) * cotangent)
  assert_gradients_match(jax.jit(fast_loss), dense_loss, (q, k, v))


def test_query_order_is_the_raster_stream_walked_block_by_block():
  """2D, two 4 x 6 images: the query blocks' raster slots, block after block, each once."""
  cfg = CASES[3][0]
  order = image_local.bidirectional_query_order(48, cfg, causal=False)
  walked = [image * 24 + (block_row + r) * 6 + block_col + c
            for image in range(2) for block_row in (0, 2) for block_col in (0, 3)
            for r in range(2) for c in range(3)]
  np.testing.assert_array_equal(order, walked)
  assert image_local.bidirectional_query_order(48, cfg, causal=True) is None
  assert image_local.bidirectional_query_order(48, CASES[0][0], causal=False) is None


# The encoder: one 8 x 8 grey image per row in raster order at positions 0..63, 2 x 2
# blocks with one-pixel flanges, two layers: token 0 reaches rows and columns 0..4.
ENCODER_2D = dict(layout='2d', image_height=8, image_width=8, block_height=2, block_width=2,
                  flange_height=1, flange_width=1)


def encoder_config(seq_len: int, image_local_section: dict):
  values = dict(
      task='classification',
      model=dict(attention='image_local', image_local=image_local_section, num_layers=2,
                 d_model=32, num_heads=2, head_dim=16, d_ff=64, vocab_multiple=8, num_classes=2),
      data=dict(seq_len=seq_len, batch_size=2, eval_batch_size=2))
  return resolve_config(values)


def test_encoder_classifier_is_bidirectional_and_local():
  """SequenceClassifier (pools token 0): finite logits; a token after token 0 inside its
  memory block moves them (a causal model would not), a pixel out of reach of two layers
  (row 7, column 7) leaves them exactly as they were, and so does a padded token."""
  cfg = encoder_model_config(encoder_config(64, ENCODER_2D)['model'], VOCAB)
  assert not cfg.causal
  model = SequenceClassifier(cfg)
  tokens = jnp.asarray(np.random.default_rng(0).integers(3, 200, (2, 64)), jnp.int32)
  mask = jnp.ones((2, 64), bool).at[1, 60:].set(False)
  ctx = encoder_context(mask, jnp.zeros((2, 64), bool), deterministic=True)
  params = jax.jit(model.init)(jax.random.PRNGKey(0), tokens, ctx)['params']
  apply = jax.jit(lambda tokens: model.apply({'params': params}, tokens, ctx)[0])
  logits = np.asarray(apply(tokens))
  assert logits.shape == (2, 2) and np.isfinite(logits).all()
  changed = lambda slot: np.asarray(apply(tokens.at[:, slot].set(tokens[:, slot] + 1)))
  assert (np.abs(changed(1 * 8 + 1) - logits) > 1e-6).all()      # pixel (1, 1): ahead, seen
  np.testing.assert_array_equal(changed(7 * 8 + 7), logits)       # pixel (7, 7): out of reach
  padded = np.asarray(apply(tokens.at[1, 61].set(tokens[1, 61] + 1)))
  np.testing.assert_array_equal(padded, logits)


def test_encoder_config_refuses_what_the_layouts_cannot_take():
  """Pathfinder's shape: a 32 x 32 image is 1,024 positions; a [CLS] in front (1,025) is not
  whole images, and the error names the key (the encoder checks its config causal, then
  runs it bidirectional, so the rule holds either way)."""
  pathfinder = dict(layout='2d', image_height=32, image_width=32, block_height=8,
                    block_width=8, flange_height=8, flange_width=8)
  assert encoder_config(1024, pathfinder)['model']['image_local']['layout'] == '2d'
  with pytest.raises(ConfigError, match='whole images of 32 x 32 = 1024') as error:
    encoder_config(1025, pathfinder)
  assert error.value.key == 'model.image_local.image_height'
  with pytest.raises(ConfigError, match='whole images') as error:
    resolve_model({'attention': 'image_local', 'causal': False, 'image_local': ENCODER_2D},
                  chunk_lens=(96,))
  assert error.value.key == 'model.image_local.image_height'
  resolve_model({'attention': 'image_local', 'causal': False}, chunk_lens=(100,))  # 1D: any


@pytest.mark.parametrize('layout', ['1d', '2d'])
def test_splash_takes_the_bidirectional_1d_rule_and_refuses_2d(layout):
  values = {'attention': 'image_local', 'causal': False, 'attention_backend': 'splash',
            'image_local': ENCODER_2D if layout == '2d' else {'query_len': 8, 'memory_len': 8}}
  if layout == '1d':
    resolve_model(values, chunk_lens=(64,))
    return
  with pytest.raises(ConfigError, match='local 2D memory blocks') as error:
    resolve_model(values, chunk_lens=(64,))
  assert error.value.key == 'model.attention_backend'
