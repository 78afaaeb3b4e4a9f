"""The chunk scan: equals one-shot processing when memory covers the past;
documents are isolated from whatever came before them in the row."""

import jax
import numpy as np
import pytest

from longformer_jax.models.chunk_driver import merge_chunks, scan_chunks
from longformer_jax.models.decoder_lm import DecoderLM
from longformer_jax.train.lm_objective import chunk_context
from tests.support.tiny_models import context_of, stream_batch, tiny_model_config

B, T = 2, 32


def chunked_logits(model_config, params, batch, chunk_len):
  """Logits `[batch, T, vocab]` from the chunk driver."""
  model = DecoderLM(model_config)

  def one_chunk(states, chunk, index):
    logits, states, _ = model.apply({'params': params}, chunk['inputs'], states,
                                    chunk_context(chunk, True))
    return states, logits

  memory = DecoderLM.init_state(model_config, batch['inputs'].shape[0])
  _, logits = jax.jit(lambda p, m, b: scan_chunks(one_chunk, m, b, chunk_len))(params, memory, batch)
  return merge_chunks(logits)


def init_params(model_config, batch, chunk_len):
  model = DecoderLM(model_config)
  chunk = {k: v[:, :chunk_len] for k, v in batch.items()}
  memory = DecoderLM.init_state(model_config, batch['inputs'].shape[0])
  return model.init(jax.random.PRNGKey(0), chunk['inputs'], memory, context_of(chunk))['params']


@pytest.mark.parametrize('attention', ['vanilla', 'xl'])
def test_chunk_scan_equals_one_shot(attention):
  batch = stream_batch(B, T, seed=1)
  scanned = tiny_model_config(attention=attention, mem_len=T)    # memory holds the whole past
  params = init_params(scanned, batch, 8)
  chunked = chunked_logits(scanned, params, batch, chunk_len=8)
  # One shot: the whole input as one chunk, no memory. For XL the one-shot
  # path uses the gather implementation, independent of the relative shift.
  gather = {'xl': {'relative_impl': 'gather'}} if attention == 'xl' else {}
  one_shot_config = tiny_model_config(attention=attention, mem_len=0, **gather)
  one_shot = chunked_logits(one_shot_config, params, batch, chunk_len=T)
  np.testing.assert_allclose(np.asarray(chunked), np.asarray(one_shot), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize('attention', ['vanilla', 'xl'])
def test_short_memory_differs_from_one_shot(attention):
  """Guards the test above against passing vacuously: a short memory must matter."""
  batch = stream_batch(B, T, seed=1)
  config = tiny_model_config(attention=attention, mem_len=4)
  params = init_params(config, batch, 8)
  chunked = chunked_logits(config, params, batch, chunk_len=8)
  one_shot = chunked_logits(tiny_model_config(attention=attention, mem_len=0), params, batch, T)
  assert np.abs(np.asarray(chunked) - np.asarray(one_shot)).max() > 1e-3


def two_documents(first_doc_tokens, second_doc_tokens):
  """One row: doc A then doc B, as the stream batcher lays them out."""
  tokens = np.concatenate([first_doc_tokens, second_doc_tokens]).astype(np.int32)
  n, split = tokens.size, first_doc_tokens.size
  positions = np.arange(n, dtype=np.int32)
  segment_ids = (positions >= split).astype(np.int32)
  doc_start = (positions == 0) | (positions == split)
  ones = np.ones(n, bool)
  return {k: v[None] for k, v in dict(inputs=tokens, targets=tokens, positions=positions,
                                      segment_ids=segment_ids, doc_start=doc_start,
                                      input_mask=ones, target_mask=ones).items()}


@pytest.mark.parametrize('attention', ['vanilla', 'xl'])
@pytest.mark.parametrize('split', [8, 13])   # doc B starts at / inside a chunk
def test_document_outputs_ignore_previous_document(attention, split):
  rng = np.random.default_rng(0)
  doc_b = rng.integers(0, 256, T - split)
  doc_a1, doc_a2 = rng.integers(0, 256, split), rng.integers(0, 256, split)
  config = tiny_model_config(attention=attention, mem_len=8)
  first = two_documents(doc_a1, doc_b)
  params = init_params(config, first, 8)
  out1 = np.asarray(chunked_logits(config, params, first, 8))
  out2 = np.asarray(chunked_logits(config, params, two_documents(doc_a2, doc_b), 8))
  assert np.abs(out1[:, :split] - out2[:, :split]).max() > 1e-3    # doc A did change
  np.testing.assert_array_equal(out1[:, split:], out2[:, split:])
