"""Test set-up: 8 fake CPU devices and fast-compiling XLA flags (set before JAX is
imported), the repo on sys.path, and JAX's compiled programs released after each module.

Where the suite's time goes (docs/design.md, "Where the suite's time goes"): about 80% of it is
JAX tracing and XLA compiling tiny models, so the suite
- compiles with LLVM's cheap passes (`--xla_backend_optimization_level=0`,
  `--xla_llvm_disable_expensive_passes=true`) and XLA's older CPU fusion code generator
  (`--xla_cpu_use_fusion_emitters=false`), which compiles a third faster: the programs
  run once or twice. XLA aborts on a flag it does not know, and JAX 0.11.2's XLA no longer
  knows that one: drop it when the pinned JAX moves past 0.10;
- releases every compiled program after each test module (`jax.clear_caches()`): each
  CPU executable holds memory maps, and a single process compiling the whole suite
  otherwise passes Linux's 65,530-map limit and aborts inside whatever maps next;
- shares compiled programs between tests, modules and the two workers through JAX's
  persistent compilation cache (keyed by the program, the flags and the jax version):
  a quarter of the suite's programs are ones another test compiled already. The cache
  is a temporary folder of the run, removed at its end; `LONGFORMER_JAX_TEST_CACHE=DIR`
  keeps it in DIR between runs instead;
- collects garbage less often (`pytest_collection_finish`): tracing allocates millions of
  short-lived objects, and Python's default thresholds walked every imported module's
  objects again and again.
"""

import gc
import os
import shutil
import sys
import tempfile

import pytest

# The helpers of tests/support/ report a failing assert with its values, as test modules do
# (pytest rewrites the asserts of test modules and conftest files only, and of what it is told).
pytest.register_assert_rewrite('tests.support')

from tests.support.xla_test_flags import with_test_flags  # pylint: disable=wrong-import-position

os.environ.setdefault('JAX_PLATFORMS', 'cpu')
if os.environ['JAX_PLATFORMS'] == 'cpu':   # CPU flags: a GPU run (gpu_checks.sh) keeps its own
  os.environ['XLA_FLAGS'] = with_test_flags(os.environ.get('XLA_FLAGS', ''))
os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if REPO_ROOT not in sys.path:
  sys.path.insert(0, REPO_ROOT)


# The run's compilation cache: named by the main process (pytest_configure runs there before
# xdist starts its workers, which inherit the variable), used by every process that tests.
_RUN_CACHE_VARIABLE = 'LONGFORMER_JAX_RUN_CACHE'


def pytest_configure(config):
  """Points JAX's persistent compilation cache at the run's folder (see the docstring)."""
  if not hasattr(config, 'workerinput') and not os.environ.get(_RUN_CACHE_VARIABLE):
    kept = os.environ.get('LONGFORMER_JAX_TEST_CACHE')
    folder = kept or tempfile.mkdtemp(prefix='longformer_jax_xla_cache_')
    os.environ[_RUN_CACHE_VARIABLE] = folder
    config.run_cache_to_remove = None if kept else folder
  # Every program, however quick to compile: the tiny test programs are most of them. Set in
  # the environment too, so that the scripts tests run (train.py, eval.py, the importer's
  # command line) share the cache: a killed run's restart compiles what the run compiled.
  settings = {'jax_compilation_cache_dir': os.environ[_RUN_CACHE_VARIABLE],
              'jax_persistent_cache_min_compile_time_secs': 0.0,
              'jax_persistent_cache_min_entry_size_bytes': 0}
  import jax  # pylint: disable=g-import-not-at-top
  for name, value in settings.items():
    jax.config.update(name, value)
    os.environ[name.upper()] = str(value)


def pytest_collection_finish(session):
  """Python's garbage collector, tuned for a process that traces thousands of programs: the
  objects alive after collection (modules, JAX's and Flax's own) are frozen out of every later
  collection, and a collection starts after 50,000 net allocations rather than 700. Tracing
  allocates millions of short-lived objects, and each full collection used to walk every
  imported module's objects again: 15 of 250 worker-seconds in tests/models and tests/tasks,
  5 after (the module fixture below still collects after each module)."""
  del session
  gc.collect()
  gc.freeze()
  gc.set_threshold(50_000, 20, 20)


def pytest_unconfigure(config):
  folder = getattr(config, 'run_cache_to_remove', None)
  if folder:
    shutil.rmtree(folder, ignore_errors=True)
    os.environ.pop(_RUN_CACHE_VARIABLE, None)


@pytest.fixture(scope='module', autouse=True)
def _release_compiled_programs():
  """After each module: drop JAX's caches of traced and compiled programs (see above)."""
  yield
  import jax  # pylint: disable=g-import-not-at-top
  jax.clear_caches()
  gc.collect()
  gc.freeze()     # what outlives the module (its imports) is not walked again


@pytest.fixture(scope='module')
def tiny_model():
  """The image task's local 2D digits model, its parameters, a batch and its jitted loss sums
  (tests/tasks/test_image_task.py, tests/evaluation/test_image_sampling.py)."""
  # deferred: imports JAX, which the settings at the top of this file must come before
  from tests.support.image_digits import tiny_digits_model  # pylint: disable=g-import-not-at-top
  return tiny_digits_model()
