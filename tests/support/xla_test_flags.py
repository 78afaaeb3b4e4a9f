"""The XLA flags the suite compiles its tiny programs with (tests/conftest.py says why).

A test that runs a real training in a subprocess
(tests/memory/test_passkey_knn_trained_retrieval.py) takes them out again: programs compiled with LLVM's cheap passes run slower, and a training
runs its step thousands of times.
"""

TEST_XLA_FLAGS = ('--xla_force_host_platform_device_count=8',
                  '--xla_backend_optimization_level=0',
                  '--xla_llvm_disable_expensive_passes=true',
                  '--xla_cpu_use_fusion_emitters=false')
_NAMES = {flag.split('=')[0] for flag in TEST_XLA_FLAGS}


def with_test_flags(flags: str) -> str:
  """`flags` plus each test flag whose name it does not set already."""
  present = {flag.split('=')[0] for flag in flags.split()}
  extra = [flag for flag in TEST_XLA_FLAGS if flag.split('=')[0] not in present]
  return ' '.join(flags.split() + extra)


def without_test_flags(flags: str) -> str:
  """`flags` less every flag named like a test flag (a user's value of one goes too)."""
  return ' '.join(flag for flag in flags.split() if flag.split('=')[0] not in _NAMES)
