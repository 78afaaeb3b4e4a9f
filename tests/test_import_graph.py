"""The package's import graph keeps the layering of docs/design.md ("Layout").

Every module under `longformer_jax/` is parsed with `ast` (nothing is
imported), and every import of a `longformer_jax` module is an edge, wherever
it stands: a function-level import is still a dependency, and so is a type-only
one (in the body of `if TYPE_CHECKING:`), which never runs but is an arrow all the
same for a reader and for any tool that draws the imports. Checked:

- no import cycles between modules, type-only imports included;
- nothing under attention/, memory/ or layers/ names models/, not even for an annotation
  (a variant's `init_state` takes its section and the `SharedSettings`);
- the floors: each folder (and each top-level module) has a place in `FLOORS`,
  lowest first, and imports only from its own floor and those below. An
  upward import fails with its module and target, except the edges listed in
  `PENDING_UPWARD` (each with what removes it), and a listed edge that no
  longer exists fails too, so the list only shrinks;
- no module cites a file that does not ship with the package ("DESIGN.md",
  "NOTES.md", "../shared"): code points to docs/;
- every import inside a function, in the package and the root scripts, says
  why it is not at the top: `# deferred: <what, why>` on its line or in the
  comment lines right above it (docs/design.md, "Layout");
- no package module imports a root script (train.py, eval.py, ...), the floor
  above `convert/`, except the edges in `SCRIPT_IMPORTS` (which only shrinks).

A type-only import (the body of `if TYPE_CHECKING:` or `if typing.TYPE_CHECKING:`)
needs no `# deferred:` reason inside a function, since it never runs; it is an edge
like any other (the model floor's modules import `ResolvedModel` so, from
models/resolved_model_type.py, which imports none of them).
"""

import ast
import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
PACKAGE = 'longformer_jax'

# Lowest first. A folder of the package (or a top-level module) imports only from its own
# floor and the floors below it.
FLOORS = (
    ('config', 'cpu_malloc'),   # config sections, errors, old-layout migration
    ('storage',),               # local and gs:// paths
    ('parallel',),              # mesh, sharding rules, remat, processes
    ('layers',),                # embeddings, norms, feed-forward, positions
    ('memory',),                # the memories the variants keep
    ('attention',),             # the variants and what several share
    ('models',),                # blocks, stacks, whole models and their configs
    ('data',),                  # corpora, tokenizers, batches
    ('checkpoint',),            # orbax checkpoints and resume checks
    ('train',),                 # the loop, steps, optimizer, metrics
    ('evaluation',),            # evaluators, reports, passkey and memory sweeps
    ('tasks',),                 # one object per task: its checks, data, model, sums, reports
    ('experiment_config',),     # the whole config: every section above, checked together
    ('command_line', 'generation'),
    ('convert',),               # importers and exporters (CLIs over everything)
)
# Upward edges not yet removed, each with what removes it (none left: the task package of
# issue 30, item 2, took the tasks' evaluation and initialisation out of train/).
PENDING_UPWARD = {}
STALE_REFERENCES = ('DESIGN.md', 'NOTES.md', '../shared')
# The one reason a function may import: `# deferred: <what is imported, why not at the top>`.
DEFERRED = re.compile(r'#\s*deferred:\s*\S')
# Package imports of a root script (the top floor), each with what removes it.
SCRIPT_IMPORTS = {}   # none left: a run is read through evaluation/run_restore.py
# The floors below the models: they take what a layer needs (its section, the shared
# settings, shapes), never the model config, and name nothing of models/.
BELOW_THE_MODELS = ('layers', 'memory', 'attention')


def module_files() -> dict:
  """Dotted module name -> path, for every .py file of the package."""
  files = {}
  for path in sorted((ROOT / PACKAGE).rglob('*.py')):
    parts = list(path.relative_to(ROOT).with_suffix('').parts)
    if parts[-1] == '__init__':
      parts = parts[:-1]
    files['.'.join(parts)] = path
  return files


def resolve(name: str, modules: dict):
  """The package module a dotted import names (a submodule, else its package), or None."""
  while name:
    if name in modules:
      return name
    name = name.rpartition('.')[0]
  return None


def is_type_checking(test: ast.AST) -> bool:
  """`TYPE_CHECKING` or `typing.TYPE_CHECKING`, alone (the condition of a type-only block)."""
  return ((isinstance(test, ast.Name) and test.id == 'TYPE_CHECKING')
          or (isinstance(test, ast.Attribute) and test.attr == 'TYPE_CHECKING'
              and isinstance(test.value, ast.Name) and test.value.id == 'typing'))


def type_only_imports(tree: ast.AST) -> set:
  """The import nodes in the body (not the `else:`) of an `if TYPE_CHECKING:`: never run."""
  return {node for block in ast.walk(tree)
          if isinstance(block, ast.If) and is_type_checking(block.test)
          for statement in block.body for node in ast.walk(statement)
          if isinstance(node, (ast.Import, ast.ImportFrom))}


def imports_of(module: str, path: pathlib.Path, modules: dict) -> set:
  """The package modules `module` imports (absolute and relative, any depth in the file,
  type-only imports included)."""
  is_package = path.name == '__init__.py'
  found = set()
  tree = ast.parse(path.read_text(), str(path))
  for node in ast.walk(tree):
    names = []
    if isinstance(node, ast.Import):
      names = [alias.name for alias in node.names]
    elif isinstance(node, ast.ImportFrom):
      base = node.module or ''
      if node.level:
        anchor = module.split('.')
        anchor = anchor if is_package else anchor[:-1]
        anchor = anchor[:len(anchor) - (node.level - 1)]
        base = '.'.join(anchor + ([base] if base else []))
      # `from pkg import sub` imports pkg.sub when it is a module, else a name of pkg.
      names = [f'{base}.{alias.name}' for alias in node.names] + [base]
    for name in names:
      if name == PACKAGE or name.startswith(PACKAGE + '.'):
        target = resolve(name, modules)
        if target and target != module:
          found.add(target)
  return found


def import_graph() -> dict:
  modules = module_files()
  return {name: imports_of(name, path, modules) for name, path in modules.items()}


def find_cycle(graph: dict):
  """One import cycle as a list of modules, or None (iterative depth-first search)."""
  state = {}                                     # absent: new, 1: on the stack, 2: done
  for start in sorted(graph):
    if start in state:
      continue
    stack = [(start, iter(sorted(graph[start])))]
    path = [start]
    state[start] = 1
    while stack:
      node, children = stack[-1]
      child = next(children, None)
      if child is None:
        state[node] = 2
        stack.pop()
        path.pop()
      elif state.get(child) == 1:
        return path[path.index(child):] + [child]
      elif child not in state:
        state[child] = 1
        stack.append((child, iter(sorted(graph[child]))))
        path.append(child)
  return None


@pytest.fixture(scope='module')
def graph():
  return import_graph()


def test_the_graph_sees_the_package(graph):
  # The parse finds the registries' imports (so an empty graph cannot pass).
  assert f'{PACKAGE}.attention.xl' in graph[f'{PACKAGE}.attention.registry']
  assert f'{PACKAGE}.models.stack_registry' in graph[f'{PACKAGE}.models.decoder_lm']
  assert len(graph) > 50


def test_no_import_cycles(graph):
  cycle = find_cycle(graph)
  assert cycle is None, 'import cycle (type-only imports are edges too): ' + ' -> '.join(cycle)


def test_nothing_below_the_models_names_them(graph):
  strip = len(PACKAGE) + 1
  found = sorted(f'{module[strip:]} imports {target[strip:]}'
                 for module, targets in graph.items() if module != PACKAGE
                 and module.split('.')[1] in BELOW_THE_MODELS
                 for target in targets if target.split('.')[1:2] == ['models'])
  assert not found, ('modules below the models that import models/ (type-only imports '
                     'included; give the layer its section and SharedSettings instead):\n'
                     + '\n'.join(found))


def floor_of(module: str) -> int:
  """The index in FLOORS of a package module's folder or top-level module."""
  part = module.split('.')[1] if module != PACKAGE else ''
  for index, names in enumerate(FLOORS):
    if part in names:
      return index
  raise AssertionError(f'{module}: its folder {part!r} has no floor in FLOORS')


def upward_edges(graph: dict) -> set:
  """`(module, target)` of every import from a floor to a higher one, without the package
  prefix; a module's import of the package root (`longformer_jax`) is not one."""
  strip = len(PACKAGE) + 1
  return {(module[strip:], target[strip:])
          for module, targets in graph.items() for target in targets
          if target != PACKAGE and floor_of(target) > floor_of(module)}


def test_every_folder_has_a_floor(graph):
  for module in graph:
    if module != PACKAGE:
      floor_of(module)


def test_no_folder_imports_a_floor_above_it(graph):
  new = sorted(upward_edges(graph) - set(PENDING_UPWARD))
  assert not new, 'imports from a higher floor (tests/test_import_graph.py FLOORS):\n' + \
      '\n'.join(f'{module} imports {target}' for module, target in new)


def test_pending_upward_edges_still_exist(graph):
  gone = sorted(set(PENDING_UPWARD) - upward_edges(graph))
  assert not gone, 'no longer upward, delete from PENDING_UPWARD: ' + repr(gone)


def test_no_module_cites_files_outside_the_repository():
  bad = [f'{path.relative_to(ROOT)}:{number}: {line.strip()}'
         for path in module_files().values()
         for number, line in enumerate(path.read_text().splitlines(), 1)
         if any(reference in line for reference in STALE_REFERENCES)]
  assert not bad, 'stale references (cite docs/ instead):\n' + '\n'.join(bad)


def script_files() -> list:
  """The root scripts: train.py, eval.py, generate.py, memory_check.py, ..."""
  return sorted(ROOT.glob('*.py'))


def unexplained_function_imports(path: pathlib.Path, root: pathlib.Path = ROOT) -> list:
  """`path:line: import` (relative to `root`) of each import inside a function of `path`
  without a `# deferred:` reason on its line or in the comment lines directly above it."""
  text = path.read_text()
  lines = text.splitlines()
  found = set()
  tree = ast.parse(text, str(path))
  type_only = type_only_imports(tree)
  for function in ast.walk(tree):
    if not isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
      continue
    for node in ast.walk(function):
      if not isinstance(node, (ast.Import, ast.ImportFrom)) or node in type_only:
        continue
      said = [lines[node.lineno - 1]]
      above = node.lineno - 2
      while above >= 0 and lines[above].lstrip().startswith('#'):
        said.append(lines[above])
        above -= 1
      if not any(DEFERRED.search(line) for line in said):
        found.add((node.lineno, ast.unparse(node)))
  return [f'{path.relative_to(root)}:{line}: {source}' for line, source in sorted(found)]


def test_the_function_import_scan_sees_them(tmp_path):
  # Checked on examples: an unmarked import inside a function is found (also nested, and
  # one after a marked import), a marked one on its line or above it is not, a top-level
  # one is not looked at.
  path = tmp_path / 'example.py'
  path.write_text(
      'import os\n'
      'def f():\n'
      '  import json  # deferred: an example\n'
      '  # deferred: an example, said above\n'
      '  # over two lines\n'
      '  from typing import Any\n'
      '  import re\n'
      '  def g():\n'
      '    import abc  # pylint: disable=g-import-not-at-top\n'
      '  # deferred is not the marker without its colon\n'
      '  import csv\n')
  assert unexplained_function_imports(path, tmp_path) == [
      'example.py:7: import re', 'example.py:9: import abc', 'example.py:11: import csv']


def test_type_checking_imports_are_edges(tmp_path):
  # Checked on an example of the attention floor: the body of `if TYPE_CHECKING:` (or
  # `typing.TYPE_CHECKING`) is an edge like any import (here to a higher floor, which
  # test_no_folder_imports_a_floor_above_it and test_nothing_below_the_models_names_them
  # then refuse), as are its `else:` branch and any other condition; inside a function it
  # needs no `# deferred:` reason, since it never runs.
  path = tmp_path / 'example.py'
  path.write_text(
      'import typing\n'
      'from typing import TYPE_CHECKING\n'
      'from longformer_jax.config import errors\n'
      'if TYPE_CHECKING:\n'
      '  from longformer_jax.models.resolved_model import ResolvedModel\n'
      'if typing.TYPE_CHECKING:\n'
      '  from longformer_jax.models import decoder_lm\n'
      'if TYPE_CHECKING:\n'
      '  pass\n'
      'else:\n'
      '  from longformer_jax.models import encoder\n'
      'if TYPE_CHECKING or errors:\n'
      '  from longformer_jax.models import hibert\n'
      'def f():\n'
      '  if TYPE_CHECKING:\n'
      '    from longformer_jax.train import train_config\n')
  modules = module_files()
  module = f'{PACKAGE}.attention.example'
  # (`from pkg import sub` is an edge to pkg too.)
  edges = imports_of(module, path, modules)
  assert edges == {
      f'{PACKAGE}.config', f'{PACKAGE}.config.errors', f'{PACKAGE}.models',
      f'{PACKAGE}.models.resolved_model', f'{PACKAGE}.models.decoder_lm',
      f'{PACKAGE}.models.encoder', f'{PACKAGE}.models.hibert', f'{PACKAGE}.train',
      f'{PACKAGE}.train.train_config'}
  assert ('attention.example', 'models.resolved_model') in upward_edges({module: edges})
  assert unexplained_function_imports(path, tmp_path) == []


def test_every_function_import_says_why():
  files = list(module_files().values()) + script_files()
  assert len(files) > 50 and ROOT / 'train.py' in files
  bad = [found for path in files for found in unexplained_function_imports(path)]
  assert not bad, ('imports inside functions without a reason: move each to the top of its '
                   'module, or say why it waits with "# deferred: <what, why>" on its line '
                   '(docs/design.md, "Layout"):\n' + '\n'.join(bad))


def script_imports() -> set:
  """`(module, script)` of every package import of a root script (any depth in the file)."""
  scripts = {path.stem for path in script_files()}
  strip = len(PACKAGE) + 1
  found = set()
  for module, path in module_files().items():
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
      names = ([alias.name for alias in node.names] if isinstance(node, ast.Import) else
               [node.module or ''] if isinstance(node, ast.ImportFrom) and not node.level else [])
      found |= {(module[strip:], name.split('.')[0]) for name in names
                if name.split('.')[0] in scripts}
  return found


def test_no_package_module_imports_a_root_script():
  found = script_imports()
  new = sorted(found - set(SCRIPT_IMPORTS))
  assert not new, 'package modules importing a root script (the floor above convert/):\n' + \
      '\n'.join(f'{module} imports {script}.py' for module, script in new)
  gone = sorted(set(SCRIPT_IMPORTS) - found)
  assert not gone, 'no longer imported, delete from SCRIPT_IMPORTS: ' + repr(gone)
