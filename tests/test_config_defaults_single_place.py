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
import pathlib

import pytest

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


def test_no_class_copies_settings_into_fields_with_from_config():
  """A module receives its typed section (attention/shared_settings.py); a `from_config` that
  copies settings into re-declared fields is a second declaration of each."""
  found = []
  for path in sorted(PACKAGE.rglob('*.py')):
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
      named = isinstance(node, ast.FunctionDef) and node.name == 'from_config'
      called = isinstance(node, ast.Attribute) and node.attr == 'from_config'
      if named or called:
        found.append(f'{path.relative_to(ROOT)}:{node.lineno}')
  assert not found, 'from_config copies: ' + ', '.join(found)
