"""Old layouts of `config.json`: where the keys of runs made before the typed sections went.

Before each attention variant, block and stack owned a section, `config.model`
was flat: `model.lsh_num_buckets`, `model.window`, `model.gtrxl_gate`, and a
`layer_schedule` could hold the same flat names (`{'window': '16,32'}`).
`OLD_MODEL_KEYS` maps each old flat key to the `(section, field)` pairs that
took it over; `migrate_flat_model` rewrites such a dict in the nested layout
(`models/saved_config.migrate_saved_config` runs it on a whole `config.json`).

The map is plain data, so this module imports nothing above `config/`;
tests/config/test_config_migration.py checks that every pair names a field that
exists and that no old key is a shared `ModelConfig` setting.
"""

from typing import Mapping

# Old flat `config.model` key -> the (section, field) pairs that took it over, in the
# order of the registries (a key several sections took goes to the one the model uses).
OLD_MODEL_KEYS = {
    # attention/adaptive_span.py
    'span_max': (('adaptive_span', 'max_span'),),
    'span_ramp': (('adaptive_span', 'ramp'),),
    'span_init': (('adaptive_span', 'init'),),
    'span_block': (('adaptive_span', 'block'),),
    'span_dynamic': (('adaptive_span', 'dynamic'),),
    'span_trim': (('adaptive_span', 'trim'),),
    'clamp_len': (('adaptive_span', 'clamp_len'), ('compressive', 'clamp_len'),
                  ('expire_span', 'clamp_len'), ('xl', 'clamp_len')),
    # attention/attendre.py
    'memory_size': (('attendre', 'memory_size'),),
    'q_memory_size': (('attendre', 'q_memory_size'),),
    'memory_policy': (('attendre', 'policy'),),
    'lra_pooling': (('attendre', 'lra_pooling'),),
    'lfa_gamma': (('attendre', 'lfa_gamma'),),
    'num_sinks': (('attendre', 'num_sinks'), ('streaming_sinks', 'num_sinks')),
    'init_std_multiplier': (('attendre', 'init_std_multiplier'),),
    'admission': (('attendre', 'admission'),),
    'recent_window': (('attendre', 'recent_window'),),
    'per_head_scores': (('attendre', 'per_head_scores'),),
    'memory_top_k': (('attendre', 'top_k'),),
    'memory_top_k_method': (('attendre', 'top_k_method'),),
    'memory_recall_target': (('attendre', 'recall_target'),),
    'rope_max_distance': (('attendre', 'rope_max_distance'), ('memorizing', 'rope_max_distance')),
    # attention/bigbird.py
    'bigbird_block': (('bigbird', 'block'),),
    'bigbird_window_blocks': (('bigbird', 'window_blocks'),),
    'bigbird_random_blocks': (('bigbird', 'random_blocks'),),
    'bigbird_global_blocks': (('bigbird', 'global_blocks'),),
    'bigbird_max_global_tokens': (('bigbird', 'max_global_tokens'),),
    'bigbird_seed': (('bigbird', 'seed'),),
    # attention/compressive.py
    'compressed_mem_len': (('compressive', 'compressed_mem_len'),),
    'compression': (('compressive', 'function'),),
    'compression_rate': (('compressive', 'rate'),),
    'compression_kernel': (('compressive', 'kernel'),),
    'compression_dilation': (('compressive', 'dilation'),),
    # attention/expire_span.py
    'expire_span_max': (('expire_span', 'max_span'),),
    'expire_span_ramp': (('expire_span', 'ramp'),),
    'expire_span_init_fraction': (('expire_span', 'init_fraction'),),
    'expire_span_shorten': (('expire_span', 'shorten'),),
    # attention/longformer.py
    'window': (('longformer', 'window'),),
    'dilation': (('longformer', 'dilation'),),
    'head_dilations': (('longformer', 'head_dilations'),),
    'block_size': (('longformer', 'block_size'),),
    'global_tokens': (('longformer', 'global_tokens'),),
    'global_projections': (('longformer', 'global_projections'),),
    'window_cache': (('longformer', 'window_cache'),),
    'rotary': (('longformer', 'rotary'),),
    # attention/lsh.py
    'lsh_num_hashes': (('lsh', 'num_hashes'),),
    'lsh_num_buckets': (('lsh', 'num_buckets'),),
    'lsh_chunk_len': (('lsh', 'chunk_len'),),
    'lsh_seed': (('lsh', 'seed'),),
    'lsh_rotations_per_step': (('lsh', 'rotations_per_step'),),
    'lsh_rotary': (('lsh', 'rotary'),),
    # attention/memorizing.py
    'knn_memory_size': (('memorizing', 'memory_size'),),
    'knn_top_k': (('memorizing', 'top_k'),),
    'knn_method': (('memorizing', 'method'),),
    'knn_recall_target': (('memorizing', 'recall_target'),),
    'knn_gate': (('memorizing', 'gate'),),
    'knn_gate_value': (('memorizing', 'gate_value'),),
    'knn_normalize_qk': (('memorizing', 'normalize_qk'),),
    'knn_qk_scale_init': (('memorizing', 'qk_scale_init'),),
    # attention/sparse_transformer.py
    'sparse_pattern': (('sparse_transformer', 'pattern'),),
    'sparse_stride': (('sparse_transformer', 'stride'),),
    'sparse_summary_len': (('sparse_transformer', 'summary_len'),),
    'sparse_integration': (('sparse_transformer', 'integration'),),
    # attention/streaming_sinks.py (num_sinks: above)
    'sink_window': (('streaming_sinks', 'window'),),
    'sink_positions': (('streaming_sinks', 'positions'),),
    # attention/xl.py (clamp_len: above)
    'relative_impl': (('xl', 'relative_impl'),),
    # models/gtrxl_block.py
    'gtrxl_gate': (('gtrxl', 'gate'),),
    'gtrxl_gate_bias': (('gtrxl', 'gate_bias'),),
    'gtrxl_relu': (('gtrxl', 'relu'),),
    # models/universal_stack.py
    'act_max_steps': (('universal_act', 'max_steps'),),
    'act_epsilon': (('universal_act', 'epsilon'),),
}


def moved_key(flat_key: str, prefer: tuple = ()) -> str:
  """Where an old flat `config.model` key lives now ('window' -> 'longformer.window'), or ''.

  A name several sections took over (`clamp_len`) goes to the first of `prefer`
  (the variants the model uses) that has it, else to the first in the map.
  """
  claims = OLD_MODEL_KEYS.get(flat_key, ())
  if not claims:
    return ''
  preferred = [name for name in prefer if any(name == section for section, _ in claims)]
  section = preferred[0] if preferred else claims[0][0]
  return f'{section}.{dict(claims)[section]}'


def renamed_field(flat_key: str, sections) -> str:
  """The field of the first of `sections` (in map order) that took the old key over, or ''."""
  fields = [field for section, field in OLD_MODEL_KEYS.get(flat_key, ()) if section in sections]
  return fields[0] if fields else ''


def migrate_flat_model(values: Mapping) -> tuple:
  """An old flat `config.model` dict in the nested layout; `(values, moved)`.

  `moved` lists `(old_key, new_path)` of every key that was moved. Keys that
  are not old names stay where they are (shared settings, sections; anything
  else fails in `resolve_model` with the closest valid name).
  """
  out, moved = {}, []
  scheduled = str(dict(values.get('layer_schedule') or {}).get('attention', ''))
  prefer = tuple([values.get('attention', '')] + scheduled.replace(' ', '').split(',')) + tuple(
      str(values.get(name, '')) for name in ('block', 'stack'))
  for key, value in values.items():
    target = moved_key(key, prefer)
    if key == 'layer_schedule' and isinstance(value, Mapping):
      schedule, schedule_moved = migrate_flat_model(value)
      out[key] = schedule
      moved.extend((f'layer_schedule.{old}', f'layer_schedule.{new}')
                   for old, new in schedule_moved)
    elif target:
      section, name = target.split('.')
      out.setdefault(section, {})[name] = value
      moved.append((key, target))
    else:
      out[key] = value
  return out, moved
