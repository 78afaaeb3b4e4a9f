"""benchmarks/compressive_reconstruction.py: its attention against the layer's, and a run."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import train as train_script
from benchmarks import compressive_reconstruction as reconstruction
from longformer_jax.data import passkey
from longformer_jax.evaluation.run_restore import read_run
from tests.support.tiny_models import tiny_config


def test_content_attention_is_a_softmax_over_every_key():
  """The benchmark's call of the layer's attention against a float64 loop over queries and
  heads: shapes `[n, h, e]` in and out, and the 1 / sqrt(e) scale."""
  rng = np.random.default_rng(0)
  q, k, v = (rng.normal(size=shape) for shape in ([5, 2, 4], [7, 2, 4], [7, 2, 4]))
  expected = np.zeros([5, 2, 4])
  for i in range(5):
    for h in range(2):
      logits = k[:, h] @ q[i, h] / 2.0
      weights = np.exp(logits - logits.max())
      expected[i, h] = (weights / weights.sum()) @ v[:, h]
  np.testing.assert_allclose(reconstruction.content_attention(q, k, v), expected,
                             rtol=1e-5, atol=1e-6)


def test_reading_captures_every_chunk_and_the_memory_before_the_answer():
  """`passkey_reading.read_documents` on a random tiny XL model: the captured layer inputs
  of each chunk are those of the model applied chunk by chunk, and the memory it keeps is
  the one the answer's chunk starts from."""
  from benchmarks import passkey_reading  # deferred: these imports serve this test only
  from longformer_jax.data.tokenizers import make_tokenizer  # deferred: as above
  from longformer_jax.evaluation.passkey_scoring import document_batch  # deferred: as above
  from longformer_jax.models.decoder_lm import DecoderLM  # deferred: as above
  from longformer_jax.models.resolved_model import lm_model_config  # deferred: as above
  from longformer_jax.train.lm_objective import chunk_context  # deferred: as above
  config = tiny_config(attention='xl', mem_len=16)
  tokenizer = make_tokenizer(config.data)
  model_config = lm_model_config(config.model, tokenizer.vocab_size)
  docs = [passkey.seeded_document(0, 200, 0.5, i, tokenizer.encode) for i in range(2)]
  chunk = 32
  model = DecoderLM(model_config)
  arrays = document_batch(docs, 2, chunk, tokenizer.bos_id, tokenizer.pad_id)
  memory = DecoderLM.init_state(model_config, 2)
  first = {k: jnp.asarray(v[:, :chunk]) for k, v in arrays.items()}
  params = model.init(jax.random.PRNGKey(0), first['inputs'], memory,
                      chunk_context(first, deterministic=True))['params']
  capture = lambda m, name: name == '__call__' and m.name == 'attention_norm'
  reading = passkey_reading.read_documents(
      passkey_reading.capturing_step(model_config, capture), model_config, params, docs, chunk,
      tokenizer, per_chunk=lambda sown: reconstruction.layer_inputs(sown, 2))
  width = arrays['inputs'].shape[1]
  assert [x.shape for x in reading.per_layer] == [(2, width, 32)] * 2
  answer_chunks = {(d.answer_start + 1) // chunk for d in docs}
  assert reading.answers_in_one_chunk == (len(answer_chunks) == 1)
  for index in range(width // chunk):
    if index == max(answer_chunks):
      for held, now in zip(jax.tree_util.tree_leaves(reading.memory_at_answer),
                           jax.tree_util.tree_leaves(memory)):
        np.testing.assert_allclose(np.asarray(held, np.float32), np.asarray(now, np.float32),
                                   rtol=1e-5, atol=1e-5)
    piece = {k: jnp.asarray(v[:, index * chunk:(index + 1) * chunk]) for k, v in arrays.items()}
    (_, memory, _), sown = model.apply({'params': params}, piece['inputs'], memory,
                                       chunk_context(piece, deterministic=True),
                                       mutable=['intermediates'], capture_intermediates=capture)
    for layer, x in enumerate(reconstruction.layer_inputs(sown['intermediates'], 2)):
      np.testing.assert_allclose(reading.per_layer[layer][:, index * chunk:(index + 1) * chunk],
                                 x, rtol=1e-5, atol=1e-6)


def test_relative_error():
  target = np.array([[1.0, 2.0], [2.0, 0.0]])
  assert reconstruction.relative_error(target, target) == 0.0
  assert reconstruction.relative_error(np.zeros_like(target), target) == pytest.approx(1.0)
  assert reconstruction.relative_error(2 * target, target) == pytest.approx(1.0)


@pytest.mark.slow      # trains a tiny compressive model for 2 steps
def test_a_report_row_per_layer(tmp_path, capsys):
  config = tiny_config(attention='compressive', mem_len=128,
                       compressive={'compressed_mem_len': 128, 'rate': 4},
                       aux_loss_weights={'reconstruction_loss': 1.0})
  config.data.update(corpus='passkey', chunk_len=128, chunks_per_step=1)
  config.train.update(num_steps=2, checkpoint_every=2)
  train_script.train(config, str(tmp_path))
  config, tokenizer, params, _, _ = read_run(str(tmp_path))
  reconstruction.report(config, tokenizer, params, 1024, [50], 2)
  rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith('| 50%')]
  assert [row.split('|')[2].strip() for row in rows] == ['0', '1']
  for row in rows:
    errors = [float(x) for cell in row.split('|')[3:5] for x in cell.split('/')]
    assert all(np.isfinite(errors)) and all(e >= 0 for e in errors)
