"""The names a user imports: `from longformer_jax import XLAttention, SharedSettings, hf`.

These stay put when the modules behind them move (docs/design.md, "Public API"): each is a
re-export of the object its own module defines, never a copy, and
tests/test_public_api.py fails, naming the change, when one disappears or its signature
changes (tests/public_api.json holds the signatures).

They are loaded on first use (a module `__getattr__`, PEP 562): `import longformer_jax`
imports no JAX and no submodule, which matters because every `import longformer_jax.<module>`
of the package, its scripts and its tests runs this file first. Measured on a 2-core host:
`import longformer_jax` 0.07 s, as with the empty file before (the bare interpreter: 0.07 s);
importing every name eagerly 3.4-4.2 s (docs/design.md, "Public API").

Modules of the package import from their own modules, never from here
(tests/test_public_api.py checks it): this file stands above every floor.
"""

import importlib

# Public name -> the module that defines it.
_HOMES = {
    # The attention variants (docs/variants.md) and their config sections.
    'AdaptiveSpanAttention': 'longformer_jax.attention.adaptive_span',
    'AdaptiveSpanConfig': 'longformer_jax.attention.adaptive_span',
    'AttendreAttention': 'longformer_jax.attention.attendre',
    'AttendreConfig': 'longformer_jax.attention.attendre',
    'BigBirdAttention': 'longformer_jax.attention.bigbird.attention',
    'BigBirdConfig': 'longformer_jax.attention.bigbird.attention',
    'BlockBERTAttention': 'longformer_jax.attention.blockbert',
    'BlockBERTConfig': 'longformer_jax.attention.blockbert',
    'BPTransformerAttention': 'longformer_jax.attention.bp_transformer',
    'BPTransformerConfig': 'longformer_jax.attention.bp_transformer',
    'CompressiveAttention': 'longformer_jax.attention.compressive',
    'CompressiveConfig': 'longformer_jax.attention.compressive',
    'ETCAttention': 'longformer_jax.attention.etc',
    'ETCConfig': 'longformer_jax.attention.etc',
    'ExpireSpanAttention': 'longformer_jax.attention.expire_span',
    'ExpireSpanConfig': 'longformer_jax.attention.expire_span',
    'ImageLocalAttention': 'longformer_jax.attention.image_local.attention',
    'ImageLocalConfig': 'longformer_jax.attention.image_local.attention',
    'LongformerAttention': 'longformer_jax.attention.longformer.attention',
    'LongformerConfig': 'longformer_jax.attention.longformer.attention',
    'LSHAttention': 'longformer_jax.attention.lsh.attention',
    'LSHConfig': 'longformer_jax.attention.lsh.attention',
    'MemorizingAttention': 'longformer_jax.attention.memorizing',
    'MemorizingConfig': 'longformer_jax.attention.memorizing',
    'PerformerAttention': 'longformer_jax.attention.performer.attention',
    'PerformerConfig': 'longformer_jax.attention.performer.attention',
    'RoutingAttention': 'longformer_jax.attention.routing.attention',
    'RoutingConfig': 'longformer_jax.attention.routing.attention',
    'SparseTransformerAttention': 'longformer_jax.attention.sparse_transformer.attention',
    'SparseTransformerConfig': 'longformer_jax.attention.sparse_transformer.attention',
    'StreamingSinkAttention': 'longformer_jax.attention.streaming_sinks',
    'StreamingSinksConfig': 'longformer_jax.attention.streaming_sinks',
    'VanillaAttention': 'longformer_jax.attention.vanilla.attention',
    'XLAttention': 'longformer_jax.attention.xl',
    'XLConfig': 'longformer_jax.attention.xl',
    # What every layer takes, and one layer's attention and memory from its model config.
    'SharedSettings': 'longformer_jax.attention.shared_settings',
    'AttentionContext': 'longformer_jax.attention.context',
    'attention_class': 'longformer_jax.attention.registry',
    'attention_layer': 'longformer_jax.attention.registry',
    'attention_state': 'longformer_jax.attention.registry',
    # The model builders: config.model checked, typed, and the models built from it.
    'ModelConfig': 'longformer_jax.models.model_settings',
    'resolve_model': 'longformer_jax.models.model_config',
    'ResolvedModel': 'longformer_jax.models.resolved_model_type',
    'resolved_model': 'longformer_jax.models.resolved_model',
    'lm_model_config': 'longformer_jax.models.resolved_model',
    'encoder_model_config': 'longformer_jax.models.resolved_model',
    'DecoderLM': 'longformer_jax.models.decoder_lm',
    'MaskedLM': 'longformer_jax.models.masked_lm',
    'SequenceClassifier': 'longformer_jax.models.encoder',
    'SpanExtractor': 'longformer_jax.models.encoder',
    'EncoderDecoder': 'longformer_jax.models.encoder_decoder',
    # The memory policies (memory/policies.py).
    'EvictionPolicy': 'longformer_jax.memory.policies',
    'make_policy': 'longformer_jax.memory.policies',
    'policy_from_name': 'longformer_jax.memory.policies',
    # Generation (docs/generation.md).
    'ChunkWindowDecoder': 'longformer_jax.generation.chunk_window_decoder',
    'generate_text': 'longformer_jax.generation.text_generation',
    'GenerationResult': 'longformer_jax.generation.text_generation',
    'SamplingSettings': 'longformer_jax.generation.sampling',
    'kv_cache_model_config': 'longformer_jax.generation.kv_cache',
}
# Public name -> a module re-exported whole; its entry points are listed in
# tests/public_api.json and docs/design.md.
_MODULES = {
    # Hugging Face checkpoints: hf.load, hf.load_model, hf.convert_to_workdir, hf.export.
    'hf': 'longformer_jax.convert.hf',
    # eval.py's passkey grid and memory sweep, usable from a notebook.
    'passkey_grid': 'longformer_jax.evaluation.passkey_grid',
    'memory_sweep': 'longformer_jax.evaluation.memory_sweep',
}

__all__ = sorted(set(_HOMES) | set(_MODULES))


def __getattr__(name: str):
  """The public object `name`, imported from its module on first use."""
  if name in _MODULES:
    value = importlib.import_module(_MODULES[name])
  elif name in _HOMES:
    value = getattr(importlib.import_module(_HOMES[name]), name)
  else:
    raise AttributeError(f"module 'longformer_jax' has no attribute {name!r}")
  globals()[name] = value        # later lookups skip __getattr__
  return value


def __dir__():
  return sorted(set(globals()) | set(__all__))
