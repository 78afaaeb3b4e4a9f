"""`model.attention_backend`: which kernel computes a layer's softmax attention.

- `'xla'`: the dense masked softmax of `dot_product.py` (or the variant's own
  blocked XLA path), everywhere;
- `'splash'`: Pallas splash attention (`splash_kernels.py`), compiled on TPU,
  in Pallas interpret mode on CPU (tests); not on GPU;
- `'cudnn'`: cuDNN flash attention through `jax.nn.dot_product_attention`
  (`attention/vanilla/cudnn_attention.py`), or its causal sliding window with documents as
  packed segments (`cudnn_window.py`, windowed layers), on GPU with
  `model.dtype='bfloat16'`;
- `'pallas_gpu'`: the block-sparse flash kernel in Pallas (`block_sparse_flash.py`),
  the splash rules on a GPU (compiled by Triton; interpret mode on CPU, for
  tests); not on TPU (use splash);
- `'auto'` (default): splash on TPU; on GPU cuDNN, or the Pallas kernel for the
  block-sparse patterns measured faster than XLA there (`block_sparse_on_gpu`:
  the Sparse Transformer's and BigBird's, in bfloat16); each only where the
  layer's pattern fits it, xla otherwise; resolved from `jax.default_backend()`
  when the layer runs, so a config written on one machine runs on any other.

A backend never changes what a layer computes: each is held to the dense
reference by the tests (docs/kernels.md). A layer describes what it asks of a
kernel as a `KernelPattern`; asking explicitly for a backend that cannot
compute it (or cannot run on this platform) is a `ConfigError` naming
`model.attention_backend`, raised when the config is checked.
"""

import dataclasses
from typing import Optional

import jax

from longformer_jax.config.errors import ConfigError

KEY = 'model.attention_backend'
BACKENDS = ('auto', 'xla', 'splash', 'cudnn', 'pallas_gpu')
KERNELS = ('splash', 'cudnn', 'pallas_gpu')
CUDNN_DTYPES = ('bfloat16',)      # cuDNN flash attention takes bfloat16 / float16 only
CUDNN_MAX_HEAD_DIM = 128
# auto's Pallas kernel on a GPU: the dtype it was measured in (docs/benchmarks.md, 16k tokens,
# forward + backward, one H200: 4x the XLA blocked path for strided, 16x for BigBird).
PALLAS_GPU_AUTO_DTYPES = ('bfloat16',)


@dataclasses.dataclass(frozen=True)
class KernelPattern:
  """What one attention layer asks of a kernel.

  Attributes:
    left, right: keys at position offsets `-left..right` from the query (None:
      unbounded on that side); causal is `right = 0`, bidirectional is both None.
    in_chunk: the keys are the chunk's own tokens (no memory before them).
    dense_mask_ok: the layer already costs O(n^2) (a dense `[b, q, k]` mask
      may be built for cuDNN's bias); False for O(n·w) layers.
    unsupported: why no kernel can compute the layer ('' if one can), e.g.
      'dilated windows' or 'global tokens'.
    splash_only: a static mask on slots that the splash masks express and
      cuDNN does not ('' if none), e.g. the Sparse Transformer's strided
      pattern; `left, right` are then its envelope (causal: `right = 0`).
    cudnn_window: the layer runs its window through `cudnn_window.py`
      (documents and padding as packed segments, a memory before the chunk as
      extra slots, other parts merged by log-sum-exp; a two-sided window as
      two causal passes, `attention/longformer/cudnn_two_sided_window.py`), so cuDNN needs no dense
      mask and takes a memory.
    cudnn_only: what the cuDNN window path computes and splash does not
      ('' if none), e.g. the Longformer's global tokens.
    block_sparse_on_gpu: `auto` runs the pattern through the Pallas block-sparse
      kernel on a GPU (in `PALLAS_GPU_AUTO_DTYPES`): set where that was measured
      faster than the layer's XLA path.
  """
  left: Optional[int] = None
  right: Optional[int] = 0
  in_chunk: bool = True
  dense_mask_ok: bool = True
  unsupported: str = ''
  splash_only: str = ''
  cudnn_window: bool = False
  cudnn_only: str = ''
  block_sparse_on_gpu: bool = False

  @property
  def causal(self) -> bool:
    return self.right == 0


def splash_misfit(pattern: KernelPattern, platform: str) -> str:
  """Why splash cannot compute `pattern` on `platform` ('' if it can)."""
  if platform == 'gpu':
    return ('splash is a TPU kernel (it runs compiled on TPU, interpreted on CPU); on GPU use '
            'cudnn or pallas_gpu')
  return static_mask_misfit(pattern, 'splash')


def pallas_gpu_misfit(pattern: KernelPattern, platform: str) -> str:
  """Why the Pallas block-sparse kernel cannot compute `pattern` on `platform` ('' if it can)."""
  if platform == 'tpu':
    return 'pallas_gpu is the GPU (Triton) kernel; on TPU use splash'
  return static_mask_misfit(pattern, 'pallas_gpu')


def static_mask_misfit(pattern: KernelPattern, kernel: str) -> str:
  """Why a kernel of static masks on slots (splash, pallas_gpu) cannot compute `pattern`."""
  if pattern.unsupported or pattern.cudnn_only:
    return f'the {kernel} masks cannot express {pattern.unsupported or pattern.cudnn_only}'
  if not pattern.in_chunk:
    return ('the keys include a memory before the chunk (its slots are not always full, so '
            'no static mask with an offset matches the positions)')
  return ''


def cudnn_misfit(pattern: KernelPattern, platform: str, dtype: str, head_dim: int) -> str:
  """Why cuDNN cannot compute `pattern` on `platform` ('' if it can)."""
  if platform != 'gpu':
    return f'cuDNN runs on GPU only (this platform is {platform!r})'
  if pattern.unsupported:
    return f'cuDNN attention cannot express {pattern.unsupported}'
  if pattern.splash_only:
    return f'cuDNN attention cannot express {pattern.splash_only}'
  if not (pattern.dense_mask_ok or pattern.cudnn_window):
    return ('documents and padding reach cuDNN as a dense [batch, q, k] mask, which this '
            'O(n·w) layer never builds')
  if not (pattern.causal or pattern.cudnn_window
          or (pattern.left is None and pattern.right is None)):
    return 'cuDNN has no two-sided window (its window is causal only)'
  if dtype not in CUDNN_DTYPES:
    return f'cuDNN flash attention needs model.dtype in {CUDNN_DTYPES}, got {dtype!r}'
  if head_dim % 8 or head_dim > CUDNN_MAX_HEAD_DIM:
    return f'cuDNN needs head_dim a multiple of 8 and <= {CUDNN_MAX_HEAD_DIM}, got {head_dim}'
  return ''


def check_name(backend: str) -> None:
  if backend not in BACKENDS:
    raise ConfigError(KEY, f'{backend!r} is not an attention backend; choose one of {BACKENDS}')


def resolve_backend(requested: str, pattern: KernelPattern, *, dtype: str, head_dim: int,
                    platform: Optional[str] = None) -> str:
  """The backend that runs the layer: 'xla', 'splash', 'cudnn' or 'pallas_gpu'.

  `requested` is `model.attention_backend`; `platform` defaults to
  `jax.default_backend()`. An explicit kernel that cannot compute `pattern`
  here is a `ConfigError`; `'auto'` falls back to xla instead.
  """
  check_name(requested)
  platform = platform or jax.default_backend()
  misfits = {'splash': lambda: splash_misfit(pattern, platform),
             'cudnn': lambda: cudnn_misfit(pattern, platform, dtype, head_dim),
             'pallas_gpu': lambda: pallas_gpu_misfit(pattern, platform)}
  if requested == 'xla':
    return 'xla'
  if requested in KERNELS:
    reason = misfits[requested]()
    if reason:
      raise ConfigError(KEY, f'{requested!r} cannot run this layer: {reason}; '
                             "use 'auto' (falls back to xla) or 'xla'")
    return requested
  preferred = {'tpu': 'splash', 'gpu': 'cudnn'}.get(platform)
  if preferred and not misfits[preferred]():
    return preferred
  if (platform == 'gpu' and pattern.block_sparse_on_gpu and dtype in PALLAS_GPU_AUTO_DTYPES
      and not misfits['pallas_gpu']()):
    return 'pallas_gpu'
  return 'xla'


def check_layer(requested: str, pattern: Optional[KernelPattern], attention: str, *,
                dtype: str, head_dim: int, platform: Optional[str] = None) -> None:
  """Config-time check of one layer; `pattern` None: the variant has no kernel path."""
  check_name(requested)
  if pattern is None:
    if requested in KERNELS:
      raise ConfigError(KEY, f'{requested!r} is ignored: attention {attention!r} has no '
                             'kernel backend (vanilla, longformer, streaming_sinks, '
                             "sparse_transformer, image_local and bigbird have); use 'auto' "
                             "or 'xla'")
    return
  resolve_backend(requested, pattern, dtype=dtype, head_dim=head_dim, platform=platform)
