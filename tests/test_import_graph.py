"""The package's import graph keeps the layering of docs/design.md ("Layout").

Every module under `longformer_jax/` is parsed with `ast` (nothing is
imported), and every import of a `longformer_jax` module is an edge, wherever
it stands (a function-level import is still a dependency). Checked:

- no import cycles between modules;
- the floors: each folder (and each top-level module) has a place in `FLOORS`,
  lowest first, and imports only from its own floor and those below. An
  upward import fails with its module and target, except the edges listed in
  `PENDING_UPWARD` (each with what removes it), and a listed edge that no
  longer exists fails too, so the list only shrinks;
- no module cites a file that does not ship with the package ("DESIGN.md",
  "NOTES.md", "../shared"): code points to docs/.
"""

import ast
import pathlib

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


def imports_of(module: str, path: pathlib.Path, modules: dict) -> set:
  """The package modules `module` imports (absolute and relative, any depth in the file)."""
  is_package = path.name == '__init__.py'
  found = set()
  for node in ast.walk(ast.parse(path.read_text(), str(path))):
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
  assert cycle is None, 'import cycle: ' + ' -> '.join(cycle)


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
