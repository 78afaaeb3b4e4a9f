"""LED (Longformer encoder-decoder): cross-attention, the decoder's masks, seq2seq data, training.

Cross-attention is held to a float64 numpy loop; causality and source
padding are checked by perturbing inputs; the built-in summarisation targets
against a hand-written module.
"""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from longformer_jax.data import seq2seq_tasks
from longformer_jax.data.byte_tokenizer import ByteTokenizer
from longformer_jax.models.encoder import encoder_context
from longformer_jax.models.encoder_decoder import CrossAttention, decoder_context
from longformer_jax.tasks.registry import task_for
from tests.support.tiny_models import shared_settings
from tests.support.tiny_tasks import fit, tiny_task_config

TOKENIZER = ByteTokenizer()


def test_cross_attention_equals_float64_reference():
  batch, targets, sources, heads, head_dim, d_model = 2, 5, 7, 2, 4, 8
  rng = np.random.default_rng(0)
  x = rng.normal(size=(batch, targets, d_model)).astype(np.float32)
  source = rng.normal(size=(batch, sources, d_model)).astype(np.float32)
  valid = np.ones((batch, sources), bool)
  valid[1, 4:] = False
  module = CrossAttention(shared_settings(num_heads=heads, head_dim=head_dim, d_model=d_model))
  params = module.init(jax.random.PRNGKey(0), x, source, valid)['params']
  got = np.asarray(module.apply({'params': params}, x, source, valid))
  p = jax.tree_util.tree_map(lambda a: np.asarray(a, np.float64), nn.meta.unbox(params))
  expected = np.zeros((batch, targets, d_model))
  for b in range(batch):
    for h in range(heads):
      for t in range(targets):
        q = x[b, t] @ p['query']['kernel'][:, h]
        keys = [s for s in range(sources) if valid[b, s]]
        scores = np.array([q @ (source[b, s] @ p['key']['kernel'][:, h]) for s in keys])
        weights = np.exp(scores / np.sqrt(head_dim) - np.max(scores / np.sqrt(head_dim)))
        weights /= weights.sum()
        mixed = sum(w * (source[b, s] @ p['value']['kernel'][:, h]) for w, s in zip(weights, keys))
        expected[b, t] += mixed @ p['out']['kernel'][h]
  np.testing.assert_allclose(got, expected, rtol=2e-5, atol=2e-5)


def test_decoder_is_causal_and_ignores_source_padding():
  config = tiny_task_config('seq2seq')
  _, model = task_for(config.task).model(config, TOKENIZER.vocab_size)
  rng = np.random.default_rng(1)
  source = rng.integers(0, 256, (2, 32)).astype(np.int32)
  source_mask = np.ones((2, 32), bool)
  source_mask[:, 20:] = False
  flags = np.zeros((2, 32), bool)
  flags[:, 0] = True
  target = rng.integers(0, 256, (2, 12)).astype(np.int32)
  target_mask = np.ones((2, 12), bool)
  src_ctx = encoder_context(jnp.asarray(source_mask), jnp.asarray(flags), True)
  tgt_ctx = decoder_context(jnp.asarray(target_mask), True)
  params = model.init(jax.random.PRNGKey(0), source, src_ctx, target, tgt_ctx)['params']
  apply = jax.jit(lambda s, t: model.apply({'params': params}, s, src_ctx, t, tgt_ctx)[0])
  run = lambda s, t: np.asarray(apply(s, t))
  logits = run(source, target)
  later = target.copy()
  later[:, 6] = (later[:, 6] + 1) % 256
  moved = np.abs(run(source, later) - logits).max(axis=(0, 2))
  assert np.all(moved[:6] == 0) and np.all(moved[6:] > 0)
  padding = source.copy()
  padding[:, 25] = (padding[:, 25] + 1) % 256
  np.testing.assert_array_equal(run(padding, target), logits)
  real = source.copy()
  real[:, 10] = (real[:, 10] + 1) % 256
  assert np.abs(run(real, target) - logits).max(axis=(0, 2)).min() > 0   # every position sees it


MODULE = b'''"""Doc."""
import os

def first(a):
  def inner():
    pass
  return a

class Second:
  def method(self):
    pass

async def third():
  pass
'''


def test_builtin_targets_are_top_level_names_in_the_excerpt():
  assert seq2seq_tasks.top_level_names(MODULE, len(MODULE)) == ['first', 'Second', 'third']
  cut = MODULE.index(b'async def')
  assert seq2seq_tasks.top_level_names(MODULE, cut) == ['first', 'Second']
  assert seq2seq_tasks.top_level_names(b'def broken(:\n', 100) == []


def test_seq2seq_arrays_shift_the_target_behind_bos_and_end_it_with_eos():
  pairs = [(np.arange(3, dtype=np.int32), np.array([10, 11, 12], np.int32)),
           (np.arange(9, dtype=np.int32), np.arange(20, 30, dtype=np.int32))]
  arrays = seq2seq_tasks.seq2seq_arrays(pairs, seq_len=6, target_len=5, bos_id=257, eos_id=258,
                                        pad_id=256)
  np.testing.assert_array_equal(arrays['inputs'], [[257, 0, 1, 2, 256, 256], [257, 0, 1, 2, 3, 4]])
  np.testing.assert_array_equal(arrays['decoder_targets'], [[10, 11, 12, 258, 256],
                                                            [20, 21, 22, 23, 258]])
  np.testing.assert_array_equal(arrays['decoder_inputs'], [[257, 10, 11, 12, 256],
                                                           [257, 20, 21, 22, 23]])
  np.testing.assert_array_equal(arrays['decoder_mask'].sum(axis=1), [4, 5])
  np.testing.assert_array_equal(np.flatnonzero(arrays['global_flags'][0]), [0])


@pytest.mark.slow
def test_led_learns_the_synthetic_task():
  before, after = fit(tiny_task_config('seq2seq'), 400)
  # Half the targets are EOS; the other half, the planted letter, needs cross-attention
  # (without it the loss stays near ln(26) / 2 = 1.6).
  assert after['loss'] < 0.5 and before['loss'] > 4
  assert after['token_accuracy'] > 0.9


def test_scrolls_loader_reads_prepared_pairs(tmp_path, monkeypatch):
  """scrolls/gov_report prepared offline by the real builder from local jsonl files."""
  import json
  import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top
  from longformer_jax.data import tfds_tasks
  from tests.support.offline_tfds import allow_tfds_building
  allow_tfds_building(monkeypatch)
  rows = {'train': [('A long report.', 'Short.'), ('Another report.', 'Brief.')],
          'validation': [('Held-out report.', 'Summary.')], 'test': [('Test report.', None)]}
  source = tmp_path / 'source' / 'gov_report'
  source.mkdir(parents=True)
  for split, pairs in rows.items():
    lines = [json.dumps({'id': f'{split}{i}', 'pid': f'{split}{i}', 'input': src, 'output': out})
             for i, (src, out) in enumerate(pairs)]
    (source / f'{split}.jsonl').write_text('\n'.join(lines) + '\n', encoding='utf-8')
  monkeypatch.setattr(tfds.download.DownloadManager, 'download_and_extract',
                      lambda self, url: tfds.core.Path(str(tmp_path / 'source')))
  data_dir = str(tmp_path / 'data')
  tfds.builder('scrolls/gov_report', data_dir=data_dir).download_and_prepare(
      download_config=tfds.download.DownloadConfig(try_download_gcs=False))
  assert sorted(tfds_tasks.scrolls('train', data_dir)) == sorted(
      (s.encode(), t.encode()) for s, t in rows['train'])
  assert tfds_tasks.scrolls('valid', data_dir) == [(b'Held-out report.', b'Summary.')]
