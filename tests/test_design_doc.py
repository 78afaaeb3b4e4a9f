"""docs/design.md's layout tree names every module of `longformer_jax/`, and nothing else
(`longformer_jax/__init__.py`, the public API, included; the subpackages' `__init__.py` not).

The tree is the fenced block under "## Layout". A line whose first word ends
in `/` opens a folder; a module is a line whose first word ends in `.py`,
indented two spaces deeper than its folder, followed by a one-line purpose.
Deeper-indented lines continue the description above them.
"""

import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parents[1]
DESIGN = ROOT / 'docs' / 'design.md'
PACKAGE = 'longformer_jax'


def layout_block(text: str) -> str:
  """The first fenced block after the '## Layout' heading."""
  section = text.split('\n## Layout\n', 1)
  assert len(section) == 2, 'docs/design.md has no "## Layout" section'
  match = re.search(r'^```\n(.*?)^```$', section[1], re.S | re.M)
  assert match, 'the Layout section has no fenced tree'
  return match.group(1)


def tree_modules(block: str) -> dict:
  """Module path (e.g. 'longformer_jax/attention/core/masking.py') -> its description."""
  modules = {}
  folders = []                                   # (indent, name) of the open folders
  for line in block.splitlines():
    if not line.strip():
      continue
    indent = len(line) - len(line.lstrip(' '))
    first, _, rest = line.strip().partition(' ')
    folders = [(i, name) for i, name in folders if i < indent]      # folders this line closes
    if first.endswith('/'):
      folders.append((indent, first))
    elif first.endswith('.py') and folders and indent == folders[-1][0] + 2:
      path = ''.join(name for _, name in folders) + first
      assert path not in modules, f'docs/design.md names {path} twice'
      modules[path] = rest.strip()
  return {path: purpose for path, purpose in modules.items() if path.startswith(PACKAGE + '/')}


def package_modules() -> set:
  """Every module of the package; of the `__init__.py` files (one-line docstrings) only the
  package's own, which holds the public API."""
  return {str(p.relative_to(ROOT)) for p in (ROOT / PACKAGE).rglob('*.py')
          if p.name != '__init__.py' or p.parent == ROOT / PACKAGE}


def test_tree_parser_reads_folders_modules_and_continuations():
  block = ('longformer_jax/\n'
           '  top.py           a top-level module\n'
           '  attention/       one file per variant:\n'
           '                   a continuation naming stray.py\n'
           '    xl.py          Transformer-XL\n'
           '    core/\n'
           '      masking.py   masks\n'
           '    lsh.py         Reformer\n'
           '  memory/\n'
           '    fifo.py        the cache\n'
           '  cpu_malloc.py    after a folder\n'
           'tests/             not the package\n'
           '  test_x.py        ignored\n')
  assert tree_modules(block) == {
      'longformer_jax/top.py': 'a top-level module',
      'longformer_jax/attention/xl.py': 'Transformer-XL',
      'longformer_jax/attention/core/masking.py': 'masks',
      'longformer_jax/attention/lsh.py': 'Reformer',
      'longformer_jax/memory/fifo.py': 'the cache',
      'longformer_jax/cpu_malloc.py': 'after a folder',
  }


def test_design_tree_lists_every_module_and_only_existing_ones():
  named = tree_modules(layout_block(DESIGN.read_text()))
  actual = package_modules()
  missing = sorted(actual - set(named))
  stale = sorted(set(named) - actual)
  assert not missing, f'modules missing from the tree in docs/design.md: {missing}'
  assert not stale, f'docs/design.md names modules that do not exist: {stale}'


def test_every_module_in_the_tree_has_a_purpose():
  named = tree_modules(layout_block(DESIGN.read_text()))
  bare = [path for path, purpose in named.items() if not purpose]
  assert not bare, f'modules without a purpose in the tree of docs/design.md: {bare}'
