"""benchmarks/compressive_reconstruction.py: its attention against the layer's, and a run."""

import jax.numpy as jnp
import numpy as np
import pytest

import train as train_script
from benchmarks import compressive_reconstruction as reconstruction
from longformer_jax.attention import compressive
from longformer_jax.evaluation.run_restore import read_run
from tests.support.tiny_models import tiny_config


def test_content_attention_is_the_layers():
  rng = np.random.default_rng(0)
  q, k, v = (rng.normal(size=shape) for shape in ([5, 2, 4], [7, 2, 4], [7, 2, 4]))
  layer = compressive.content_attention(jnp.asarray(q[None], jnp.float32),
                                        jnp.asarray(k[None], jnp.float32),
                                        jnp.asarray(v[None], jnp.float32),
                                        jnp.ones([1, 1, 5, 7], bool))
  np.testing.assert_allclose(reconstruction.content_attention(q, k, v), np.asarray(layer)[0],
                             rtol=1e-5, atol=1e-6)


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
