"""Every earlier layout of `config.json` loads through eval.py, each old key at its new path.

The layouts `config/migration.py` and `models/saved_config.migrate_saved_config`
migrate, each written here as the `config.json` of an old run:

1. flat model: every old key of a section beside the shared settings
   (`model.lsh_num_buckets`), one run per section that took old keys over;
2. flat layer schedule: old names inside `model.layer_schedule`
   (`{'window': '16,32'}`);
3. a schedule of several variants: a name several sections took over goes
   to the one the run uses (`clamp_len` to xl, `rope_max_distance` to memorizing);
4. settings the old run did not read (another variant's old keys, `mem_len`
   of a variant without a cache): dropped.

Each layout gives `old key: (value, new path under model)`, spelled out here
rather than read from the map, so a wrong entry in the map fails.
"""

import ast
import json
import pathlib

import ml_collections
import pytest

import eval as eval_script
from longformer_jax import command_line
from longformer_jax.config.errors import ConfigError
from longformer_jax.config.migration import OLD_MODEL_KEYS
from longformer_jax.experiment_config import resolve_config
from longformer_jax.models.model_config import ModelConfig, section_classes

ROOT = pathlib.Path(__file__).resolve().parents[2]
MIGRATION = ROOT / 'longformer_jax' / 'config' / 'migration.py'

# What train.py wrote beside `model` before the sections existed (tests/data/old_run_configs/).
OLD_RUN = {
    'seed': 0, 'task': 'lm',
    'data': {'corpus': 'stdlib', 'tfds_data_dir': '', 'tokenizer': 'byte',
             'sentencepiece_model': '', 'skip_undecodable': False, 'batch_size': 8,
             'chunk_len': 256, 'chunks_per_step': 1, 'eval_batch_size': 8},
    'optimizer': {'learning_rate': 0.002, 'warmup_steps': 100, 'end_learning_rate_fraction': 0.1,
                  'weight_decay': 0.01, 'b1': 0.9, 'b2': 0.98, 'eps': 1e-08,
                  'grad_clip_norm': 1.0, 'grad_accum_steps': 1},
    'train': {'num_steps': 900, 'stop_after_steps': 0, 'log_every': 25, 'eval_every': 300,
              'eval_max_tokens': 65536, 'checkpoint_every': 300, 'keep_checkpoints': 3,
              'async_checkpointing': True, 'phases': 1, 'phase_steps': '',
              'phase_length_factor': 2, 'phase_window_factor': 2, 'phase_lr_factor': 0.5},
    'parallel': {'mesh_shape': [-1, 1, 1], 'multi_host': False},
    'eval': {'split': 'valid', 'chunk_len': 0, 'mem_lens': '', 'max_tokens': 0, 'step': -1},
}
SHARED = {'num_layers': 2, 'd_model': 64, 'num_heads': 2, 'head_dim': 32, 'd_ff': 128,
          'dropout_rate': 0.0, 'tie_embeddings': True, 'dtype': 'float32', 'vocab_multiple': 64,
          'mem_len': 0, 'scan_layers': False, 'remat_policy': 'none', 'block': 'pre_ln',
          'stack': 'standard', 'layer_schedule': {}, 'aux_loss_weights': {}}

# Layout 1: (shared settings of the run, {old key: (value, new path)}).
FLAT = {
    'adaptive_span': ({'attention': 'adaptive_span', 'mem_len': 128}, {
        'span_max': (64, 'adaptive_span.max_span'), 'span_ramp': (16.0, 'adaptive_span.ramp'),
        'span_init': (0.25, 'adaptive_span.init'), 'span_block': (32, 'adaptive_span.block'),
        'span_trim': (False, 'adaptive_span.trim'), 'clamp_len': (48, 'adaptive_span.clamp_len')}),
    'adaptive_span_dynamic': ({'attention': 'adaptive_span', 'mem_len': 128}, {
        'span_dynamic': (True, 'adaptive_span.dynamic')}),
    'attendre_lra': ({'attention': 'attendre', 'stack': 'attendre_delay'}, {
        'memory_size': (64, 'attendre.memory_size'), 'q_memory_size': (8, 'attendre.q_memory_size'),
        'memory_policy': ('lra', 'attendre.policy'), 'lra_pooling': ('sum', 'attendre.lra_pooling'),
        'num_sinks': (2, 'attendre.num_sinks'),
        'init_std_multiplier': (2.0, 'attendre.init_std_multiplier'),
        'admission': ('score', 'attendre.admission'),
        'recent_window': (16, 'attendre.recent_window'),
        'per_head_scores': (True, 'attendre.per_head_scores'),
        'memory_top_k': (8, 'attendre.top_k'),
        'memory_top_k_method': ('approx', 'attendre.top_k_method'),
        'memory_recall_target': (0.9, 'attendre.recall_target'),
        'rope_max_distance': (63, 'attendre.rope_max_distance')}),
    'attendre_lfa': ({'attention': 'attendre'}, {
        'memory_policy': ('lfa', 'attendre.policy'), 'lfa_gamma': (0.9, 'attendre.lfa_gamma')}),
    'bigbird': ({'attention': 'bigbird'}, {
        'bigbird_block': (32, 'bigbird.block'),
        'bigbird_window_blocks': (2, 'bigbird.window_blocks'),
        'bigbird_random_blocks': (1, 'bigbird.random_blocks'),
        'bigbird_global_blocks': (2, 'bigbird.global_blocks'),
        'bigbird_max_global_tokens': (4, 'bigbird.max_global_tokens'),
        'bigbird_seed': (7, 'bigbird.seed')}),
    'compressive': ({'attention': 'compressive', 'mem_len': 64}, {
        'compressed_mem_len': (32, 'compressive.compressed_mem_len'),
        'compression': ('dilated_conv', 'compressive.function'),
        'compression_rate': (2, 'compressive.rate'),
        'compression_kernel': (4, 'compressive.kernel'),
        'compression_dilation': (3, 'compressive.dilation'),
        'clamp_len': (40, 'compressive.clamp_len')}),
    'expire_span': ({'attention': 'expire_span', 'mem_len': 128}, {
        'expire_span_max': (96, 'expire_span.max_span'),
        'expire_span_ramp': (8, 'expire_span.ramp'),
        'expire_span_init_fraction': (0.25, 'expire_span.init_fraction'),
        'expire_span_shorten': (True, 'expire_span.shorten'),
        'clamp_len': (24, 'expire_span.clamp_len')}),
    'longformer': ({'attention': 'longformer'}, {
        'window': (32, 'longformer.window'), 'dilation': (2, 'longformer.dilation'),
        'block_size': (64, 'longformer.block_size'),
        'global_tokens': (4, 'longformer.global_tokens'),
        'global_projections': (False, 'longformer.global_projections'),
        'window_cache': (False, 'longformer.window_cache'),
        'rotary': (False, 'longformer.rotary')}),
    'longformer_head_dilations': ({'attention': 'longformer'}, {
        'head_dilations': ('1,2', 'longformer.head_dilations')}),
    'lsh': ({'attention': 'lsh'}, {
        'lsh_num_hashes': (4, 'lsh.num_hashes'), 'lsh_num_buckets': (4, 'lsh.num_buckets'),
        'lsh_chunk_len': (32, 'lsh.chunk_len'), 'lsh_seed': (3, 'lsh.seed'),
        'lsh_rotations_per_step': (True, 'lsh.rotations_per_step'),
        'lsh_rotary': (False, 'lsh.rotary')}),
    'memorizing': ({'attention': 'memorizing'}, {
        'knn_memory_size': (512, 'memorizing.memory_size'), 'knn_top_k': (8, 'memorizing.top_k'),
        'knn_method': ('approx', 'memorizing.method'),
        'knn_recall_target': (0.9, 'memorizing.recall_target'),
        'knn_gate': ('fixed', 'memorizing.gate'), 'knn_gate_value': (0.25, 'memorizing.gate_value'),
        'knn_normalize_qk': (True, 'memorizing.normalize_qk'),
        'knn_qk_scale_init': (8.0, 'memorizing.qk_scale_init'),
        'rope_max_distance': (127, 'memorizing.rope_max_distance')}),
    'sparse_transformer': ({'attention': 'sparse_transformer'}, {
        'sparse_pattern': ('fixed', 'sparse_transformer.pattern'),
        'sparse_stride': (32, 'sparse_transformer.stride'),
        'sparse_summary_len': (2, 'sparse_transformer.summary_len'),
        'sparse_integration': ('multihead', 'sparse_transformer.integration')}),
    'streaming_sinks': ({'attention': 'streaming_sinks'}, {
        'num_sinks': (2, 'streaming_sinks.num_sinks'),
        'sink_window': (128, 'streaming_sinks.window'),
        'sink_positions': ('original', 'streaming_sinks.positions')}),
    'xl': ({'attention': 'xl', 'mem_len': 128}, {
        'clamp_len': (64, 'xl.clamp_len'), 'relative_impl': ('gather', 'xl.relative_impl')}),
    'gtrxl': ({'attention': 'vanilla', 'block': 'gtrxl'}, {
        'gtrxl_gate': ('highway', 'gtrxl.gate'), 'gtrxl_gate_bias': (1.0, 'gtrxl.gate_bias'),
        'gtrxl_relu': (False, 'gtrxl.relu')}),
    'universal_act': ({'attention': 'vanilla', 'stack': 'universal_act'}, {
        'act_max_steps': (6, 'universal_act.max_steps'),
        'act_epsilon': (0.05, 'universal_act.epsilon')}),
}

# Layouts 2 and 3: old keys at the top and in the schedule; {path under model: value}.
SCHEDULED = {
    'flat_layer_schedule': (
        {'attention': 'longformer', 'num_layers': 4, 'window': 32, 'head_dilations': '1,1',
         'layer_schedule': {'window': '16,32,64,128',
                            'head_dilations': ['1,1', '1,1', '1,2', '2,2']}},
        {'longformer.window': 32, 'longformer.head_dilations': '1,1',
         'layer_schedule': {'longformer': {'window': '16,32,64,128',
                                           'head_dilations': ['1,1', '1,1', '1,2', '2,2']}}}),
    'scheduled_variants': (
        {'attention': 'xl', 'mem_len': 64, 'layer_schedule': {'attention': 'xl,memorizing'},
         'clamp_len': 32, 'rope_max_distance': 63, 'knn_memory_size': 256},
        {'xl.clamp_len': 32, 'memorizing.rope_max_distance': 63, 'memorizing.memory_size': 256,
         'layer_schedule': {'attention': 'xl,memorizing'}}),
}

# Layout 4: the run read none of these; they load as the defaults.
UNREAD = ({'attention': 'longformer', 'mem_len': 128, 'window': 64, 'knn_top_k': 8,
           'lsh_num_buckets': 4, 'gtrxl_gate': 'output', 'act_epsilon': 0.1},
          {'longformer.window': 64, 'mem_len': 0, 'memorizing.top_k': 32, 'lsh.num_buckets': 8,
           'gtrxl.gate': 'gru', 'universal_act.epsilon': 0.01})


def load_as_eval_does(tmp_path, model: dict) -> ml_collections.ConfigDict:
  """`config.json` with this old `model`, read by eval.py's `run_config` (as --workdir is)."""
  (tmp_path / 'config.json').write_text(json.dumps(dict(OLD_RUN, model=model)))
  cli_config = command_line.experiment_config(command_line.DEFAULT_CONFIG, [])
  return eval_script.run_config(cli_config, str(tmp_path))


def at(model: ml_collections.ConfigDict, path: str):
  for part in path.split('.'):
    model = model[part]
  return model.to_dict() if isinstance(model, ml_collections.ConfigDict) else model


@pytest.mark.parametrize('name', sorted(FLAT))
def test_flat_model_keys_land_in_their_sections(tmp_path, name):
  shared, old = FLAT[name]
  model = dict(SHARED, **shared, **{key: value for key, (value, _) in old.items()})
  loaded = load_as_eval_does(tmp_path, model).model
  assert {key: at(loaded, path) for key, (_, path) in old.items()} == {
      key: value for key, (value, _) in old.items()}
  assert all(key not in loaded for key in old)


@pytest.mark.parametrize('name', sorted(SCHEDULED))
def test_scheduled_old_keys_land_in_their_sections(tmp_path, name):
  shared, expected = SCHEDULED[name]
  loaded = load_as_eval_does(tmp_path, dict(SHARED, **shared)).model
  assert {path: at(loaded, path) for path in expected} == expected


def test_settings_the_old_run_did_not_read_are_dropped(tmp_path):
  shared, expected = UNREAD
  loaded = load_as_eval_does(tmp_path, dict(SHARED, **shared)).model
  assert {path: at(loaded, path) for path in expected} == expected


def test_the_layouts_cover_every_old_key_of_the_map():
  written = {(key, path) for _, old in FLAT.values() for key, (_, path) in old.items()}
  mapped = {(key, f'{section}.{field}') for key, claims in OLD_MODEL_KEYS.items()
            for section, field in claims}
  assert written == mapped


def test_the_map_names_fields_that_exist_and_no_shared_setting():
  sections = section_classes()
  missing = [(key, section, field) for key, claims in OLD_MODEL_KEYS.items()
             for section, field in claims
             if section not in sections or field not in sections[section].field_names()]
  assert not missing
  assert not set(OLD_MODEL_KEYS) & (set(ModelConfig.field_names()) | set(sections))
  order = list(sections)
  for claims in OLD_MODEL_KEYS.values():   # registry order: the fallback of a shared name
    assert [order.index(section) for section, _ in claims] == sorted(
        order.index(section) for section, _ in claims)


@pytest.mark.parametrize('model, message', [
    ({'attention': 'lsh', 'lsh_num_buckets': 4},
     'config.model.lsh_num_buckets: unknown key; it is now model.lsh.num_buckets'),
    ({'attention': 'compressive', 'mem_len': 8, 'clamp_len': 4},
     'config.model.clamp_len: unknown key; it is now model.compressive.clamp_len'),
    ({'attention': 'vanilla', 'clamp_len': 4},
     'config.model.clamp_len: unknown key; it is now model.adaptive_span.clamp_len'),
    ({'attention': 'xl', 'num_layer': 2},
     'config.model.num_layer: unknown key; did you mean num_layers?'),
])
def test_a_new_config_with_an_old_or_unknown_key_names_where_to(model, message):
  with pytest.raises(ConfigError) as error:
    resolve_config({'model': model})
  assert str(error.value) == message


def test_only_the_migration_module_names_legacy_names():
  found = [str(path.relative_to(ROOT)) for path in sorted((ROOT / 'longformer_jax').rglob('*.py'))
           if path != MIGRATION and 'legacy_names' in path.read_text()]
  assert not found, f'legacy_names outside {MIGRATION.relative_to(ROOT)}: {found}'


def test_config_imports_nothing_above_it():
  above = []
  for path in sorted((ROOT / 'longformer_jax' / 'config').glob('*.py')):
    for node in ast.walk(ast.parse(path.read_text())):
      names = ([alias.name for alias in node.names] if isinstance(node, ast.Import)
               else [node.module or ''] if isinstance(node, ast.ImportFrom) else [])
      above += [f'{path.name}: {name}' for name in names
                if name.startswith('longformer_jax') and
                not name.startswith('longformer_jax.config')]
  assert not above
