"""Test set-up: 8 fake CPU devices and fast-compiling XLA flags (set before JAX is
imported), the repo on sys.path, and JAX's compiled programs released after each module.

Where the suite's time goes (docs/design.md, "Where the suite's time goes"): about 80% of it is
JAX tracing and XLA compiling tiny models, so the suite
- compiles with LLVM's cheap passes (`--xla_backend_optimization_level=0`,
  `--xla_llvm_disable_expensive_passes=true`): the programs run once or twice;
- releases every compiled program after each test module (`jax.clear_caches()`): each
  CPU executable holds memory maps, and a single process compiling the whole suite
  otherwise passes Linux's 65,530-map limit and aborts inside whatever maps next;
- keeps compiled programs on disk between runs (JAX's persistent compilation cache,
  keyed by the program, the flags and the jax version) when
  `LONGFORMER_JAX_TEST_CACHE` names a folder.
"""

import gc
import os
import sys

import pytest

_TEST_XLA_FLAGS = ('--xla_force_host_platform_device_count=8',
                   '--xla_backend_optimization_level=0',
                   '--xla_llvm_disable_expensive_passes=true')


def _with_test_flags(flags: str) -> str:
  """`flags` plus each test flag whose name it does not set already."""
  present = {flag.split('=')[0] for flag in flags.split()}
  extra = [flag for flag in _TEST_XLA_FLAGS if flag.split('=')[0] not in present]
  return ' '.join(flags.split() + extra)


os.environ['XLA_FLAGS'] = _with_test_flags(os.environ.get('XLA_FLAGS', ''))
os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')
os.environ.setdefault('JAX_PLATFORMS', 'cpu')
if os.environ.get('LONGFORMER_JAX_TEST_CACHE'):
  os.environ.setdefault('JAX_COMPILATION_CACHE_DIR', os.environ['LONGFORMER_JAX_TEST_CACHE'])
  os.environ.setdefault('JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS', '0.2')

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if REPO_ROOT not in sys.path:
  sys.path.insert(0, REPO_ROOT)


@pytest.fixture(scope='module', autouse=True)
def _release_compiled_programs():
  """After each module: drop JAX's caches of traced and compiled programs (see above)."""
  yield
  import jax  # pylint: disable=g-import-not-at-top
  jax.clear_caches()
  gc.collect()
