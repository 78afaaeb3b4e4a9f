"""The Longformer layer on its cuDNN window path equals its XLA path, checked on CPU.

On a GPU in bfloat16, `attention_backend` 'auto' or 'cudnn' sends the causal
window of dilation 1 through attention/core/cudnn_window.py, with the window
cache as extra slots and global tokens merged by log-sum-exp. cuDNN itself
runs only on a GPU (tests/attention/test_cudnn_attention.py); here the layer is forced
onto that path with the kernel call run by XLA (`implementation='xla'`, the
same packed description as a dense mask, in float32), and held to the layer's own
blocked XLA path with the same parameters: outputs, the carried cache, and
gradients with respect to parameters and inputs, over two chunks (a stream
start with an empty cache, then a full one), with documents starting
mid-chunk, padding and global tokens; the same for StreamingLLM's window
without sinks (imported Mistral / Qwen2 windows). Padding queries' rows, which no layer
reads, are 0 on the cuDNN path and not compared). The backend rules for the layer on a
GPU are checked without one.
"""

import functools

import jax.numpy as jnp
import numpy as np
import pytest

from longformer_jax.attention.longformer import attention as longformer
from longformer_jax.attention.core import attention_backend as backends
from longformer_jax.attention.core import cudnn_window
from longformer_jax.attention.longformer.attention import LongformerAttention, LongformerConfig
from longformer_jax.attention.streaming_sinks import StreamingSinkAttention, StreamingSinksConfig
from longformer_jax.memory import fifo
from tests.support.backend_comparison import assert_trees_close
from tests.support.cudnn_window_runs import B, D, H, HD, WINDOW, chunk_contexts, two_chunk_run
from tests.support.tiny_models import shared_settings


@pytest.fixture
def on_cudnn_path(monkeypatch):
  """Resolve the layer's backend to 'cudnn' and run that kernel call through XLA."""
  monkeypatch.setattr(longformer.backends, 'resolve_backend',
                      lambda requested, *a, **k: requested)
  monkeypatch.setattr(cudnn_window, 'window_attention',
                      functools.partial(cudnn_window.window_attention, implementation='xla'))
  monkeypatch.setattr(longformer, 'two_sided_window_attention', functools.partial(
      longformer.two_sided_window_attention, implementation='xla'))


@pytest.mark.parametrize('global_tokens', [0, 2])
def test_longformer_cudnn_window_path_equals_xla(on_cudnn_path, global_tokens):
  contexts = chunk_contexts(bool(global_tokens))
  section = LongformerConfig(window=WINDOW, head_dilations='1,1', global_tokens=global_tokens)
  shared = lambda backend: shared_settings(num_heads=H, head_dim=HD, d_model=D, causal=True,
                                           attention_backend=backend)
  make = lambda backend: LongformerAttention(config=section, shared=shared(backend))
  state = LongformerAttention.init_state(section, shared('xla'), B)
  params, *want = two_chunk_run(make, state, contexts, 'xla')
  _, *got = two_chunk_run(make, state, contexts, 'cudnn', params)
  np.testing.assert_allclose(got[0], want[0], atol=2e-5, rtol=1e-4)
  assert_trees_close(got[1], want[1], atol=1e-6)
  assert_trees_close(got[2], want[2], atol=2e-4)


@pytest.mark.parametrize('global_tokens', [0, 2])
def test_longformer_two_sided_cudnn_window_path_equals_xla(on_cudnn_path, global_tokens):
  """The encoder Longformer (two-sided, no cache): left and right causal passes merged by
  log-sum-exp, global tokens merged in; one chunk with documents mid-chunk and padding."""
  contexts = chunk_contexts(bool(global_tokens))
  make = lambda backend: LongformerAttention(
      config=LongformerConfig(window=WINDOW, head_dilations='1,1', window_cache=False,
                              global_tokens=global_tokens),
      shared=shared_settings(num_heads=H, head_dim=HD, d_model=D, causal=False,
                             attention_backend=backend))
  state = fifo.create(B, 0, (D,))
  params, *want = two_chunk_run(make, state, contexts, 'xla')
  _, *got = two_chunk_run(make, state, contexts, 'cudnn', params)
  np.testing.assert_allclose(got[0], want[0], atol=2e-5, rtol=1e-4)
  assert_trees_close(got[2], want[2], atol=2e-4)


def test_streaming_window_without_sinks_cudnn_path_equals_xla(on_cudnn_path):
  """Imported Mistral / Qwen2 windows: StreamingLLM's layer with no sinks, the window of
  w keys over the carried FIFO and the chunk."""
  w = WINDOW + 1
  make = lambda backend: StreamingSinkAttention(
      config=StreamingSinksConfig(num_sinks=0, window=w),
      shared=shared_settings(num_heads=H, head_dim=HD, d_model=D, attention_backend=backend))
  state = {'sinks': fifo.create(B, 0, (H, 2 * HD)), 'window': fifo.create(B, w - 1, (H, 2 * HD)),
           'doc_start': jnp.zeros((B,), jnp.int32), 'last_segment': jnp.full((B,), -1, jnp.int32)}
  contexts = chunk_contexts(False)
  params, *want = two_chunk_run(make, state, contexts, 'xla')
  _, *got = two_chunk_run(make, state, contexts, 'cudnn', params)
  np.testing.assert_allclose(got[0], want[0], atol=2e-5, rtol=1e-4)
  assert_trees_close(got[1], want[1], atol=1e-6)
  assert_trees_close(got[2], want[2], atol=2e-4)


@pytest.mark.parametrize('causal, dilations, globals_, dtype, expected', [
    (True, (1, 1), 0, 'bfloat16', 'cudnn'),
    (True, (1, 1), 2, 'bfloat16', 'cudnn'),       # global tokens merged by log-sum-exp
    (False, (1, 1), 0, 'bfloat16', 'cudnn'),      # two-sided: two causal passes merged
    (True, (1, 2), 0, 'bfloat16', 'xla'),         # dilated heads: splash rules only
    (True, (1, 1), 0, 'float32', 'xla'),          # cuDNN takes bfloat16
])
def test_auto_on_a_gpu_picks_cudnn_for_causal_windows(causal, dilations, globals_, dtype,
                                                      expected):
  pattern = longformer._pattern(WINDOW, dilations, causal, globals_, in_chunk=False)
  assert backends.resolve_backend('auto', pattern, dtype=dtype, head_dim=64,
                                  platform='gpu') == expected
  # On TPU, global tokens or a cache keep the layer on XLA.
  assert backends.resolve_backend('auto', pattern, dtype=dtype, head_dim=64,
                                  platform='tpu') == 'xla'


@pytest.mark.parametrize('num_sinks, expected', [(0, 'cudnn'), (4, 'xla')])
def test_auto_on_a_gpu_sends_windows_without_sinks_to_cudnn(num_sinks, expected):
  from longformer_jax.attention import streaming_sinks
  pattern = streaming_sinks._pattern(num_sinks, 64)
  assert backends.resolve_backend('auto', pattern, dtype='bfloat16', head_dim=64,
                                  platform='gpu') == expected
