"""The public API stays put: longformer_jax/__init__.py (docs/design.md, "Public API").

tests/public_api.json is the committed table: every public name, the entry points of the
public classes (a Flax module's `__call__` and `init_state`, a class's own public methods)
and of the modules re-exported whole (`MODULE_ENTRY_POINTS`), each with its signature as
`describe` writes it (annotations by their last dotted name, addresses dropped, Flax's own
`parent` and `name` fields left out). The test fails naming each name that disappeared,
changed its signature or became public without an entry.

After a deliberate change, rewrite the table and review its diff:

  python -m tests.test_public_api --write
"""

import ast
import dataclasses
import inspect
import json
import pathlib
import re
import subprocess
import sys

import flax.linen as nn

import longformer_jax
from longformer_jax.attention.registry import ATTENTION_VARIANTS

ROOT = pathlib.Path(__file__).resolve().parents[1]
TABLE = pathlib.Path(__file__).with_name('public_api.json')
# The entry points of the modules re-exported whole (longformer_jax/__init__.py, `_MODULES`).
MODULE_ENTRY_POINTS = {
    'hf': ('load', 'load_model', 'convert_to_workdir', 'export'),
    'passkey_grid': ('PasskeyGrid', 'GridMemory', 'parse_grid', 'evaluate_grid',
                     'evaluate_run_grid', 'write_grid'),
    'memory_sweep': ('SweepPoint', 'parse_sweep', 'model_overrides', 'run_sweep',
                     'write_sweep'),
}
# A Flax module's own constructor fields, not the project's.
FLAX_FIELDS = ('parent', 'name')
DOTTED = re.compile(r'\b(?:[A-Za-z_]\w*\.)+([A-Za-z_]\w*)')
ADDRESS = re.compile(r' (?:object )?at 0x[0-9a-fA-F]+')


class _Text:
  """An annotation or default shown as `text` in a signature."""

  def __init__(self, text: str):
    self.text = text

  def __repr__(self) -> str:
    return self.text


def short(text: str) -> str:
  """`text` with dotted names cut to their last part and object addresses dropped."""
  return DOTTED.sub(r'\1', ADDRESS.sub('', text))


def annotation_text(annotation):
  if annotation is inspect.Parameter.empty:
    return annotation
  if isinstance(annotation, str):
    return _Text(short(annotation))
  return _Text(short(inspect.formatannotation(annotation)))


def default_text(default):
  if default is inspect.Parameter.empty:
    return default
  if dataclasses.is_dataclass(default) and not isinstance(default, type):
    return _Text(f'{type(default).__name__}(...)')   # its own entry holds its fields
  return _Text(short(repr(default)))


def signature(obj, drop: tuple = ()) -> str:
  """`obj`'s signature with `short` annotations and defaults, without the parameters `drop`."""
  sig = inspect.signature(obj)
  parameters = [p.replace(annotation=annotation_text(p.annotation), default=default_text(p.default))
                for p in sig.parameters.values() if p.name not in drop]
  return str(sig.replace(parameters=parameters,
                         return_annotation=annotation_text(sig.return_annotation)))


def describe(obj) -> str:
  """'module', or 'class ' / 'function ' and the signature."""
  if inspect.ismodule(obj):
    return 'module'
  if inspect.isclass(obj):
    drop = FLAX_FIELDS if issubclass(obj, nn.Module) else ()
    return 'class ' + signature(obj, drop)
  return 'function ' + signature(obj)


def class_entry_points(cls) -> list:
  """The members of a public class the table records: a Flax module's `__call__` and
  `init_state`; another class's own class and static methods, and its own public methods
  unless it is a dataclass (whose methods are its fields' helpers)."""
  if issubclass(cls, nn.Module):
    return [name for name in ('__call__', 'init_state') if hasattr(cls, name)]
  found = []
  for name, member in vars(cls).items():
    if name.startswith('_'):
      continue
    if isinstance(member, (classmethod, staticmethod)) or (
        inspect.isfunction(member) and not dataclasses.is_dataclass(cls)):
      found.append(name)
  return sorted(found)


def public_entries() -> dict:
  """Dotted name -> `describe` of every public name and entry point, as the code stands."""
  entries = {}
  for name in longformer_jax.__all__:
    obj = getattr(longformer_jax, name)
    entries[name] = describe(obj)
    members = (MODULE_ENTRY_POINTS.get(name, ()) if inspect.ismodule(obj)
               else class_entry_points(obj) if inspect.isclass(obj) else ())
    for member in members:
      entries[f'{name}.{member}'] = describe(getattr(obj, member))
      if inspect.ismodule(obj) and inspect.isclass(getattr(obj, member)):
        for method in class_entry_points(getattr(obj, member)):
          entries[f'{name}.{member}.{method}'] = describe(getattr(getattr(obj, member), method))
  return entries


def resolve(dotted: str):
  """The object a table name names, from `longformer_jax`; raises if it is gone."""
  obj = longformer_jax
  for part in dotted.split('.'):
    obj = getattr(obj, part)
  return obj


def changes(table: dict) -> list:
  """One line (or three) per difference between the committed `table` and the code."""
  found = []
  for dotted, was in sorted(table.items()):
    try:
      now = describe(resolve(dotted))
    except (AttributeError, ImportError) as error:
      found.append(f'{dotted}: gone from the public API ({type(error).__name__}: {error}); '
                   f'it was {was}')
      continue
    if now != was:
      found.append(f'{dotted}: signature changed\n    was {was}\n    now {now}')
  for dotted, now in sorted(public_entries().items()):
    if dotted not in table:
      found.append(f'{dotted}: public but not in tests/public_api.json ({now})')
  return found


def read_table() -> dict:
  return json.loads(TABLE.read_text())


def test_the_public_api_matches_its_table():
  found = changes(read_table())
  assert not found, ('the public API changed (longformer_jax/__init__.py); if on purpose, '
                     'rewrite the table with `python -m tests.test_public_api --write` and '
                     'say so in docs/design.md:\n' + '\n'.join(found))


def test_the_table_holds_every_variant_and_each_group():
  # Every registered variant and its section, the shared settings and context, the model
  # builders, the Hugging Face import and export, the memory policies, generation, the
  # passkey grid and the memory sweep (docs/design.md, "Public API").
  table = read_table()
  for cls in ATTENTION_VARIANTS.values():
    assert cls.__name__ in table and f'{cls.__name__}.init_state' in table, cls.__name__
    section = getattr(cls, 'Config', None)
    assert section is None or section.__name__ in table, section
  for name in ('SharedSettings', 'AttentionContext', 'lm_model_config', 'encoder_model_config',
               'DecoderLM', 'hf.load_model', 'hf.convert_to_workdir', 'hf.export',
               'EvictionPolicy', 'make_policy', 'generate_text', 'ChunkWindowDecoder',
               'passkey_grid.evaluate_grid', 'memory_sweep.run_sweep'):
    assert name in table, name
  assert set(MODULE_ENTRY_POINTS) == {name for name in longformer_jax.__all__
                                      if inspect.ismodule(getattr(longformer_jax, name))}


def test_public_names_are_re_exports_not_copies():
  # A public class or function is the object its own module defines, so a name that moves
  # keeps working through longformer_jax without a second definition.
  for name in longformer_jax.__all__:
    obj = getattr(longformer_jax, name)
    if inspect.ismodule(obj):
      assert obj.__name__.startswith('longformer_jax.'), name
      continue
    home = sys.modules[obj.__module__]
    assert obj.__module__.startswith('longformer_jax.'), f'{name} is defined in {obj.__module__}'
    assert getattr(home, obj.__qualname__) is obj, f'{name} is not {obj.__module__}.{name}'


def test_importing_the_package_imports_nothing_else():
  # `import longformer_jax` runs before every `import longformer_jax.<module>`: the public
  # names load on first use, so it pulls in no JAX and no submodule.
  code = ('import sys, longformer_jax\n'
          'print(sorted(m for m in sys.modules\n'
          '             if m == "jax" or m.startswith("longformer_jax.")))')
  out = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True,
                       check=True, cwd=ROOT).stdout.strip()
  assert out == '[]', f'import longformer_jax also imported {out}'


def root_imports(path: pathlib.Path) -> list:
  """`line: names` of each `from longformer_jax import NAME` in `path` where NAME is a public
  name rather than a submodule."""
  found = []
  for node in ast.walk(ast.parse(path.read_text(), str(path))):
    if isinstance(node, ast.ImportFrom) and node.module == 'longformer_jax' and not node.level:
      names = [alias.name for alias in node.names if alias.name in longformer_jax.__all__]
      if names:
        found.append(f'{node.lineno}: {", ".join(names)}')
  return found


def test_no_package_module_imports_the_public_api():
  # The package's modules import from the module that defines a name: longformer_jax's
  # names are for users, and its __init__ stands above every floor.
  bad = [f'{path.relative_to(ROOT)}:{line}'
         for path in sorted((ROOT / 'longformer_jax').rglob('*.py'))
         for line in root_imports(path)]
  assert not bad, 'package modules importing from longformer_jax itself:\n' + '\n'.join(bad)


def test_the_change_report_names_each_change():
  # On a doctored copy of the code's own entries: a name gone, a changed signature, an entry
  # missing.
  table = public_entries()
  now = table['XLAttention.init_state']
  assert now.startswith('function (config: XLConfig, shared: SharedSettings, batch_size: int')
  table['NoSuchAttention'] = 'class (shared: SharedSettings)'
  table['XLAttention.init_state'] = 'function (config, batch_size)'
  del table['XLConfig']
  found = changes(table)
  assert any(line.startswith('NoSuchAttention: gone from the public API') for line in found)
  assert (f'XLAttention.init_state: signature changed\n    was function (config, batch_size)\n'
          f'    now {now}') in found, found
  assert any(line.startswith('XLConfig: public but not in') for line in found)
  assert len(found) == 3, found


if __name__ == '__main__':
  if sys.argv[1:] != ['--write']:
    sys.exit('usage: python -m tests.test_public_api --write')
  TABLE.write_text(json.dumps(public_entries(), indent=1, sort_keys=True) + '\n')
  print(f'wrote {TABLE.relative_to(ROOT)} ({len(public_entries())} entries)')
