"""ListOps (Nangia & Bowman, 2018) as the Long Range Arena generates it (Tay et al., 2020, sec. 3.1).

A ListOps example is a tree of operators over the digits 0-9, written in prefix
form; its label (10 classes) is the tree's value:

  [MAX 4 3 [MIN 2 3 ] 1 0 [MED 1 5 8 9 2 ] ]      -> 5

  MIN, MAX   the smallest / largest argument
  MED        the median, floored: with an even count, floor of the mean of the two middle values
  SM         the sum modulo 10

LRA's generator, which this one follows: a node at depth d < `max_depth` (the
root has depth 1) is an operator with probability `operator_probability`
(0.25; a digit with 0.75), else a digit; an operator takes 2..`max_args` (10)
arguments drawn uniformly; nodes at depth `max_depth` (10) are digits, so
operators nest at most 9 deep. The length counts every digit, operator and
`]` as one token (LRA's parentheses are not written), and a tree is kept only
when its length is strictly between `min_length` and `max_length` (500 and
2,000); otherwise it is drawn again. 96,000 / 2,000 / 2,000 examples.

Deterministic by seed, and independent of the model's seed: example i of a
split is drawn by its own `random.Random` seeded with `(seed, split, i)`, so
the first N examples are the same whatever count is asked, and every model
seed trains and is tested on the same data. The vocabulary is fixed in code
(data/lra/listops_tokenizer.py), not built from a set at run time as LRA's was.
"""

import dataclasses
import random

from longformer_jax.config.section import Section

OPERATORS = ('[MIN', '[MAX', '[MED', '[SM')
CLOSE = ']'
DIGITS = tuple(str(digit) for digit in range(10))
SPLITS = ('train', 'valid', 'test')
NUM_CLASSES = 10


@dataclasses.dataclass(frozen=True)
class ListOpsConfig(Section):
  """`data.listops`: the generator's shapes and the split sizes (LRA's values by default)."""
  min_length: int = 500              # a tree is kept if min_length < tokens < max_length
  max_length: int = 2000
  max_depth: int = 10                # nodes at this depth are digits (the root has depth 1)
  max_args: int = 10                 # an operator takes 2..max_args arguments
  operator_probability: float = 0.25   # a node above the depth cap is an operator, else a digit
  train_examples: int = 96_000
  valid_examples: int = 2_000
  test_examples: int = 2_000
  seed: int = 0                      # the data's own seed (model seeds share the data)

  def validate(self, env) -> None:
    del env
    self.require(self.max_args >= 2, 'max_args', 'must be >= 2')
    self.require(self.max_depth >= 2, 'max_depth', 'must be >= 2 (depth 1 is the root)')
    self.require(0.0 < self.operator_probability < 1.0, 'operator_probability',
                 'must be in (0, 1)')
    self.require(self.min_length >= 2, 'min_length', 'must be >= 2 (an operator, a digit, `]`)')
    self.require(self.max_length > self.min_length + 1, 'max_length',
                 f'must leave a length strictly between min_length ({self.min_length}) and it')
    longest = longest_tree(self.max_depth, self.max_args)
    self.require(self.min_length + 1 < longest, 'min_length',
                 f'leaves no tree: the longest tree of max_depth {self.max_depth} and max_args '
                 f'{self.max_args} has {longest} tokens')
    for name in ('train_examples', 'valid_examples', 'test_examples'):
      self.require(getattr(self, name) >= 0, name, 'must be >= 0')

  def split_size(self, split: str) -> int:
    return getattr(self, f'{split}_examples')


@dataclasses.dataclass(frozen=True)
class ListOpsExample:
  symbols: tuple[str, ...]           # the tree in prefix form, e.g. ('[SM', '3', '9', ']')
  label: int                         # its value, 0-9

  @property
  def text(self) -> str:
    """The tree as one line, symbols separated by spaces (LRA's format without parentheses)."""
    return ' '.join(self.symbols)


def longest_tree(max_depth: int, max_args: int) -> int:
  """Tokens of the largest tree the depth and argument caps allow."""
  length = 1                                     # a digit at the depth cap
  for _ in range(max_depth - 1):
    length = 2 + max_args * length               # operator, arguments, `]`
  return length


def apply_operator(operator: str, values: list[int]) -> int:
  """The value of `operator` over its arguments' `values`."""
  if operator == '[MIN':
    return min(values)
  if operator == '[MAX':
    return max(values)
  if operator == '[MED':
    ordered = sorted(values)
    middle = len(ordered) // 2
    if len(ordered) % 2:
      return ordered[middle]
    return (ordered[middle - 1] + ordered[middle]) // 2
  if operator == '[SM':
    return sum(values) % 10
  raise ValueError(f'unknown ListOps operator {operator!r}')


def draw_tree(rng: random.Random, config: ListOpsConfig) -> ListOpsExample | None:
  """One tree drawn by LRA's rules, or None if it leaves the length bounds.

  Drawn depth first with an explicit stack (no recursion limit), stopping as soon
  as the tree cannot fit under `max_length`.
  """
  symbols = []
  # Each open operator: [name, values so far, arguments still to draw, its depth].
  open_operators = []
  depth = 1
  while True:
    if depth < config.max_depth and rng.random() < config.operator_probability:
      operator = rng.choice(OPERATORS)
      symbols.append(operator)
      open_operators.append([operator, [], rng.randint(2, config.max_args), depth])
      depth += 1
      if len(symbols) + len(open_operators) >= config.max_length:
        return None
      continue
    value = rng.randrange(10)
    symbols.append(DIGITS[value])
    # Close every operator whose arguments are complete, passing its value up.
    while open_operators:
      frame = open_operators[-1]
      frame[1].append(value)
      if len(frame[1]) < frame[2]:
        break
      open_operators.pop()
      symbols.append(CLOSE)
      value = apply_operator(frame[0], frame[1])
    if len(symbols) + len(open_operators) >= config.max_length:
      return None
    if not open_operators:
      if config.min_length < len(symbols) < config.max_length:
        return ListOpsExample(tuple(symbols), value)
      return None
    depth = open_operators[-1][3] + 1


def example(config: ListOpsConfig, split: str, index: int) -> ListOpsExample:
  """Example `index` of `split`: trees drawn until one fits the length bounds."""
  if split not in SPLITS:
    raise ValueError(f'unknown ListOps split {split!r}; expected one of {SPLITS}')
  rng = random.Random(f'listops/{config.seed}/{split}/{index}')
  while True:
    tree = draw_tree(rng, config)
    if tree is not None:
      return tree


def listops_split(config: ListOpsConfig, split: str, count: int | None = None) -> list:
  """The first `count` (default: the split's size) examples of `split`."""
  count = config.split_size(split) if count is None else count
  return [example(config, split, index) for index in range(count)]
