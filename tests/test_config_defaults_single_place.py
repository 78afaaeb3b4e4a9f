"""A default lives in exactly one place: the section dataclass that owns the setting.

A built config is a dict with every field of every section present
(`experiment_config.resolve_config`, `models/model_config.resolve_model`), so
code that reads it says `config.key` (or `config['key']`), never
`config.get('key', default)`: such a default is a second copy that can drift
from the section's (and hides a key no section declares).

The scan covers every `X.get('<name>', <default>)` in `longformer_jax/` (ast,
so quotes and line breaks do not matter). Each receiver `X` is classified by
the name it starts from (`config.train` -> `config`, `dict(model.layer_schedule)`
-> `model`):
  * config-like names (`config`, `cfg`, `model`, `section`, `*_config`, ...):
    a read with a default fails, unless it is in `ALLOWED` (with its reason)
    or its default is read from the section class itself (`ModelConfig.attention`);
  * other names must be in `NOT_CONFIG` (Hugging Face `config.json` dicts,
    JSON metadata, environment variables), so a new kind of receiver is
    classified here rather than slipping past.
"""

import ast
import dataclasses
import pathlib

import pytest

from longformer_jax.models.resolved_model import ResolvedModel

ROOT = pathlib.Path(__file__).resolve().parent.parent
PACKAGE = ROOT / 'longformer_jax'

CONFIG_NAMES = {'config', 'cfg', 'model', 'model_config', 'section', 'values', 'layer', 'data',
                'train', 'settings', 'saved', 'given', 'sinks'}
CONFIG_SUFFIXES = ('_config', '_cfg', '_section', '_values')

# Reads of config-like receivers that keep a default: (file, receiver, key) -> reason.
ALLOWED = {
    ('longformer_jax/experiment_config.py', 'values', 'seed'):
        'the sparse input: the top-level seed default is declared here (no section holds it)',
    ('longformer_jax/experiment_config.py', 'values', 'task'):
        'the sparse input: the top-level task default is declared here (no section holds it)',
    ('longformer_jax/experiment_config.py', "dict(model.get('layer_schedule') or {})", 'attention'):
        "layer_schedule is a free mapping; its 'attention' key is optional ('' = not scheduled)",
    ('longformer_jax/models/saved_config.py', "dict(model.get('layer_schedule') or {})", 'attention'):
        "an old run's layer_schedule, before resolving: its 'attention' key is optional",
    ('longformer_jax/config/migration.py', "dict(values.get('layer_schedule') or {})",
     'attention'):
        "an old flat config's free layer_schedule mapping; its 'attention' key is optional",
    ('longformer_jax/config/migration.py', 'values', 'attention'):
        "an old flat config: '' is 'no preference' when choosing where an old key moves, not "
        'a model default',
    ('longformer_jax/generation/context.py', 'dict(model.layer_schedule)', 'attention'):
        "layer_schedule is a free mapping; its 'attention' key is optional ('' = not scheduled)",
    ('longformer_jax/evaluation/trained_memory.py', '_plain(model.layer_schedule)', 'attention'):
        "layer_schedule is a free mapping; its 'attention' key is optional ('' = not scheduled)",
}

# Receivers that are not our config: root name -> reason.
NOT_CONFIG = {
    'hf': "a Hugging Face config.json dict (longformer_jax/convert/): HF's defaults, not ours",
    'parameters': "a Hugging Face config.json's rope_scaling dict (convert/llama.py)",
    'scaling': "a Hugging Face config.json's rope_scaling dict (convert/llama.py)",
    'json': "a safetensors index's JSON metadata (convert/safetensors_reader.py)",
    'decoder': "a tokenizer.json's decoder entry (data/hf_tokenizer.py)",
    'sown': 'the flax `sown` intermediates collection of a forward pass',
    'os': 'an environment variable',
}


def root_name(node: ast.AST) -> str:
  """The name a receiver expression starts from ('' if none)."""
  if isinstance(node, ast.Name):
    return node.id
  if isinstance(node, (ast.Attribute, ast.Subscript)):
    return root_name(node.value)
  if isinstance(node, ast.BoolOp):
    return root_name(node.values[0])
  if isinstance(node, ast.Call):
    if isinstance(node.func, ast.Attribute):   # x.get(...), json.load(f)
      return root_name(node.func.value)
    if node.args:                              # dict(x), _plain(x)
      return root_name(node.args[0])
  return ''


def is_config_like(name: str) -> bool:
  if name.startswith('hf'):
    return False
  return name in CONFIG_NAMES or name.endswith(CONFIG_SUFFIXES)


def default_from_section_class(default: ast.AST) -> bool:
  """`ModelConfig.attention`: the default is read from the one place that declares it."""
  return (isinstance(default, ast.Attribute) and isinstance(default.value, ast.Name)
          and default.value.id.endswith('Config'))


def gets_with_default(source: str, path: str):
  """`(path, line, receiver source, root name, key, default node)` of each `X.get('k', d)`."""
  for node in ast.walk(ast.parse(source, path)):
    if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
        and node.func.attr == 'get' and len(node.args) == 2 and not node.keywords
        and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)):
      receiver = node.func.value
      yield (path, node.lineno, ast.unparse(receiver), root_name(receiver),
             node.args[0].value, node.args[1])


def package_gets():
  for file in sorted(PACKAGE.rglob('*.py')):
    yield from gets_with_default(file.read_text(), str(file.relative_to(ROOT)))


def restated_defaults(calls):
  """`file:line: receiver.get('key', default)` of each config read that restates a default."""
  found = []
  for path, line, receiver, root, key, default in calls:
    if not is_config_like(root) or default_from_section_class(default):
      continue
    if (path, receiver, key) in ALLOWED:
      continue
    found.append(f'{path}:{line}: {receiver}.get({key!r}, {ast.unparse(default)})')
  return found


def test_config_reads_restate_no_default():
  found = restated_defaults(package_gets())
  assert not found, (
      'config reads that restate a default (the section dataclass holds it; a resolved config '
      'has every field; read config.key instead, or declare the field in its section):\n  '
      + '\n  '.join(found))


def test_every_get_with_a_default_reads_a_known_kind_of_mapping():
  unknown = [f'{path}:{line}: {receiver}.get({key!r}, ...)'
             for path, line, receiver, root, key, _ in package_gets()
             if not is_config_like(root) and root not in NOT_CONFIG]
  assert not unknown, (
      'receivers neither config-like nor listed in NOT_CONFIG (add the name to CONFIG_NAMES '
      'if it holds our config, else to NOT_CONFIG with the reason):\n  ' + '\n  '.join(unknown))


def test_every_allowed_read_still_exists():
  present = {(path, receiver, key) for path, _, receiver, _, key, _ in package_gets()}
  stale = sorted(set(ALLOWED) - present)
  assert not stale, f'ALLOWED entries that match no read any more (remove them): {stale}'
  assert all(reason.strip() for reason in list(ALLOWED.values()) + list(NOT_CONFIG.values()))


@pytest.mark.parametrize('snippet, flagged', [
    ("x = config.get('mem_len', 0)", True),
    ('x = cfg.get("norm", "layer_norm")', True),
    ("x = config.train.get('init_from_hf', '')", True),
    ("x = dict(model.get('layer_schedule', {}) or {})", True),
    ("x = data_config.get('tokenizer_file', '')", True),
    ("x = config.mem_len", False),
    ("x = values.get('block', ModelConfig.block)", False),    # read from the section class
    ("x = hf.get('rope_theta', 10000.0)", False),             # Hugging Face config.json
    ("x = hf_config.get('rope_theta', 10000.0)", False),
    ("x = config.get('layer_schedule')", False),               # no default restated
])
def test_the_scan_flags_restated_defaults(snippet, flagged):
  found = restated_defaults(gets_with_default(snippet, 'longformer_jax/example.py'))
  assert bool(found) == flagged, found
  if flagged:
    assert found[0].startswith('longformer_jax/example.py:1: ')


def copies_with_from_config(source: str, path: str) -> list:
  """`path:line` of each function named `from_config` or `*_from_config`, and each use of one."""
  found = []
  for node in ast.walk(ast.parse(source, path)):
    name = (node.name if isinstance(node, ast.FunctionDef) else
            node.attr if isinstance(node, ast.Attribute) else
            node.id if isinstance(node, ast.Name) else
            ' '.join(alias.name for alias in node.names) if isinstance(node, ast.ImportFrom)
            else '')
    if any(word == 'from_config' or word.endswith('_from_config') for word in name.split()):
      found.append(f'{path}:{node.lineno}')
  return found


def test_no_helper_copies_settings_with_from_config():
  """A module receives its typed section (attention/shared_settings.py, the feed-forward's
  `FeedForwardConfig`, the norms' `NormConfig`); a `from_config` or `*_from_config` helper
  (the old `feed_forward_from_config`, `norm_from_config`) that copies settings into a
  module's re-declared fields is a second declaration of each."""
  found = []
  for path in sorted(PACKAGE.rglob('*.py')):
    found += copies_with_from_config(path.read_text(), str(path.relative_to(ROOT)))
  assert not found, 'from_config copies: ' + ', '.join(found)


@pytest.mark.parametrize('snippet, flagged', [
    ('def feed_forward_from_config(cfg, dtype): pass', True),
    ('from longformer_jax.layers.norms import norm_from_config', True),
    ("y = norm_from_config(cfg, 'final_norm', dtype)(x)", True),
    ('y = FeedForward.from_config(cfg)', True),
    ("y = norm_layer(NormConfig.of(cfg), 'final_norm', dtype)(x)", False),
    ('config_from_hf = 1', False),
])
def test_the_from_config_scan(snippet, flagged):
  assert bool(copies_with_from_config(snippet, 'example.py')) == flagged


# The floors whose Flax modules are built from settings (tests/test_import_graph.py's FLOORS).
MODULE_FLOORS = ('layers', 'memory', 'attention', 'models')
# Module fields named like a setting that are not a copy of it: name -> reason.
NOT_A_SETTING_COPY = {
    'dtype': "the compute dtype (a jnp dtype that models/decoder_lm.compute_dtype makes from "
             "the string model.dtype), not the setting itself",
}


def setting_names() -> dict:
  """Every setting's name -> where it is declared: `model` (the shared settings, with the
  feed-forward's and the norms' that they inherit) and each registered section."""
  from longformer_jax.models.model_config import ModelConfig, section_classes
  names = {name: 'model' for name in ModelConfig.field_names()}
  for section, cls in section_classes().items():
    for name in cls.field_names():
      names.setdefault(name, f'model.{section}')
  return names


def flax_modules():
  """`(dotted class name, class)` of every Flax module defined in `MODULE_FLOORS`."""
  import importlib
  import inspect
  import pkgutil
  import flax.linen as nn
  for floor in MODULE_FLOORS:
    package = importlib.import_module(f'longformer_jax.{floor}')
    for info in pkgutil.walk_packages(package.__path__, f'{package.__name__}.'):
      module = importlib.import_module(info.name)
      for name, cls in vars(module).items():
        if (inspect.isclass(cls) and issubclass(cls, nn.Module)
            and cls.__module__ == module.__name__):
          yield f'{module.__name__}.{name}', cls


def fields_restating_settings(modules, settings) -> list:
  """`module.Class.field (setting of section)` for each field with a default named like a
  setting: the default is a second copy of the section's (or a different one)."""
  import dataclasses
  found = []
  for qualified, cls in modules:
    for field in dataclasses.fields(cls):
      has_default = (field.default is not dataclasses.MISSING
                     or field.default_factory is not dataclasses.MISSING)
      if has_default and field.name in settings and field.name not in NOT_A_SETTING_COPY:
        found.append(f'{qualified}.{field.name} (setting of {settings[field.name]})')
  return found


def test_no_module_field_restates_a_setting_default():
  """A Flax module takes its section (or the shared settings) as its config, or a required
  value its caller reads from one; a field with a default named like a setting (the old
  `FeedForward.activation`-style copies, `CrossAttention.qkv_bias = False`) is a second
  default that can drift from the section's."""
  modules = list(flax_modules())
  assert len(modules) > 20, [name for name, _ in modules]   # the walk found the modules
  found = fields_restating_settings(modules, setting_names())
  assert not found, 'module fields that restate a setting default:\n  ' + '\n  '.join(found)


def test_the_field_scan_flags_a_restated_default():
  import flax.linen as nn
  import jax.numpy as jnp

  class Copies(nn.Module):
    d_model: int                  # required: its caller passes model.d_model
    ff_bias: bool = True          # a copy of model.ff_bias's default
    dtype: jnp.dtype = jnp.float32

  found = fields_restating_settings([('example.Copies', Copies)], setting_names())
  assert found == ['example.Copies.ff_bias (setting of model)']


# The one package file that may name `FrozenConfigDict`, with its reason.
FROZEN_CONFIG_DICT_ALLOWED = {
    'longformer_jax/experiment_config.py':
        'validate_config completes a caller\'s whole experiment ConfigDict in place, unless it '
        'is frozen; no model module receives it',
}


def frozen_config_dict_uses(source: str, path: str) -> list:
  """`path:line` of each name or attribute `FrozenConfigDict` in `source`."""
  return [f'{path}:{node.lineno}' for node in ast.walk(ast.parse(source, path))
          if (isinstance(node, ast.Attribute) and node.attr == 'FrozenConfigDict')
          or (isinstance(node, ast.Name) and node.id == 'FrozenConfigDict')]


def test_no_package_module_builds_or_takes_a_frozen_config_dict():
  """Between `resolve_model` and the Flax modules the model is a `ResolvedModel`
  (models/resolved_model.py), typed and frozen; a `FrozenConfigDict` is not built or taken
  anywhere in the package (docs/design.md, "Configuration")."""
  found = []
  for path in sorted(PACKAGE.rglob('*.py')):
    name = str(path.relative_to(ROOT))
    if name not in FROZEN_CONFIG_DICT_ALLOWED:
      found += frozen_config_dict_uses(path.read_text(), name)
  assert not found, 'FrozenConfigDict in the package: ' + ', '.join(found)


def test_model_modules_take_the_resolved_model():
  """Every Flax module of the model floor with a `config` field declares it a
  `ResolvedModel` (as the string 'ResolvedModel': the model floor's modules import it only
  under `if TYPE_CHECKING:`, it imports them through the registries); no file of the floors
  whose modules are built from settings imports ml_collections (the attention variants'
  `init_state` takes their section and the `SharedSettings`), except `models/saved_config.py`,
  which reads an old run's `config.json` before it resolves."""
  wrong = []
  for qualified, cls in flax_modules():
    if not qualified.startswith('longformer_jax.models.'):
      continue
    fields = {field.name: field.type for field in dataclasses.fields(cls)}
    if 'config' in fields and fields['config'] not in ('ResolvedModel', ResolvedModel):
      wrong.append(f'{qualified}.config: {fields["config"]!r}')
  assert not wrong, 'model modules whose config is not the ResolvedModel:\n  ' + '\n  '.join(
      wrong)
  importing = [str(path.relative_to(ROOT)) for floor in MODULE_FLOORS
               for path in sorted((PACKAGE / floor).rglob('*.py'))
               if 'ml_collections' in path.read_text()
               and path.relative_to(PACKAGE).as_posix() != 'models/saved_config.py']
  assert not importing, f'files of {MODULE_FLOORS} that use ml_collections: {importing}'


def test_a_dict_config_is_refused_where_a_model_is_built():
  """A `FrozenConfigDict` given to a model fails at once with a TypeError naming the
  `ResolvedModel`, rather than running on untyped values."""
  import jax
  import ml_collections
  from longformer_jax.models.decoder_lm import DecoderLM
  from tests.support.tiny_models import context_of, stream_batch, tiny_model_config
  config = tiny_model_config()
  assert isinstance(config, ResolvedModel) and hash(config) == hash(tiny_model_config())
  frozen = ml_collections.FrozenConfigDict(config.to_dict())
  batch = stream_batch(2, 8)
  with pytest.raises(TypeError, match='ResolvedModel'):
    DecoderLM(frozen).init(jax.random.PRNGKey(0), batch['inputs'],
                           DecoderLM.init_state(config, 2), context_of(batch))


@pytest.mark.parametrize('snippet, flagged', [
    ('config: ml_collections.FrozenConfigDict', True),
    ('from ml_collections import FrozenConfigDict', False),   # an import alone builds nothing
    ('x = FrozenConfigDict(values)', True),
    ("config: 'ResolvedModel'", False),
])
def test_the_frozen_config_dict_scan(snippet, flagged):
  assert bool(frozen_config_dict_uses(snippet, 'example.py')) == flagged


def fields_with_defaults(classes) -> list:
  """`Class.field` of each dataclass field with a default or a default factory."""
  return [f'{cls.__name__}.{field.name}' for cls in classes for field in dataclasses.fields(cls)
          if field.default is not dataclasses.MISSING
          or field.default_factory is not dataclasses.MISSING]


def test_shared_settings_restate_no_default():
  """`SharedSettings` and its `CheckpointHeads` hold the shared model settings a layer reads;
  `ModelConfig` holds their defaults, and `SharedSettings.of` (the one builder) reads them from
  a model config (tests: tests/support/tiny_models.shared_settings). A default on either is a
  copy."""
  from longformer_jax.attention.core.checkpoint_heads import CheckpointHeads
  from longformer_jax.attention.shared_settings import SharedSettings
  found = fields_with_defaults([SharedSettings, CheckpointHeads])
  assert not found, f'fields that restate a default of ModelConfig: {found}'


def test_the_default_scan_flags_a_default():
  @dataclasses.dataclass(frozen=True)
  class Copies:
    num_heads: int
    causal: bool = True
    rope_scaling: tuple = dataclasses.field(default_factory=tuple)

  assert fields_with_defaults([Copies]) == ['Copies.causal', 'Copies.rope_scaling']
