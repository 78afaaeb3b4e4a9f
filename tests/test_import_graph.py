"""The package's import graph keeps the layering of docs/design.md ("Layout").

Every module under `longformer_jax/` is parsed with `ast` (nothing is
imported), and every import of a `longformer_jax` module is an edge, wherever
it stands (a function-level import is still a dependency). Checked:

- no import cycles between modules;
- `memory/` and `layers/` import nothing from attention, models, train or
  evaluation (they are the building blocks the variants share);
- `attention/` imports nothing from models, train or evaluation (a variant
  keeps the call contract on its own, contract 1);
- `data/` imports nothing from models, attention, train or evaluation;
- `parallel/` (mesh, sharding, settings) imports nothing from the layers,
  memory, attention, models, data, train, evaluation, generation or convert:
  the split attention kernels live in attention/sequence_parallel/
  (EXEMPT names the one module still waiting to move out);
- no module cites a file that does not ship with the package ("DESIGN.md",
  "NOTES.md", "../shared"): code points to docs/.
"""

import ast
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
PACKAGE = 'longformer_jax'

FORBIDDEN = {
    'memory': ('attention', 'models', 'train', 'evaluation'),
    'layers': ('attention', 'models', 'train', 'evaluation'),
    'attention': ('models', 'train', 'evaluation'),
    'data': ('models', 'attention', 'train', 'evaluation'),
    'parallel': ('layers', 'memory', 'attention', 'models', 'data', 'train', 'evaluation',
                 'generation', 'convert'),
}
# Modules a layer rule skips, with the reason.
EXEMPT = {
    'longformer_jax.parallel.memory_check',   # moves to a script (it builds a whole train step)
}
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


@pytest.mark.parametrize('layer', sorted(FORBIDDEN))
def test_layer_imports_nothing_from_above(graph, layer):
  prefix = f'{PACKAGE}.{layer}'
  banned = tuple(f'{PACKAGE}.{other}' for other in FORBIDDEN[layer])
  bad = sorted(f'{module} imports {target}'
               for module, targets in graph.items()
               if (module == prefix or module.startswith(prefix + '.')) and module not in EXEMPT
               for target in targets
               if any(target == b or target.startswith(b + '.') for b in banned))
  assert not bad, f'{layer}/ must not import from {FORBIDDEN[layer]}:\n' + '\n'.join(bad)


def test_no_module_cites_files_outside_the_repository():
  bad = [f'{path.relative_to(ROOT)}:{number}: {line.strip()}'
         for path in module_files().values()
         for number, line in enumerate(path.read_text().splitlines(), 1)
         if any(reference in line for reference in STALE_REFERENCES)]
  assert not bad, 'stale references (cite docs/ instead):\n' + '\n'.join(bad)
