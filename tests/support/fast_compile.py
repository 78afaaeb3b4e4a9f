"""The compiler options of the suite's tiny jitted programs."""

# Tiny programs: compile fast rather than run fast (LLVM's expensive passes off).
FAST_COMPILE = {'xla_backend_optimization_level': 0, 'xla_llvm_disable_expensive_passes': True}
